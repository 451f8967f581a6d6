package status

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/client"
)

func timeAt(d time.Duration) *time.Time { t := now.Add(d); return &t }

// healthAPI serves snap at /status like a tether client and returns the
// server's HOST:PORT.
func healthAPI(t *testing.T, snap client.Snapshot) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(snap)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

var loggedIn = client.Snapshot{
	Tunnel: "acme-prod", Server: "tunnels.example.com:7000", Transport: "wss", Via: "proxy http://proxy.corp:3128",
	Ready: true, State: "ready", Connected: true,
	ConnectedSince: timeAt(-(3*time.Hour + 12*time.Minute)), LoggedInSince: timeAt(-(3*time.Hour + 11*time.Minute)),
	LastError: "dial tcp 203.0.113.1:7000: connection refused", LastErrorAt: timeAt(-(3*time.Hour + 13*time.Minute)),
	Reconnects: 2,
	Routes: []client.RouteState{
		{Prefix: "/", Upstream: "http://app-proxy:8080", Adapter: "app-proxy"},
		{Prefix: "/workflows", Upstream: "https://argo-server:2746/", Adapter: "argo-workflows"},
	},
	Connections: 2,
	Sessions: []client.SessionState{
		{Slot: 0, Replica: "tether-server-0", Session: "5f0c", State: "moving", Since: timeAt(-5 * time.Second), Via: "proxy http://proxy.corp:3128"},
		{Slot: 0, Replica: "tether-server-2", Session: "77ab", State: "ready", Since: timeAt(-4 * time.Second), Via: "proxy http://proxy.corp:3128"},
		{Slot: 1, State: "connecting", Since: timeAt(-90 * time.Second), LastError: "dial tcp 203.0.113.1:7000: connection refused"},
	},
}

func showClient(t *testing.T, addr string, format Format) (string, error) {
	t.Helper()
	h, err := NewHealth(addr)
	if err != nil {
		t.Fatalf("NewHealth(%q): %v", addr, err)
	}
	snap, err := h.Snapshot(context.Background())
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	err = Printer{Out: &out, Format: format, Now: clock}.Client(snap)
	return out.String(), err
}

func TestClientLoggedIn(t *testing.T) {
	out, err := showClient(t, healthAPI(t, loggedIn), Table)
	if err != nil {
		t.Fatal(err)
	}
	want := `Tunnel:       acme-prod
Server:       tunnels.example.com:7000
Transport:    wss
Via:          proxy http://proxy.corp:3128
State:        ready
Logged in:    yes, for 3h11m (since 2025-03-01T08:49:00Z)
Connected:    yes, for 3h12m (since 2025-03-01T08:48:00Z)
Last error:   dial tcp 203.0.113.1:7000: connection refused (3h13m ago)
Reconnects:   2
Routes:
  PREFIX       UPSTREAM                    ADAPTER
  /            http://app-proxy:8080       app-proxy
  /workflows   https://argo-server:2746/   argo-workflows
Sessions:
  SLOT   REPLICA           STATE        SINCE   VIA
  0      tether-server-0   moving       5s      proxy http://proxy.corp:3128
  0      tether-server-2   ready        4s      proxy http://proxy.corp:3128
  1      <none>            connecting   90s     <none>
`
	if out != want {
		t.Errorf("client status:\n%s\nwant:\n%s", out, want)
	}
}

// Wide adds each session's server session ID and last error.
func TestClientSessionsWide(t *testing.T) {
	out, err := showClient(t, healthAPI(t, loggedIn), Wide)
	if err != nil {
		t.Fatal(err)
	}
	want := `Sessions:
  SLOT   REPLICA           STATE        SINCE   VIA                            SESSION   LAST ERROR
  0      tether-server-0   moving       5s      proxy http://proxy.corp:3128   5f0c      <none>
  0      tether-server-2   ready        4s      proxy http://proxy.corp:3128   77ab      <none>
  1      <none>            connecting   90s     <none>                         <none>    dial tcp 203.0.113.1:7000: connection refused
`
	if !strings.HasSuffix(out, want) {
		t.Errorf("client status -o wide:\n%s\nwant it to end with:\n%s", out, want)
	}
}

// A client older than sessions reports none, and status prints no table.
func TestClientWithoutSessions(t *testing.T) {
	snap := loggedIn
	snap.Connections, snap.Sessions = 0, nil
	out, err := showClient(t, healthAPI(t, snap), Table)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "Sessions") || !strings.HasSuffix(out, "argo-workflows\n") {
		t.Errorf("status of a client without sessions:\n%s", out)
	}
}

// What a client's health address answers reaches the terminal escaped.
func TestClientEscapesValues(t *testing.T) {
	snap := client.Snapshot{
		Tunnel: "acme\x1b[2J", Server: "tunnels.example.com:7000", Transport: "tcp\r", Via: "direct\nState: ready",
		State: "not connected: " + hostileVersion, LastError: "boom\r\x1b[1A", LastErrorAt: timeAt(-time.Second),
		Routes: []client.RouteState{{Prefix: "/\x1b[8m", Upstream: "http://a:1\n  /x", Adapter: "custom\u202e"}},
		// The replica and session names come from the server.
		Sessions: []client.SessionState{{Slot: 0, Replica: "r\x1b[2J\n1   evil", Session: "s\r", State: "ready\u202e", Via: "direct\t", LastError: "x\x1b[1A"}},
	}
	out, err := showClient(t, healthAPI(t, snap), Table)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := unsafeForTerminal(out); ok {
		t.Errorf("client status holds %q:\n%q", r, out)
	}
	if n := strings.Count(out, "\n"); n != 15 {
		t.Errorf("client status has %d lines, want 15 (9 fields, Routes, header, one route, Sessions, header, one session):\n%s", n, out)
	}
	for _, want := range []string{`Via:          direct\nState: ready`, `Last error:   boom\r\x1b[1A (1s ago)`, `/\x1b[8m`, `custom\u202e`,
		`r\x1b[2J\n1   evil`, `ready\u202e`, `direct\t`} {
		if !strings.Contains(out, want) {
			t.Errorf("client status lacks %q:\n%s", want, out)
		}
	}
}

func TestClientDisconnected(t *testing.T) {
	snap := client.Snapshot{
		Tunnel: "acme-prod", Server: "tunnels.example.com:7000", Transport: "tcp",
		State:     "not connected to the tunnel server: token expired",
		LastError: "token expired", LastErrorAt: timeAt(-30 * time.Second),
	}
	out, err := showClient(t, healthAPI(t, snap), Wide)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"Via:          <none>",
		"State:        not connected to the tunnel server: token expired",
		"Logged in:    no",
		"Connected:    no",
		"Last error:   token expired (30s ago)",
		"Reconnects:   0",
		"Routes:       <none>",
	} {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("client status lacks %q:\n%s", line, out)
		}
	}
}

func TestClientJSON(t *testing.T) {
	out, err := showClient(t, healthAPI(t, loggedIn), JSON)
	if err != nil {
		t.Fatal(err)
	}
	var got client.Snapshot
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Fatalf("stdout is not one snapshot: %v\n%s", err, out)
	}
	if !reflect.DeepEqual(got, loggedIn) {
		t.Errorf("JSON %+v, want %+v", got, loggedIn)
	}
}

// In a pod the client listens on a wildcard address; status dials loopback.
func TestHealthWildcardAddress(t *testing.T) {
	addr := healthAPI(t, loggedIn)
	_, port, _ := net.SplitHostPort(addr)
	for _, wildcard := range []string{"0.0.0.0:" + port, ":" + port} {
		if out, err := showClient(t, wildcard, Table); err != nil || !strings.Contains(out, "acme-prod") {
			t.Errorf("--health-addr %s: %v\n%s", wildcard, err, out)
		}
	}
	h, err := NewHealth("[::]:8081")
	if err != nil || h.addr != "[::1]:8081" {
		t.Errorf("NewHealth([::]:8081) dials %q (%v), want [::1]:8081", h.addr, err)
	}
	for _, bad := range []string{"8081", "http://127.0.0.1:8081", ""} {
		if _, err := NewHealth(bad); err == nil || !contains(err.Error(), "--health-addr", "HOST:PORT") {
			t.Errorf("NewHealth(%q) error %v; want one naming --health-addr and HOST:PORT", bad, err)
		}
	}
}

func TestHealthErrors(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/tunnels", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("[]"))
	})
	admin := httptest.NewServer(mux) // a server's admin address, which has no /status
	t.Cleanup(admin.Close)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"status": "ok"}`))
	}))
	t.Cleanup(other.Close)
	adminAddr, otherAddr, closed := admin.Listener.Addr().String(), other.Listener.Addr().String(), testutil.ClosedAddr(t)

	for name, tc := range map[string]struct {
		addr string
		want string
	}{
		"refused":       {closed, "no tether client health endpoint at " + closed + ": check --health-addr (the client's --health-addr)"},
		"404":           {adminAddr, adminAddr + " does not look like a tether client health address"},
		"other service": {otherAddr, otherAddr + " does not look like a tether client health address"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := showClient(t, tc.addr, Table); err == nil || !contains(err.Error(), tc.want, "--health-addr") {
				t.Errorf("error %v; want one containing %q", err, tc.want)
			}
		})
	}
}

// A slot that shares its replica with another says so, and when it next
// tries to reach another replica.
func TestClientSessionsSharingAReplica(t *testing.T) {
	snap := loggedIn
	snap.Sessions = []client.SessionState{
		{Slot: 0, Replica: "tether-server-0", Session: "5f0c", State: "ready", Since: timeAt(-time.Minute), Via: "direct", SharesReplicaWith: []int{1}},
		{Slot: 1, Replica: "tether-server-0", Session: "77ab", State: "ready", Since: timeAt(-30 * time.Second), Via: "direct", SharesReplicaWith: []int{0}, NextTry: timeAt(12 * time.Second)},
	}
	out, err := showClient(t, healthAPI(t, snap), Table)
	if err != nil {
		t.Fatal(err)
	}
	want := `Sessions:
  SLOT   REPLICA           STATE   SINCE   VIA      NOTE
  0      tether-server-0   ready   60s     direct   shares its replica with slot 1
  1      tether-server-0   ready   30s     direct   shares its replica with slot 0; tries another in 12s
`
	if !strings.HasSuffix(out, want) {
		t.Errorf("client status:\n%s\nwant it to end with:\n%s", out, want)
	}
}

// The token a client logs in with: where it came from, its jti (and the
// first token's, for a renewal), expiry, last renewal, and the warning of
// a token about to expire with no renewal.
func TestClientToken(t *testing.T) {
	tests := []struct {
		name  string
		token client.TokenState
		want  string
	}{
		{
			name: "file, expiring without renewal",
			token: client.TokenState{Source: client.TokenFromFile, JTI: "7b2c", IssuedAt: timeAt(-25 * 24 * time.Hour), ExpiresAt: timeAt(5 * 24 * time.Hour),
				Warning: "the token expires in 5d (at 2025-03-06T12:00:00Z) and no renewal came: issue a new token\x1b[2J"},
			want: `Token:        file (--token-file), jti 7b2c
Expires:      in 5d (2025-03-06T12:00:00Z)
Renewed:      never
Warning:      the token expires in 5d (at 2025-03-06T12:00:00Z) and no renewal came: issue a new token\x1b[2J
`,
		},
		{
			name: "renewed",
			token: client.TokenState{Source: client.TokenRenewed, JTI: "9f1c", Renews: "7b2c", IssuedAt: timeAt(-3 * time.Hour),
				ExpiresAt: timeAt(30*24*time.Hour - 3*time.Hour), RenewedAt: timeAt(-3 * time.Hour), Renewals: 2},
			want: `Token:        renewed (by the server), jti 9f1c, renews jti 7b2c
Expires:      in 29d (2025-03-31T09:00:00Z)
Renewed:      3h ago (2025-03-01T09:00:00Z), 2 renewals since the client started
`,
		},
		{
			name:  "expired",
			token: client.TokenState{Source: client.TokenFromFile, ExpiresAt: timeAt(-5 * time.Minute)},
			want: `Token:        file (--token-file)
Expires:      expired 5m ago (2025-03-01T11:55:00Z)
Renewed:      never
`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := loggedIn
			snap.Token = &tc.token
			out, err := showClient(t, healthAPI(t, snap), Table)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "Reconnects:   2\n"+tc.want+"Routes:") {
				t.Errorf("client status:\n%s\nwant after Reconnects:\n%s", out, tc.want)
			}
			js, err := showClient(t, healthAPI(t, snap), JSON)
			if err != nil {
				t.Fatal(err)
			}
			var got client.Snapshot
			if err := json.Unmarshal([]byte(js), &got); err != nil || got.Token == nil || !reflect.DeepEqual(*got.Token, tc.token) {
				t.Errorf("-o json token %+v (%v), want %+v", got.Token, err, tc.token)
			}
		})
	}
}
