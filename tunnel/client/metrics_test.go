package client

import (
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestClientMetrics: the client's /metrics carries tether_build_info and
// the Go and process collectors, as the server's does, so a dashboard can
// show versions, memory and goroutines of both; no label value holds a
// space; and the upstream dial results of each route's adapter exist from
// the start, at 0.
func TestClientMetrics(t *testing.T) {
	c, err := New(Config{Server: "127.0.0.1:1", TokenFile: tokenFile(t)}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	got := testutil.MetricLabels(t, c.metrics)
	want := []string{
		"tether_build_info/", "go_goroutines/", "go_memstats_heap_inuse_bytes/", "process_resident_memory_bytes/", "tether_client_ready/",
		"tether_client_sessions/state=logged_in", "tether_client_upstream_dials_total/result=not_allowed",
	}
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
