package test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// Tokens over a tunnel's life, end to end: renewal keeps a tunnel up past
// its first token, across a server restart; a revocation closes a tunnel's
// or a token's sessions on every replica within seconds, refuses their
// logins, leaves other tunnels alone and outlives restarts; a disconnect
// closes a tunnel's sessions everywhere and lets them back.

// revokedWithin is how soon a revocation closes the sessions it covers, on
// every replica.
const revokedWithin = 5 * time.Second

// TestTokenRenewalOutlivesTheFirstToken serves a tunnel whose token lives
// 40 s for two minutes without a gap, then kills the server (-9) and starts
// it again: the client logs in with the renewal it was sent, its token
// file's token having expired long before.
func TestTokenRenewalOutlivesTheFirstToken(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	s := startServer(t, k, serverOpts{args: []string{"--token-renewal-key", k.priv}})
	b := newBackend(t, "renewed", nil)
	first := k.issue(t, "renewed", 40*time.Second)
	renewedFile := filepath.Join(t.TempDir(), "renewed-token")
	c := startClient(t, s, clientOpts{tokenFile: writeToken(t, first), routes: []string{"/=" + b.url()},
		args: []string{"--renewed-token-file", renewedFile}})

	// The token expires at 40 s, and a session without renewal closes at
	// 40 s plus the verifier's 30 s leeway: two minutes are well past both.
	start := time.Now()
	pace := time.NewTicker(time.Second) // a request a second, as a platform's would come
	defer pace.Stop()
	for ; time.Since(start) < 2*time.Minute; <-pace.C {
		if e, err := s.echoFromWith(watchc, "renewed", "/up"); err != nil || e.Backend != b.name {
			t.Fatalf("%v after the client started: request through the tunnel failed: %v (backend %q)", time.Since(start).Round(time.Second), err, e.Backend)
		}
		st, err := c.status()
		if err != nil {
			t.Fatal(err)
		}
		if st.Reconnects != 0 {
			t.Fatalf("%v after the client started: the client reconnected %d times (last error %q); want its session to live on by the renewals",
				time.Since(start).Round(time.Second), st.Reconnects, st.LastError)
		}
	}
	s.waitLog("token renewed", time.Second)
	if exp := tokenClaims(t, first)["exp"].(float64); time.Now().Unix() < int64(exp)+30 {
		t.Fatalf("the first token is still valid (exp %v): the test proves nothing", exp)
	}

	s.kill()
	s2 := startServer(t, k, serverOpts{tunnelAddr: s.tunnelAddr, args: []string{"--token-renewal-key", k.priv}})
	testutil.WaitFor(t, readyTimeout, func() error {
		e, err := s2.echoFromWith(quickc, "renewed", "/after-restart")
		if err == nil && e.Backend != b.name {
			err = fmt.Errorf("answered by %q", e.Backend)
		}
		return err
	})
	login := s2.waitLog("tunnel connected", time.Second)
	if jti := str(login["jti"]); jti == "" || jti == str(tokenClaims(t, first)["jti"]) {
		t.Errorf("after the restart the client logged in with jti %q; want a renewal's, not the first token's", jti)
	}
	assertNoSecret(t, "the first token", first, s.proc, s2.proc, c.proc)
}

// TestRevocationOnEveryReplica revokes a tunnel and a token on a fleet of
// two replicas sharing Redis, whose tunnels each have a session on both.
func TestRevocationOnEveryReplica(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	byTunnel := f.startTunnel("revoked", "backend-revoked", f.lb.addr(), 2)
	byToken := f.startTunnel("revokedjti", "backend-revokedjti", f.lb.addr(), 2)
	other := f.startTunnel("kept", "backend-kept", f.lb.addr(), 2)
	waitSessions(t, []haTunnel{byTunnel, byToken, other}, time.Now(), recoverIn)
	admin := "http://" + f.replica(0).adminAddr

	revoke := func(args ...string) map[string]any {
		t.Helper()
		code, stdout, stderr := runTether(t, nil, append([]string{"token", "revoke", "--admin", admin, "-o", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("tether token revoke %v: exit %d: %s", args, code, stderr)
		}
		var rev map[string]any
		if err := json.Unmarshal([]byte(stdout), &rev); err != nil {
			t.Fatalf("tether token revoke printed %q: %v", stdout, err)
		}
		return rev
	}
	closedEverywhere := func(name string) {
		t.Helper()
		revokedAt := time.Now()
		testutil.WaitFor(t, revokedWithin, func() error {
			for i := range f.size() {
				if n := countSessions(t, f.replica(i).server, name); n > 0 {
					return fmt.Errorf("replica %d still has %d sessions of %s", i, n, name)
				}
			}
			return nil
		})
		t.Logf("%s: sessions closed on every replica %v after the revocation", name, time.Since(revokedAt).Round(time.Millisecond))
	}

	rev := revoke("--tunnel", "revoked", "--reason", "offboarded")
	closedEverywhere("revoked")
	jti := str(tokenClaims(t, readToken(t, byToken.client.tokenFile))["jti"])
	revoke("--jti", jti)
	closedEverywhere("revokedjti")

	for _, tu := range []haTunnel{byTunnel, byToken} {
		waitLastError(t, tu.client, "revoked")
	}
	for i := range f.size() {
		if e, _, err := f.get(other.name, "/kept", i); err != nil || e.Backend != other.backend.name {
			t.Errorf("tunnel %s through replica %d after the revocations: %v (backend %q)", other.name, i, err, e.Backend)
		}
		if r, err := f.replica(i).get("revoked", "/"); err != nil || r.code != http.StatusServiceUnavailable {
			t.Errorf("revoked tunnel through replica %d: %v %d; want 503 tunnel_down", i, err, r.code)
		}
		if n := countSessions(t, f.replica(i).server, other.name); n == 0 {
			t.Errorf("replica %d lost the sessions of %s, which nobody revoked", i, other.name)
		}
	}

	// The revocations are in Redis: replicas that restart keep refusing.
	for i := range f.size() {
		f.replica(i).kill()
		f.restart(i)
	}
	testutil.WaitFor(t, recoverIn, func() error {
		for i := range f.size() {
			if countSessions(t, f.replica(i).server, other.name) == 0 {
				return fmt.Errorf("%s not back on replica %d", other.name, i)
			}
		}
		return nil
	})
	for i := range f.size() {
		for _, name := range []string{"revoked", "revokedjti"} {
			if n := countSessions(t, f.replica(i).server, name); n > 0 {
				t.Errorf("restarted replica %d serves revoked tunnel %s (%d sessions)", i, name, n)
			}
		}
	}
	code, stdout, stderr := runTether(t, nil, "token", "revocations", "--admin", "http://"+f.replica(1).adminAddr)
	if code != 0 || !strings.Contains(stdout, str(rev["id"])) || !strings.Contains(stdout, "offboarded") {
		t.Errorf("tether token revocations after the restarts: exit %d, %q %q; want revocation %s listed with its reason", code, stdout, stderr, str(rev["id"]))
	}

	// Lifted, the tunnel comes back.
	if code, _, stderr := runTether(t, nil, "token", "unrevoke", "--admin", "http://"+f.replica(0).adminAddr, str(rev["id"])); code != 0 {
		t.Fatalf("tether token unrevoke: exit %d: %s", code, stderr)
	}
	byTunnel.client.waitReady(t, time.Minute)
}

// TestDisconnectOnEveryReplica closes a tunnel's sessions on both
// replicas of a fleet; its client logs in again, and other tunnels are
// untouched.
func TestDisconnectOnEveryReplica(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	target := f.startTunnel("dropped", "backend-dropped", f.lb.addr(), 2)
	other := f.startTunnel("stays", "backend-stays", f.lb.addr(), 1)
	waitSessions(t, []haTunnel{target, other}, time.Now(), recoverIn)
	before, err := readySessions(target.client)
	if err != nil {
		t.Fatal(err)
	}
	otherBefore, err := readySessions(other.client)
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runTether(t, nil, "tunnel", "disconnect", "--admin", "http://"+f.replica(1).adminAddr, "-o", "json", "dropped")
	if code != 0 {
		t.Fatalf("tether tunnel disconnect: exit %d: %s", code, stderr)
	}
	var d struct {
		Tunnel         string   `json:"tunnel"`
		SessionsClosed int      `json:"sessions_closed"`
		Replicas       []string `json:"replicas"`
		Unreached      []string `json:"unreached"`
	}
	if err := json.Unmarshal([]byte(stdout), &d); err != nil {
		t.Fatalf("tether tunnel disconnect printed %q: %v", stdout, err)
	}
	if d.Tunnel != "dropped" || d.SessionsClosed != len(before) || len(d.Unreached) > 0 {
		t.Errorf("disconnect answered %+v; want tunnel dropped, %d sessions closed (%v), none unreached", d, len(before), before)
	}
	if len(d.Replicas) != len(uniq(before)) {
		t.Errorf("disconnect closed sessions on %v; the sessions were on %v", d.Replicas, before)
	}
	testutil.WaitFor(t, recoverIn, func() error {
		st, err := target.client.status()
		if err != nil {
			return err
		}
		if st.Reconnects == 0 {
			return fmt.Errorf("the client has not reconnected")
		}
		now, err := readySessions(target.client)
		if err == nil && len(now) < target.connections {
			err = fmt.Errorf("%d of %d sessions ready", len(now), target.connections)
		}
		return err
	})
	if e, _, err := f.get(target.name, "/back", 0); err != nil || e.Backend != target.backend.name {
		t.Errorf("tunnel %s after the disconnect: %v", target.name, err)
	}
	st, err := other.client.status()
	if err != nil || st.Reconnects != 0 {
		t.Errorf("tunnel %s, not disconnected, reconnected (%v, %+v; sessions were %v)", other.name, err, st, otherBefore)
	}
}

// TestRevocationOutlivesRestartInDataDir revokes a tunnel on a single
// server that keeps its state in --data-dir, kills it (-9), and starts it
// again on the same directory: the tunnel stays refused.
func TestRevocationOutlivesRestartInDataDir(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	dir := t.TempDir()
	s := startServer(t, k, serverOpts{args: []string{"--data-dir", dir}})
	if l := s.waitLog("tether server started", time.Second); str(l["revocations"]) != "data-dir" {
		t.Errorf("server with --data-dir keeps its revocations in %q; want data-dir", str(l["revocations"]))
	}
	b := newBackend(t, "gone", nil)
	c := startClient(t, s, clientOpts{tokenFile: writeToken(t, k.issue(t, "gone", time.Hour)), routes: []string{"/=" + b.url()}})
	if code, _, stderr := runTether(t, nil, "token", "revoke", "--admin", "http://"+s.adminAddr, "--tunnel", "gone"); code != 0 {
		t.Fatalf("tether token revoke: exit %d: %s", code, stderr)
	}
	testutil.WaitFor(t, revokedWithin, func() error {
		if n := countSessions(t, s, "gone"); n > 0 {
			return fmt.Errorf("%d sessions still open", n)
		}
		return nil
	})
	s.kill()
	s2 := startServer(t, k, serverOpts{tunnelAddr: s.tunnelAddr, args: []string{"--data-dir", dir}})
	if l := s2.waitLog("tunnel login rejected", readyTimeout); str(l["reason"]) != "revoked" || str(l["claimed_tunnel"]) != "gone" {
		t.Errorf("the restarted server rejected a login with %v; want tunnel gone's, reason revoked", l)
	}
	waitLastError(t, c, "revoked")
	if n := countSessions(t, s2, "gone"); n > 0 {
		t.Errorf("the restarted server serves the revoked tunnel (%d sessions)", n)
	}

	// Without --data-dir or a registry, the server says it forgets.
	s3 := startServer(t, k, serverOpts{})
	s3.waitLog("revocations are kept in memory only: a restart forgets them; give --data-dir (one replica) or a Redis --registry (several) to keep them", time.Second)
}

// readToken reads a token file.
func readToken(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// countSessions is how many sessions of tunnel name s lists.
func countSessions(t testing.TB, s *server, name string) int {
	t.Helper()
	n := 0
	for _, info := range s.sessions(t) {
		if info.Name == name {
			n++
		}
	}
	return n
}

// waitLastError waits until c's last error says want.
func waitLastError(t testing.TB, c *client, want string) {
	t.Helper()
	testutil.WaitFor(t, readyTimeout, func() error {
		st, err := c.status()
		if err == nil && !strings.Contains(st.LastError, want) {
			err = fmt.Errorf("client last error %q; want it to say %q", st.LastError, want)
		}
		return err
	})
}

// tokenClaims decodes a JWT's claims, unverified.
func tokenClaims(t testing.TB, token string) map[string]any {
	t.Helper()
	parts := strings.Split(strings.TrimSpace(token), ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %d segments", len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func uniq(list []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range list {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
