package test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// TestDemo: `tether demo` (what `make run` runs) shows a webhook outliving
// an outage of its tunnel, serves its stand-ins through a real tunnel, and
// the diagnose line it prints passes.
func TestDemo(t *testing.T) {
	t.Parallel()
	p := startProc(t, "tether demo", nil, tetherBin, "demo")
	p.waitOutput("the client's path, step by step", startTimeout)
	out := p.Output()

	entry := regexp.MustCompile(`public HTTP entry  (http://127\.0\.0\.1:\d+)`).FindStringSubmatch(out)
	admin := regexp.MustCompile(`server admin       http://(127\.0\.0\.1:\d+)`).FindStringSubmatch(out)
	config := regexp.MustCompile(`tether diagnose --config (\S+)`).FindStringSubmatch(out)
	if entry == nil || admin == nil || config == nil {
		t.Fatalf("the demo's guide lacks the entry, the admin address or the diagnose line:\n%s", out)
	}

	// The webhook POSTed while the client was stopped was stored (202 and
	// its ID), then delivered to the stand-in, unchanged, once the client
	// was back; the server counts it both ways.
	buffered := regexp.MustCompile(`client stopped, POST /webhooks/push \(X-GitHub-Event: push\) +->  202 Accepted, X-Tether-Buffered: (\S+)\n`).FindStringSubmatch(out)
	delivered := regexp.MustCompile(`client started, the Argo Events stand-in received it +->  X-Tether-Delivery: (\S+) \(attempt 1\), signature valid\n`).FindStringSubmatch(out)
	if buffered == nil || delivered == nil || buffered[1] != delivered[1] {
		t.Errorf("the demo does not show its webhook stored, then delivered with the same ID:\n%s", out)
	}
	s := &server{adminAddr: admin[1]}
	for outcome, want := range map[string]float64{"accepted": 1, "delivered": 1} {
		if got := s.metric(t, "tether_buffer_requests_total", "outcome", outcome); got != want {
			t.Errorf("tether_buffer_requests_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}

	for _, path := range []string{"/", "/argo-cd/api/version", "/rollouts/"} {
		req, _ := http.NewRequest(http.MethodGet, entry[1]+path, nil)
		req.Host = "demo.localhost"
		r, err := do(req)
		if err != nil || r.code != http.StatusOK {
			t.Errorf("GET %s through the demo tunnel: %+v, %v", path, r, err)
		}
	}

	code, stdout, stderr := runTether(t, nil, "diagnose", "--config", config[1])
	if code != 0 || !strings.Contains(stdout, "OK: every check passed.") {
		t.Errorf("the demo's diagnose line: exit %d\n%s\n%s", code, stdout, stderr)
	}
}
