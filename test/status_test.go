package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestStatus: `tether status` shows a real server's connected tunnels and
// its registry's fleet, through its admin token, and a real client's
// connection, from the addresses the server and the client serve them on.
func TestStatus(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	const adminToken = "status-test-admin-token-0123456789"
	tokenFile := writeFile(t, t.TempDir(), "admin-token", adminToken+"\n")
	const replica = "status-replica"
	srv := startServer(t, k, serverOpts{args: []string{"--admin-token-file", tokenFile, "--replica-id", replica}})
	backend := newBackend(t, "acme-root", nil)
	cl := startClient(t, srv, clientOpts{
		tokenFile: writeToken(t, k.issue(t, "acme-prod", time.Hour, "--account", "acme", "--runtime", "prod")),
		routes:    []string{"/=" + backend.url()},
	})
	startClient(t, srv, clientOpts{
		tokenFile: writeToken(t, k.issue(t, "globex", time.Hour, "--account", "globex-inc", "--runtime", "staging")),
		routes:    []string{"/=" + backend.url()},
	})
	admin := "http://" + srv.adminAddr

	t.Run("server table", func(t *testing.T) {
		var rows [][]string
		testutil.WaitFor(t, readyTimeout, func() error {
			code, stdout, stderr := runTether(t, nil, "status", "--admin", admin, "--admin-token-file", tokenFile)
			if code != 0 {
				return fmt.Errorf("tether status: exit %d: %s", code, stderr)
			}
			rows = nil
			for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
				rows = append(rows, strings.Fields(line))
			}
			// A row per session: each client keeps two.
			if len(rows) != 5 {
				return fmt.Errorf("tether status printed %d lines, want a header and 2 sessions of 2 tunnels:\n%s", len(rows), stdout)
			}
			return nil
		})
		if got := strings.Join(rows[0], " "); got != "NAME ACCOUNT RUNTIME CLIENT CONNECTED VERSION IN OUT" {
			t.Errorf("header %q", got)
		}
		for i, want := range [][]string{{"acme-prod", "acme", "prod"}, {"acme-prod", "acme", "prod"}, {"globex", "globex-inc", "staging"}, {"globex", "globex-inc", "staging"}} {
			if got := rows[i+1][:3]; strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("row %d starts %q, want %q (sorted by name)", i+1, got, want)
			}
			if !strings.HasPrefix(rows[i+1][3], "127.0.0.1:") || rows[i+1][5] != "tether" {
				t.Errorf("row %d %q: want the client's loopback address and a tether version", i+1, rows[i+1])
			}
		}
	})

	t.Run("server json filtered by a glob", func(t *testing.T) {
		code, stdout, stderr := runTether(t, []string{"TETHER_ADMIN=" + admin, "TETHER_ADMIN_TOKEN_FILE=" + tokenFile},
			"status", "-o", "json", "acme-*")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var list []tunnelInfo
		if err := json.Unmarshal([]byte(stdout), &list); err != nil {
			t.Fatalf("stdout is not the JSON list: %v\n%s", err, stdout)
		}
		if len(list) != 2 {
			t.Fatalf("list %+v, want acme-prod's two sessions alone", list)
		}
		for _, ti := range list {
			if ti.Name != "acme-prod" || ti.Account != "acme" || ti.Runtime != "prod" || ti.BytesIn == 0 || ti.Session == "" {
				t.Errorf("session %+v, want acme-prod with its account, runtime, traffic and session ID", ti)
			}
		}
	})

	t.Run("server wide", func(t *testing.T) {
		code, stdout, stderr := runTether(t, nil, "status", "--admin", admin, "--admin-token-file", tokenFile, "-o", "wide", "globex")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if header := strings.Fields(lines[0]); strings.Join(header[len(header)-2:], " ") != "SESSION REPLICA" {
			t.Errorf("wide header %q, want it to end with SESSION REPLICA", lines[0])
		}
		for _, line := range lines[1:] {
			f := strings.Fields(line)
			if session, got := f[len(f)-2], f[len(f)-1]; len(session) != 8 || got != replica {
				t.Errorf("row %q: want an 8-character session ID and the replica %s last", line, replica)
			}
		}
	})

	// The memory registry of a single server lists its own tunnels, held
	// by its replica ID.
	t.Run("fleet", func(t *testing.T) {
		var lines []string
		testutil.WaitFor(t, readyTimeout, func() error { // see below: slots may reconnect
			code, stdout, stderr := runTether(t, nil, "status", "--admin", admin, "--admin-token-file", tokenFile, "--fleet")
			if code != 0 {
				return fmt.Errorf("tether status --fleet: exit %d: %s", code, stderr)
			}
			if lines = strings.Split(strings.TrimSpace(stdout), "\n"); len(lines) != 4 {
				return fmt.Errorf("tether status --fleet printed %d lines, want the registry's, a header and 2 tunnels:\n%s", len(lines), stdout)
			}
			return nil
		})
		if want := "Replica: " + replica + "   Registry: memory, up for "; !strings.HasPrefix(lines[0], want) {
			t.Errorf("first line %q, want it to start with %q", lines[0], want)
		}
		var rows []string
		for _, line := range lines[1:] {
			rows = append(rows, strings.Join(strings.Fields(line), " "))
		}
		if want := []string{"TUNNEL REPLICAS", "acme-prod " + replica, "globex " + replica}; strings.Join(rows, "\n") != strings.Join(want, "\n") {
			t.Errorf("fleet table:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
		}
	})

	t.Run("fleet json is the endpoint's", func(t *testing.T) {
		// A client's slots may reconnect at start (they look for another
		// replica), which may renew a tunnel's hold: compare until stable.
		testutil.WaitFor(t, readyTimeout, func() error {
			code, stdout, stderr := runTether(t, []string{"TETHER_FLEET=true"}, "status", "--admin", admin, "--admin-token-file", tokenFile, "-o", "json")
			if code != 0 {
				return fmt.Errorf("tether status: exit %d: %s", code, stderr)
			}
			req, err := http.NewRequest(http.MethodGet, admin+"/api/fleet", nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+adminToken)
			r, err := do(req)
			if err != nil || r.code != http.StatusOK {
				return fmt.Errorf("GET /api/fleet: %d %v", r.code, err)
			}
			if stdout != r.body {
				return fmt.Errorf("tether status --fleet -o json:\n%s\nGET /api/fleet:\n%s", stdout, r.body)
			}
			return nil
		})
	})

	t.Run("server without the token", func(t *testing.T) {
		code, stdout, stderr := runTether(t, nil, "status", "--admin", admin)
		if code != 1 || stdout != "" || !strings.Contains(stderr, "needs a token: pass --admin-token-file") {
			t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 and a message asking for --admin-token-file", code, stdout, stderr)
		}
	})

	t.Run("client", func(t *testing.T) {
		// As in the client's container, where TETHER_HEALTH_ADDR is set.
		code, stdout, stderr := runTether(t, []string{"TETHER_HEALTH_ADDR=" + cl.healthAddr}, "status")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		for _, want := range []string{
			"Tunnel:       acme-prod\n",
			"Server:       " + srv.tunnelAddr + "\n",
			"State:        ready\n",
			"Logged in:    yes, for ",
			"Connected:    yes, for ",
			"Routes:\n",
		} {
			if !strings.Contains(stdout, want) {
				t.Errorf("client status lacks %q:\n%s", want, stdout)
			}
		}
		_, routes, _ := strings.Cut(stdout, "Routes:\n")
		routes, sessions, _ := strings.Cut(routes, "Sessions:\n")
		if n := len(strings.Split(strings.TrimSpace(sessions), "\n")); n != 3 {
			t.Errorf("sessions:\n%s\nwant a header and the client's two sessions", sessions)
		}
		if want := "PREFIX UPSTREAM ADAPTER / " + backend.url() + " app-proxy"; strings.Join(strings.Fields(routes), " ") != want {
			t.Errorf("routes:\n%s\nwant the one route / to %s", routes, backend.url())
		}
	})

	assertNoSecret(t, "the admin token", adminToken, srv.proc)
}
