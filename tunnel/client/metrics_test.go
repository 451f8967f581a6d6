package client

import (
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
