package server

import (
	"strings"
	"testing"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/gate"
)

// TestMetricLabels: no label value of the server's metrics holds a space
// (PromQL matchers and dashboards' variables break on them), and every
// counter vector has each of its known label values from the start, at 0,
// so that increase() and rate() alerts see the first event.
func TestMetricLabels(t *testing.T) {
	s := startServer(t)
	s.startClient(t, "alpha", backend(t, "alpha").URL)
	got := testutil.MetricLabels(t, s.metrics.reg)
	want := map[string][]string{
		"tether_logins_rejected_total/reason":             reasons(auth.Reasons()),
		"tether_routes_rejected_total/reason":             reasons(auth.RouteReasons()),
		"tether_streams_refused_total/reason":             gate.StreamRefusals(),
		"tether_connections_refused_total/reason":         append(gate.Refusals(), "http_connections", "http_connections_per_ip", "http_idle_evicted", "http_idle_evicted_per_ip", "peer_connections", "peer_idle_evicted"),
		"tether_sessions_closed_by_limit_total/limit":     gate.Limits(),
		"tether_http_unrouted_requests_total/reason":      unroutedReasons,
		"tether_login_probes_total/result":                {"accepted", "rejected"},
		"tether_peer_forwarded_total/result":              {"ok", "unreachable", "missed"},
		"tether_http_request_duration_seconds/code_class": {"1xx", "2xx", "3xx", "4xx", "5xx", "error"},
		"tether_tunnel_requests_total/code_class":         {"1xx", "2xx", "3xx", "4xx", "5xx", "error"},
		"tether_build_info/":                              nil,
		"go_goroutines/":                                  nil,
		"process_resident_memory_bytes/":                  nil,
	}
	for key, values := range want {
		if len(values) == 0 && !got[key] {
			t.Errorf("%s is not exported", strings.TrimSuffix(key, "/"))
		}
		for _, v := range values {
			if !got[key+"="+v] {
				t.Errorf("%s=%q is not exported before its first event", key, v)
			}
		}
	}
}

func reasons(rs []auth.Reason) []string {
	var out []string
	for _, r := range rs {
		out = append(out, string(r))
	}
	return out
}
