package test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// TestDemo: `tether demo` (what `make run` runs) serves its stand-ins
// through a real tunnel, and the diagnose line it prints passes.
func TestDemo(t *testing.T) {
	t.Parallel()
	p := startProc(t, "tether demo", nil, tetherBin, "demo")
	p.waitOutput("the client's path, step by step", startTimeout)
	out := p.Output()

	entry := regexp.MustCompile(`public HTTP entry  (http://127\.0\.0\.1:\d+)`).FindStringSubmatch(out)
	config := regexp.MustCompile(`tether diagnose --config (\S+)`).FindStringSubmatch(out)
	if entry == nil || config == nil {
		t.Fatalf("the demo's guide lacks the entry or the diagnose line:\n%s", out)
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
