package test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestDiagnoseInTheClientsEnvironment: in a client's container, where the
// client's settings are in TETHER_* variables, `tether diagnose` needs no
// arguments, passes every check of a healthy tunnel, tests the public URL
// the server tells it, writes a support bundle without the token, and
// leaves the running client alone.
func TestDiagnoseInTheClientsEnvironment(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	// *.localhost dials loopback, so the server's public URL works here.
	srv := startServer(t, k, serverOpts{args: []string{"--domain", "localhost"}})
	backend := newBackend(t, "acme-root", nil)
	token := k.issue(t, "acme", 2*time.Hour, "--account", "acme-co", "--runtime", "prod")
	tokenFile := writeToken(t, token)
	cl := startClient(t, srv, clientOpts{tokenFile: tokenFile, routes: []string{"/=" + backend.url()}})

	bundle := filepath.Join(t.TempDir(), "support.tar.gz")
	env := []string{
		"TETHER_SERVER=" + srv.tunnelAddr, "TETHER_TOKEN_FILE=" + tokenFile, "TETHER_TLS_CA=" + caFile,
		"TETHER_ROUTE=/=" + backend.url(), "TETHER_HEALTH_ADDR=" + cl.healthAddr,
	}
	code, stdout, stderr := runTether(t, env, "diagnose", "--bundle", bundle)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"PASS tls", "verified for 127.0.0.1",
		"PASS login", `accepts the token for tunnel "acme", account "acme-co", runtime "prod" in `, "a client serves this tunnel",
		"PASS upstream /", "PASS end-to-end", "requests to http://acme.localhost:",
		"server = " + srv.tunnelAddr + " (env TETHER_SERVER)",
		"OK: every check passed.",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}

	f, err := os.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := testutil.UntarGz(t, f)
	for _, name := range []string{"report.json", "report.txt", "version.txt", "config.txt", "status.json", "metrics.txt", "logs.txt"} {
		if files[name] == "" {
			t.Errorf("bundle has no %s (files: %v)", name, keysOf(files))
		}
	}
	if !strings.Contains(files["logs.txt"], "session ready") {
		t.Errorf("bundle logs.txt lacks the client's recent log lines:\n%s", files["logs.txt"])
	}
	sig := token[strings.LastIndex(token, ".")+1:]
	for name, data := range files {
		if strings.Contains(data, sig) {
			t.Errorf("bundle file %s holds the token", name)
		}
	}
	if strings.Contains(stdout+stderr, sig) {
		t.Error("diagnose printed the token")
	}

	st, err := cl.status()
	if err != nil {
		t.Fatal(err)
	}
	if st.Reconnects != 0 || !st.Ready {
		t.Errorf("the running client was disturbed: %+v", st)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+srv.httpAddr+"/", nil)
	req.Host = "acme.localhost"
	if r, err := do(req); err != nil || r.code != http.StatusOK {
		t.Errorf("tunnel after diagnose: %+v, %v", r, err)
	}
	assertNoSecret(t, "the tunnel token", token, srv.proc, cl.proc)
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestDiagnoseDoesNotFailForWhatItCannotSee: run before the client starts (a
// pre-flight check), `tether diagnose` skips the public path and exits 0;
// run where the server's public URL does not resolve (a laptop, a sandbox, a
// cluster without the platform's DNS), it warns and still exits 0, because
// every step of the tunnel passes.
func TestDiagnoseDoesNotFailForWhatItCannotSee(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{args: []string{"--public-url", "http://*.tunnels.invalid:8080"}})
	backend := newBackend(t, "acme-root", nil)
	tokenFile := writeToken(t, k.issue(t, "acme", 2*time.Hour))
	env := []string{
		"TETHER_SERVER=" + srv.tunnelAddr, "TETHER_TOKEN_FILE=" + tokenFile, "TETHER_TLS_CA=" + caFile,
		"TETHER_ROUTE=/=" + backend.url(),
	}

	code, stdout, stderr := runTether(t, env, "diagnose")
	if code != 0 {
		t.Errorf("pre-flight: exit %d, want 0\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"PASS tls", "PASS token", "WARN login", "no client serves this tunnel right now", "PASS upstream /",
		"SKIP end-to-end", "no client serves this tunnel yet", "hint: run tether diagnose again once `tether client` serves the tunnel",
		"OK, with warnings: login.",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("pre-flight output lacks %q:\n%s", want, stdout)
		}
	}

	startClient(t, srv, clientOpts{tokenFile: tokenFile, routes: []string{"/=" + backend.url()}})
	code, stdout, stderr = runTether(t, env, "diagnose", "--requests", "1")
	if code != 0 {
		t.Errorf("with an unresolvable public URL: exit %d, want 0\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"PASS login", "a client serves this tunnel",
		"WARN end-to-end", "GET http://acme.tunnels.invalid:8080", "no such host",
		"cannot be reached from where diagnose runs", "Here acme.tunnels.invalid does not resolve",
		"OK, with warnings: end-to-end.",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	code, stdout, _ = runTether(t, env, "diagnose", "--requests", "1", "--output", "json")
	var report struct {
		OK bool `json:"ok"`
	}
	if err := json.Unmarshal([]byte(stdout), &report); err != nil || code != 0 || !report.OK {
		t.Errorf("--output json: exit %d, ok %v (%v); want exit 0 and ok true\n%s", code, report.OK, err, stdout)
	}
}
