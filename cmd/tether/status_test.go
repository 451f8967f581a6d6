package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/client"
	"github.com/tether-dev/tether/tunnel/server"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

const adminToken = "admin-token-for-the-status-tests"

// fakeServerAndClient serves a tether server's /api/tunnels and /api/fleet
// (behind adminToken) and a tether client's /status, and returns the admin
// URL and the health HOST:PORT.
func fakeServerAndClient(t *testing.T) (adminURL, healthAddr string) {
	t.Helper()
	list := []server.Info{{Name: "acme-prod", Account: "acme", Runtime: "prod", ClientAddress: "203.0.113.7:51234",
		ConnectedSince: time.Now().Add(-time.Hour), ClientVersion: "tether 1.3.0"}}
	admin := http.NewServeMux()
	admin.HandleFunc("GET /api/tunnels", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+adminToken {
			http.Error(w, "missing or wrong admin token", http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(list)
	})
	admin.HandleFunc("GET /api/fleet", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+adminToken {
			http.Error(w, "missing or wrong admin token", http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(server.Fleet{
			Replica:  "replica-a",
			Registry: registry.Status{Backend: "redis", Target: "redis://redis:6379/0", Up: true, Since: time.Now().Add(-time.Hour)},
			Tunnels: map[string][]registry.Holder{
				"acme-prod": {{Replica: "replica-b", Addr: "10.0.0.2:7800", Epoch: 2}, {Replica: "replica-a", Addr: "10.0.0.1:7800", Epoch: 1}},
				"globex":    {{Replica: "replica-b", Addr: "10.0.0.2:7800", Epoch: 3}},
			},
		})
	})
	health := http.NewServeMux()
	health.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(client.Snapshot{Tunnel: "globex", Server: "tunnels.example.com:7000", Transport: "tcp", State: "ready"})
	})
	a, h := httptest.NewServer(admin), httptest.NewServer(health)
	t.Cleanup(a.Close)
	t.Cleanup(h.Close)
	return a.URL, h.Listener.Addr().String()
}

func TestStatusFlagsAndEnvironment(t *testing.T) {
	adminURL, healthAddr := fakeServerAndClient(t)
	tokenFile := writeFile(t, "admin-token", adminToken+"\n")
	missing := filepath.Join(t.TempDir(), "no-such-token")
	tests := []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stdout string // in stdout
		stderr string // in stderr
	}{
		{name: "neither address", code: exitUsage, stderr: "pass --admin URL (a server's admin address) or --health-addr HOST:PORT (a client's health address)"},
		{name: "server by flags", args: []string{"--admin", adminURL, "--admin-token-file", tokenFile}, stdout: "acme-prod   acme      prod"},
		{name: "server by environment", env: map[string]string{"TETHER_ADMIN": adminURL, "TETHER_ADMIN_TOKEN_FILE": tokenFile}, stdout: "acme-prod   acme      prod"},
		{name: "client by environment", env: map[string]string{"TETHER_HEALTH_ADDR": healthAddr}, stdout: "Tunnel:       globex"},
		{name: "--admin wins over the client's address",
			env: map[string]string{"TETHER_HEALTH_ADDR": healthAddr, "TETHER_ADMIN_TOKEN_FILE": tokenFile}, args: []string{"--admin", adminURL}, stdout: "acme-prod"},
		{name: "json", args: []string{"--health-addr", healthAddr, "-o", "json"}, stdout: `"tunnel": "globex"`},
		{name: "unknown output", args: []string{"--health-addr", healthAddr, "--output", "yaml"}, code: exitUsage, stderr: `--output "yaml"`},
		{name: "names for a client", args: []string{"--health-addr", healthAddr, "globex"}, code: exitUsage, stderr: "--admin URL"},
		{name: "no such tunnel", args: []string{"--admin", adminURL, "--admin-token-file", tokenFile, "initech"}, code: exitFail, stderr: `no connected tunnel matches "initech"`},
		{name: "no token", args: []string{"--admin", adminURL}, code: exitFail, stderr: "pass --admin-token-file"},
		{name: "token file missing", args: []string{"--admin", adminURL, "--admin-token-file", missing}, code: exitUsage, stderr: missing},
		{name: "fleet by flags", args: []string{"--admin", adminURL, "--admin-token-file", tokenFile, "--fleet"},
			stdout: "Replica: replica-a   Registry: redis at redis://redis:6379/0, up for "},
		{name: "fleet sorts each tunnel's replicas", args: []string{"--admin", adminURL, "--admin-token-file", tokenFile, "--fleet", "acme-*"},
			stdout: "\nacme-prod   replica-a,replica-b\n"},
		{name: "fleet by environment", env: map[string]string{"TETHER_ADMIN": adminURL, "TETHER_ADMIN_TOKEN_FILE": tokenFile, "TETHER_FLEET": "true"},
			args: []string{"-o", "wide"}, stdout: "   10.0.0.1:7800,10.0.0.2:7800\n"},
		{name: "fleet json", args: []string{"--admin", adminURL, "--admin-token-file", tokenFile, "--fleet", "-o", "json"}, stdout: `"replica": "replica-a"`},
		{name: "fleet of no such tunnel", args: []string{"--admin", adminURL, "--admin-token-file", tokenFile, "--fleet", "initech"},
			code: exitFail, stderr: `no connected tunnel matches "initech"`},
		{name: "fleet without --admin", env: map[string]string{"TETHER_HEALTH_ADDR": healthAddr}, args: []string{"--fleet"},
			code: exitUsage, stderr: "--fleet reads a server's registry: pass --admin URL"},
		{name: "bad timeout in the environment", env: map[string]string{"TETHER_TIMEOUT": "soon"}, args: []string{"--admin", adminURL}, code: exitUsage, stderr: "TETHER_TIMEOUT"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runTether(t, tc.env, runners{}, append([]string{"status"}, tc.args...)...)
			if code != tc.code || !strings.Contains(stdout, tc.stdout) || !strings.Contains(stderr, tc.stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, %q in stdout and %q in stderr",
					code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
			}
			if strings.Contains(stdout+stderr, adminToken) {
				t.Errorf("the admin token was printed")
			}
		})
	}
}
