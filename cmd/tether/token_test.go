package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/status"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// fakeAdmin is a server's admin API as the revocation and disconnect
// commands rely on it (docs/operations.md, "Endpoints"), behind adminToken.
type fakeAdmin struct {
	url string

	mu     sync.Mutex
	revs   []registry.Revocation
	n      int
	bodies []map[string]any // the POST /api/revocations bodies, as sent
	// sessions are the tunnels' sessions by replica.
	sessions map[string][]string
}

func newFakeAdmin(t *testing.T) *fakeAdmin {
	t.Helper()
	a := &fakeAdmin{sessions: map[string][]string{"acme-prod": {"replica-a", "replica-b"}}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/revocations", a.add)
	mux.HandleFunc("GET /api/revocations", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		writeJSONAnswer(w, http.StatusOK, append([]registry.Revocation{}, a.revs...))
	})
	mux.HandleFunc("DELETE /api/revocations/{id}", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		i := slices.IndexFunc(a.revs, func(rev registry.Revocation) bool { return rev.ID == r.PathValue("id") })
		if i < 0 {
			http.Error(w, fmt.Sprintf("no revocation %q", r.PathValue("id")), http.StatusNotFound)
			return
		}
		rev := a.revs[i]
		a.revs = slices.Delete(a.revs, i, i+1)
		writeJSONAnswer(w, http.StatusOK, rev)
	})
	mux.HandleFunc("POST /api/tunnels/{name}/disconnect", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		name := r.PathValue("name")
		replicas := a.sessions[name]
		delete(a.sessions, name)
		writeJSONAnswer(w, http.StatusOK, map[string]any{"tunnel": name, "sessions_closed": len(replicas), "replicas": replicas})
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+adminToken {
			http.Error(w, "missing or wrong admin token", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

// add is POST /api/revocations: exactly one of tunnel and jti, until in
// RFC 3339 and reason optional, nothing else.
func (a *fakeAdmin) add(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, "the body is not JSON", http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bodies = append(a.bodies, body)
	var rev registry.Revocation
	for k, v := range body {
		s, ok := v.(string)
		switch {
		case !ok:
			http.Error(w, k+" is not a string", http.StatusBadRequest)
			return
		case k == "tunnel":
			rev.Tunnel = s
		case k == "jti":
			rev.JTI = s
		case k == "reason":
			if len(s) > 512 {
				http.Error(w, fmt.Sprintf("--reason is %d bytes long; want at most 512", len(s)), http.StatusBadRequest)
				return
			}
			rev.Reason = s
		case k == "until":
			until, err := time.Parse(time.RFC3339, s)
			if err != nil {
				http.Error(w, "until is not an RFC 3339 time", http.StatusBadRequest)
				return
			}
			rev.Until = until
		default:
			http.Error(w, "unknown field "+k, http.StatusBadRequest)
			return
		}
	}
	if (rev.Tunnel == "") == (rev.JTI == "") {
		http.Error(w, "give exactly one of tunnel and jti", http.StatusBadRequest)
		return
	}
	a.n++
	rev.ID, rev.CreatedAt = fmt.Sprintf("0195a1b2c3d4%08x", a.n), time.Date(2025, 3, 1, 12, 0, a.n, 0, time.UTC)
	a.revs = append(a.revs, rev)
	writeJSONAnswer(w, http.StatusCreated, rev)
}

func writeJSONAnswer(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// The revocation commands against the admin API: what they send, what they
// print, and what they say when something is wrong; the admin token never
// appears.
func TestTokenRevocationCommands(t *testing.T) {
	a := newFakeAdmin(t)
	tokenFile := writeFile(t, "admin-token", adminToken+"\n")
	admin := []string{"--admin", a.url, "--admin-token-file", tokenFile}
	steps := []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stdout string // in stdout
		stderr string // in stderr
	}{
		{name: "revoke a tunnel", args: append([]string{"token", "revoke", "--tunnel", "acme-prod", "--until", "24h", "--reason", "offboarded"}, admin...),
			stdout: `revocation 0195a1b2c3d400000001: every token of tunnel acme-prod, until `},
		{name: "revoke a token, by the environment", env: map[string]string{"TETHER_ADMIN": a.url, "TETHER_ADMIN_TOKEN_FILE": tokenFile},
			args:   []string{"token", "revoke", "--jti", "3f2a9c1e", "--until", "2030-01-01T00:00:00Z"},
			stdout: "revocation 0195a1b2c3d400000002: token 3f2a9c1e and every renewal of it, until 2030-01-01T00:00:00Z (in "},
		{name: "list", args: append([]string{"token", "revocations"}, admin...),
			stdout: "ID                     TUNNEL/JTI         UNTIL                  REASON       CREATED\n" +
				"0195a1b2c3d400000001   tunnel acme-prod   "},
		{name: "list shows the token's revocation", args: append([]string{"token", "revocations"}, admin...),
			stdout: "0195a1b2c3d400000002   jti 3f2a9c1e       2030-01-01T00:00:00Z   <none>       2025-03-01T12:00:02Z\n"},
		{name: "the server refuses a field", args: append([]string{"token", "revoke", "--tunnel", "acme-prod", "--reason", strings.Repeat("x", 600)}, admin...),
			code: exitFail, stderr: "the server refused the revocation: --reason is 600 bytes long; want at most 512"},
		{name: "unrevoke", args: append([]string{"token", "unrevoke", "0195a1b2c3d400000001"}, admin...),
			stdout: "deleted revocation 0195a1b2c3d400000001 (every token of tunnel acme-prod, until "},
		{name: "unrevoke what is gone", args: append([]string{"token", "unrevoke", "0195a1b2c3d400000001"}, admin...),
			code: exitFail, stderr: `no revocation "0195a1b2c3d400000001" at ` + a.url + ` (it says: no revocation "0195a1b2c3d400000001"): list them with ` + "`tether token revocations --admin " + a.url + "`"},
		{name: "list as JSON", args: append([]string{"token", "revocations", "-o", "json"}, admin...),
			stdout: `"jti": "3f2a9c1e"`},
		{name: "both a tunnel and a jti, and a bad until", args: append([]string{"token", "revoke", "--tunnel", "acme-prod", "--jti", "x", "--until", "tomorrow"}, admin...),
			code: exitUsage, stderr: "--tunnel and --jti exclude each other: revoke a tunnel (every token of it) or one token (and its renewals)\n--until \"tomorrow\""},
		{name: "a bad until", args: append([]string{"token", "revoke", "--tunnel", "acme-prod", "--until", "tomorrow"}, admin...),
			code: exitUsage, stderr: `--until "tomorrow": want a time (RFC 3339, e.g. 2025-03-01T12:00:00Z) or a duration from now (e.g. 24h or 90m)`},
		{name: "an until in the past", args: append([]string{"token", "revoke", "--tunnel", "acme-prod", "--until", "2020-01-01T00:00:00Z"}, admin...),
			code: exitUsage, stderr: `--until "2020-01-01T00:00:00Z" is not in the future`},
		{name: "nothing to revoke", args: append([]string{"token", "revoke"}, admin...),
			code: exitUsage, stderr: "what to revoke? pass --tunnel NAME"},
		{name: "not a tunnel name", args: append([]string{"token", "revoke", "--tunnel", "Acme_Prod"}, admin...),
			code: exitUsage, stderr: "--tunnel: "},
		{name: "no admin address", args: []string{"token", "revoke", "--tunnel", "acme-prod"},
			code: exitUsage, stderr: "--admin is required"},
		{name: "no ID", args: append([]string{"token", "unrevoke"}, admin...),
			code: exitUsage, stderr: "want one revocation ID, got 0 arguments"},
		{name: "yaml output", args: append([]string{"token", "revocations", "-o", "yaml"}, admin...),
			code: exitUsage, stderr: `--output "yaml": want json`},
		{name: "no admin token", args: []string{"token", "revocations", "--admin", a.url},
			code: exitFail, stderr: "needs a token: pass --admin-token-file"},
		{name: "a wrong admin token", args: []string{"token", "revocations", "--admin", a.url, "--admin-token-file", writeFile(t, "wrong", "not-"+adminToken)},
			code: exitFail, stderr: "refused the token in --admin-token-file"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			code, stdout, stderr := runTether(t, s.env, runners{}, s.args...)
			if code != s.code || !strings.Contains(stdout, s.stdout) || !strings.Contains(stderr, s.stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, %q in stdout and %q in stderr",
					code, stdout, stderr, s.code, s.stdout, s.stderr)
			}
			if strings.Contains(stdout+stderr, adminToken) {
				t.Errorf("the admin token was printed")
			}
		})
	}

	// What the commands sent: the contract's fields, nothing else.
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.bodies) != 3 {
		t.Fatalf("%d revocations posted, want 3", len(a.bodies))
	}
	until, _ := a.bodies[0]["until"].(string)
	at, err := time.Parse(time.RFC3339, until)
	if d := time.Until(at); err != nil || d < 23*time.Hour || d > 24*time.Hour {
		t.Errorf("--until 24h sent as until %q; want the time a day from now, RFC 3339", until)
	}
	delete(a.bodies[0], "until")
	for i, want := range []map[string]any{
		{"tunnel": "acme-prod", "reason": "offboarded"},
		{"jti": "3f2a9c1e", "until": "2030-01-01T00:00:00Z"},
	} {
		if fmt.Sprint(a.bodies[i]) != fmt.Sprint(want) {
			t.Errorf("POST /api/revocations body %v, want %v", a.bodies[i], want)
		}
	}
}

// tether tunnel disconnect closes a tunnel's sessions on every replica and
// says so; a tunnel without sessions is no error.
func TestTunnelDisconnect(t *testing.T) {
	a := newFakeAdmin(t)
	tokenFile := writeFile(t, "admin-token", adminToken)
	admin := []string{"--admin", a.url, "--admin-token-file", tokenFile}
	for _, s := range []struct {
		name         string
		args         []string
		code         int
		stdout, errs string
	}{
		{"disconnect", []string{"acme-prod"}, exitOK,
			"closed 2 sessions of tunnel acme-prod, on replica-a, replica-b; its clients may log in again (tether token revoke --tunnel acme-prod keeps them out)\n", ""},
		{"no session left", []string{"acme-prod"}, exitOK, "tunnel acme-prod had no session to close\n", ""},
		{"as JSON", []string{"acme-prod", "-o", "json"}, exitOK, "{\n  \"tunnel\": \"acme-prod\",\n  \"sessions_closed\": 0,\n  \"replicas\": []\n}\n", ""},
		{"not a tunnel name", []string{"Acme_Prod"}, exitUsage, "", "tunnel name: "},
		{"two names", []string{"acme-prod", "globex"}, exitUsage, "", "want one tunnel name, got 2 arguments"},
	} {
		t.Run(s.name, func(t *testing.T) {
			code, stdout, stderr := runTether(t, nil, runners{}, append(append([]string{"tunnel", "disconnect"}, s.args...), admin...)...)
			if code != s.code || stdout != s.stdout || !strings.Contains(stderr, s.errs) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, stdout %q, %q in stderr", code, stdout, stderr, s.code, s.stdout, s.errs)
			}
		})
	}
}

// A server from before the revocation and disconnect APIs answers 404:
// the commands say to upgrade it.
func TestAdminAPIMissing(t *testing.T) {
	old := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(old.Close)
	for _, args := range [][]string{
		{"token", "revoke", "--tunnel", "acme-prod"},
		{"token", "revocations"},
		{"tunnel", "disconnect", "acme-prod"},
	} {
		code, _, stderr := runTether(t, nil, runners{}, append(args, "--admin", old.URL)...)
		if want := "it runs a tether older than this command; upgrade it"; code != exitFail || !strings.Contains(stderr, want) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d and %q", strings.Join(args, " "), code, stderr, exitFail, want)
		}
	}
}

// The revoke command's flags bind to its options.
func TestTokenRevokeOptions(t *testing.T) {
	var got *RevokeOptions
	cmd := NewCmdTokenRevoke(&Factory{Out: &bytes.Buffer{}}, func(o *RevokeOptions) error { got = o; return nil })
	cmd.SetArgs([]string{"--admin", "127.0.0.1:7700", "--admin-token-file", "/etc/tether/admin-token", "--jti", "3f2a", "--until", "90m", "--reason", "leaked", "-o", "json", "--timeout", "3s"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	want := RevokeOptions{AdminOptions: AdminOptions{Admin: "127.0.0.1:7700", AdminTokenFile: "/etc/tether/admin-token", Output: "json", Timeout: 3 * time.Second},
		JTI: "3f2a", Until: "90m", Reason: "leaked"}
	if *got != want {
		t.Errorf("options %+v, want %+v", *got, want)
	}
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	req, err := got.request(now)
	if err != nil || req != (status.RevokeRequest{JTI: "3f2a", Until: now.Add(90 * time.Minute), Reason: "leaked"}) {
		t.Errorf("request %+v, %v; want jti 3f2a until 13:30, reason leaked", req, err)
	}
}
