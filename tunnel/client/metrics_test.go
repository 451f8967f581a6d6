package client

import (
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
)

// TestClientExportsBuildAndRuntimeMetrics: the client's /metrics carries
// tether_build_info and the Go and process collectors, as the server's does,
// so a dashboard can show versions, memory and goroutines of both.
func TestClientExportsBuildAndRuntimeMetrics(t *testing.T) {
	c, err := New(Config{Server: "127.0.0.1:1", TokenFile: tokenFile(t)}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	families, err := c.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()] = true
	}
	for _, name := range []string{"tether_build_info", "go_goroutines", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes", "tether_client_ready"} {
		if !got[name] {
			t.Errorf("the client's metrics have no %s", name)
		}
	}
}

// TestClientMetricLabels: no label value of the client's metrics holds a
// space, and the upstream dial results of each route's adapter exist from
// the start, at 0.
func TestClientMetricLabels(t *testing.T) {
	c, err := New(Config{Server: "127.0.0.1:1", TokenFile: tokenFile(t)}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	families, err := c.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.ContainsAny(l.GetValue(), " \t\n") {
					t.Errorf("%s{%s=%q}: a label value with a space", f.GetName(), l.GetName(), l.GetValue())
				}
				got[f.GetName()+"/"+l.GetName()+"="+l.GetValue()] = true
			}
		}
	}
	want := []string{"tether_client_sessions/state=logged_in", "tether_client_upstream_dials_total/result=not_allowed"}
	for _, r := range c.routes {
		for _, result := range dialResults {
			want = append(want, "tether_client_upstream_dials_total/adapter="+r.Adapter, "tether_client_upstream_dials_total/result="+result)
		}
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("the client's metrics have no series with %s", w)
		}
	}
}
