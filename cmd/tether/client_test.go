package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
)

// --renewed-token-file comes from the file, the environment and the command
// line like every flag, reaches the client's configuration, and may not be
// the --token-file, which the client only reads.
func TestClientRenewedTokenFile(t *testing.T) {
	base := []string{"client", "--server", "t.example.com:7000", "--token-file", "/var/run/tether/token/token"}
	cfg := writeFile(t, "client.yaml", "renewed-token-file: /tmp/from-file\n")
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{name: "default", want: ""},
		{name: "file", args: []string{"--config", cfg}, want: "/tmp/from-file"},
		{name: "env over file", env: map[string]string{"TETHER_RENEWED_TOKEN_FILE": "/tmp/from-env"}, args: []string{"--config", cfg}, want: "/tmp/from-env"},
		{name: "flag", env: map[string]string{"TETHER_RENEWED_TOKEN_FILE": "/tmp/from-env"}, args: []string{"--renewed-token-file", "/tmp/renewed-token"}, want: "/tmp/renewed-token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got string
			code, _, stderr := runTether(t, tc.env, runners{client: func(o *ClientOptions) error {
				cfg, err := o.config(&Factory{})
				got = cfg.RenewedTokenFile
				return err
			}}, append(base, tc.args...)...)
			if code != exitOK || got != tc.want {
				t.Errorf("exit %d (%s), renewed-token-file %q; want %q", code, stderr, got, tc.want)
			}
		})
	}
	code, _, stderr := runTether(t, nil, runners{}, append(base, "--renewed-token-file", "/var/run/tether/token/token")...)
	if want := "--renewed-token-file /var/run/tether/token/token is the --token-file"; code != exitUsage || !strings.Contains(stderr, want) {
		t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, exitUsage, want)
	}
}

// The renewal kept in --renewed-token-file is a secret like the token
// file's: a support bundle holds it nowhere, even where the client's
// health address would serve it.
func TestDiagnoseBundleHidesRenewedToken(t *testing.T) {
	const renewal = "renewed.token-kept-by-the-client"
	health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/status":
			_, _ = w.Write([]byte(`{"tunnel":"acme","server":"tunnels.example.invalid:443"}`))
		case "/debug/logs":
			_, _ = fmt.Fprintf(w, "{\"msg\":\"login\",\"token\":%q}\n", renewal)
		default:
			http.NotFound(w, r)
		}
	}))
	defer health.Close()
	_, stdout, _ := runTether(t, nil, runners{}, "diagnose", "--bundle", "-", "--timeout", "1s",
		"--server", testutil.ClosedAddr(t), "--token-file", writeFile(t, "token", "not-a-jwt"),
		"--renewed-token-file", writeFile(t, "renewed-token", renewal+"\n"),
		"--route", "/=http://"+testutil.ClosedAddr(t), "--proxy", "direct", "--health-addr", strings.TrimPrefix(health.URL, "http://"))
	files := testutil.UntarGz(t, strings.NewReader(stdout))
	if !strings.Contains(files["logs.txt"], "[redacted]") {
		t.Errorf("logs.txt = %q, want the renewal replaced", files["logs.txt"])
	}
	for name, data := range files {
		if strings.Contains(data, renewal) {
			t.Errorf("bundle file %s holds the renewed token:\n%s", name, data)
		}
	}
}
