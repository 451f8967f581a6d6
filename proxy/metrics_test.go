package proxy

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/internal/testutil"
)

// sample is one gathered series: a counter's value or a histogram's count.
type sample struct {
	value float64
	count uint64
}

// gather returns the series of the metric name in reg, keyed by their
// labels as name=value, sorted by name and joined with ",".
func gather(t *testing.T, reg prometheus.Gatherer, name string) map[string]sample {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]sample{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var key []byte
			for i, l := range m.GetLabel() {
				if i > 0 {
					key = append(key, ',')
				}
				key = append(key, l.GetName()+"="+l.GetValue()...)
			}
			out[string(key)] = sample{m.GetCounter().GetValue(), m.GetHistogram().GetSampleCount()}
		}
	}
	return out
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	up := echoUpstream(t, "up")
	routes := []Route{
		{Prefix: "/a", Upstream: mustURL(t, up.URL), Adapter: "argo-cd"},
		{Prefix: "/b", Upstream: mustURL(t, "http://"+testutil.ClosedAddr(t))},
	}
	tr := newTestRouter(t, routes, nil, Options{Metrics: reg})
	for _, p := range []string{"/a/1", "/a/2", "/b/1", "/c", "/a/../x"} {
		tr.get(t, p, nil)
	}

	// A second router on the same registry shares the series.
	tr2 := newTestRouter(t, routes, nil, Options{Metrics: reg})
	tr2.get(t, "/a/3", nil)

	// Requests are counted when their handler returns, which may be just
	// after the caller has the whole response: wait for the handlers.
	tr.front.Close()
	tr2.front.Close()

	requests := gather(t, reg, "tether_proxy_requests_total")
	counts := []struct {
		series string
		want   float64
	}{
		{"adapter=argo-cd,class=2xx,route=/a", 3},
		{"adapter=argo-cd,class=5xx,route=/a", 0},
		{"adapter=custom,class=5xx,route=/b", 1},
		{"adapter=,class=4xx,route=", 2}, // no route, and a rejected path
	}
	for _, c := range counts {
		if got := requests[c.series].value; got != c.want {
			t.Errorf("tether_proxy_requests_total{%s} = %v, want %v", c.series, got, c.want)
		}
	}
	// Latency is observed for responses only: /b never answered.
	latency := gather(t, reg, "tether_proxy_upstream_latency_seconds")
	if latency["adapter=argo-cd,route=/a"].count != 3 || latency["adapter=custom,route=/b"].count != 0 || len(latency) != 2 {
		t.Errorf("latency sample counts %v, want /a:3 /b:0 and no other series", latency)
	}
}

func TestMetricsClass(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rm := m.forRoute("/", "app-proxy")
	for _, s := range []int{101, 200, 204, 302, 404, 502, 504, 0} {
		rm.count(s, false)
	}
	rm.count(http.StatusBadGateway, true)
	// 0: nothing written, which net/http answers with 200.
	want := map[string]float64{"1xx": 1, "2xx": 3, "3xx": 1, "4xx": 1, "5xx": 2, "canceled": 1}
	got := gather(t, reg, "tether_proxy_requests_total")
	for class, w := range want {
		if v := got["adapter=app-proxy,class="+class+",route=/"].value; v != w {
			t.Errorf("class %s: %v, want %v", class, v, w)
		}
	}
}
