package test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// waitNotReady waits until the client's /readyz stops answering 200.
func (c *client) waitNotReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	testutil.WaitFor(t, timeout, func() error {
		code, body, err := c.readyz()
		if err != nil {
			return err
		}
		if code == http.StatusOK {
			return fmt.Errorf("client still ready: %s", strings.TrimSpace(body))
		}
		return nil
	})
}

// TestServerRestart: after the server is killed and started again on the
// same tunnel address, the client reconnects by itself and requests
// succeed again.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	b := newBackend(t, "backend", nil)
	c := startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + b.url()}})
	srv.waitServedBy(t, "alpha", "backend", readyTimeout)

	killed := time.Now()
	srv.kill()
	c.waitNotReady(t, 30*time.Second)
	t.Logf("client noticed the dead server after %v", time.Since(killed).Round(time.Millisecond))

	srv2 := startServer(t, k, serverOpts{tunnelAddr: srv.tunnelAddr})
	restarted := time.Now()
	srv2.waitServedBy(t, "alpha", "backend", 30*time.Second)
	t.Logf("requests succeed again %v after the restart (%v after the kill)",
		time.Since(restarted).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))

	c.waitReady(t, 10*time.Second)
	st, err := c.status()
	if err != nil {
		t.Fatal(err)
	}
	if st.Reconnects < 1 || !st.Ready || !st.Connected {
		t.Errorf("client /status: reconnects %d, ready %v, connected %v; want >= 1, true, true", st.Reconnects, st.Ready, st.Connected)
	}
	if c.exited() {
		t.Errorf("client exited; want it to reconnect by itself")
	}
}

// TestFrozenPath: when the path to the server goes dark without either side
// closing, the client notices within its heartbeat timeout and reconnects,
// and no frozen session waits for the server's heartbeat timeout (60s, the
// default, here): the new session replaces the frozen one it stands for at
// once, unless the server closed it first for its silence.
func TestFrozenPath(t *testing.T) {
	t.Parallel()
	const heartbeat = 3 * time.Second
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	b := newBackend(t, "backend", nil)
	rl := newRelay(t, srv.tunnelAddr)
	c := startClient(t, srv, clientOpts{
		server:    rl.addr(),
		tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)),
		routes:    []string{"/=" + b.url()},
		args:      []string{"--heartbeat-timeout", heartbeat.String()},
	})
	srv.waitServedBy(t, "alpha", "backend", readyTimeout)
	// The client's second slot tries a few times to leave the replica its
	// first holds before it shares it: freeze once both have settled.
	waitSessions(t, []haTunnel{{name: "alpha", client: c, connections: 2}}, time.Now(), readyTimeout)
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := rl.open(); n != 2 {
			return fmt.Errorf("relay carries %d connections, want the client's two", n)
		}
		return nil
	})
	endedBefore := srv.metric(t, "tether_sessions_replaced_total") + srv.metric(t, "tether_sessions_silent_total")
	st, err := c.status()
	if err != nil {
		t.Fatal(err)
	}
	reconnectsBefore := st.Reconnects

	if n := rl.freeze(); n != 2 {
		t.Fatalf("froze %d connections, want the client's two", n)
	}
	frozen := time.Now()
	testutil.WaitFor(t, 4*heartbeat, func() error {
		st, err := c.status()
		if err != nil {
			return err
		}
		if st.Reconnects == reconnectsBefore && st.Connected {
			return fmt.Errorf("client has not noticed the frozen path: %+v", st)
		}
		return nil
	})
	noticed := time.Since(frozen)
	t.Logf("client noticed the frozen path after %v (heartbeat timeout %v)", noticed.Round(time.Millisecond), heartbeat)
	if slack := 2 * time.Second; noticed > heartbeat+slack {
		t.Errorf("client noticed the frozen path after %v; want within its --heartbeat-timeout %v (+%v slack)", noticed, heartbeat, slack)
	}

	// New connections through the relay are not frozen: the client comes
	// back through it, and the server must serve the new session at once.
	srv.waitServedBy(t, "alpha", "backend", 20*time.Second)
	back := time.Since(frozen)
	t.Logf("requests succeed again %v after the freeze", back.Round(time.Millisecond))
	if limit := 15 * time.Second; back > limit {
		t.Errorf("requests succeeded again only %v after the freeze; want within %v (the old session's 30s timeout must not matter)", back, limit)
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		// A frozen session ends when its connection's new login replaces
		// it, or sooner, when the server sees its client went silent while
		// the tunnel's other session served.
		ended := srv.metric(t, "tether_sessions_replaced_total") + srv.metric(t, "tether_sessions_silent_total")
		if ended < endedBefore+2 {
			return fmt.Errorf("frozen sessions replaced or closed for silence: %v, want %v: neither may wait for the heartbeat timeout", ended-endedBefore, 2)
		}
		return nil
	})
	// A session closed for its silence may end before its slot has
	// reconnected: wait for both slots to come back through the relay.
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := rl.accepted.Load(); got < 4 {
			return fmt.Errorf("relay accepted %d connections, want the reconnects to come through it too", got)
		}
		return nil
	})
	// The client's second slot may still be leaving the replica its first
	// holds (it tries a few times before it shares it): wait for that,
	// well within the frozen sessions' heartbeat timeout.
	testutil.WaitFor(t, 5*time.Second, func() error {
		if list := srv.sessions(t); len(list) != 2 {
			return fmt.Errorf("server lists %d sessions, want only alpha's two new ones: %v", len(list), list)
		}
		return nil
	})
	rl.thaw()
	// The old connection, thawed, must not take the tunnel back.
	for range 10 {
		if _, err := srv.echoFrom("alpha", "/"); err != nil {
			t.Errorf("after thawing the old connection: %v", err)
			break
		}
	}
}

// TestTwoClientsServeOneTunnel: two client processes with the same token
// serve one tunnel side by side: neither replaces the other, requests reach
// both, and when one is killed the other carries every request within 3s.
func TestTwoClientsServeOneTunnel(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	b1 := newBackend(t, "first", nil)
	b2 := newBackend(t, "second", nil)
	token := writeToken(t, k.issue(t, "alpha", time.Hour))
	c1 := startClient(t, srv, clientOpts{tokenFile: token, routes: []string{"/=" + b1.url()}})
	c2 := startClient(t, srv, clientOpts{tokenFile: token, routes: []string{"/=" + b2.url()}})
	srv.waitServedBy(t, "alpha", "first", readyTimeout)
	srv.waitServedBy(t, "alpha", "second", readyTimeout)
	// Each client's second slot may still be leaving the replica its first
	// holds (it tries a few times before it shares it).
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := len(srv.sessions(t)); n != 4 {
			return fmt.Errorf("server lists %d sessions, want 2 clients × 2 connections", n)
		}
		return nil
	})
	// A new login of a slot that left may reach the server before the close
	// of the session it left, and replace that session of its own. The
	// clients must never replace each other's: a client whose session was
	// replaced would reconnect, and no session is replaced once they have
	// settled.
	for k, c := range []*client{c1, c2} {
		c.waitReady(t, readyTimeout)
		if st, err := c.status(); err != nil || st.Reconnects != 0 {
			t.Errorf("client %d: reconnects %d (%v), want 0: the clients must not replace each other", k+1, st.Reconnects, err)
		}
	}
	replacedBefore := srv.metric(t, "tether_sessions_replaced_total")

	killed := time.Now()
	c1.kill()
	const recovery = 3 * time.Second
	var failed, late, total int
	for time.Since(killed) < recovery+2*time.Second {
		total++
		e, err := srv.echoFrom("alpha", "/")
		switch {
		case err != nil && time.Since(killed) <= recovery:
			failed++
			t.Logf("request %d, %v after the kill: %v", total, time.Since(killed).Round(time.Millisecond), err)
		case err != nil:
			late++
			t.Errorf("request %d, %v after the kill: %v", total, time.Since(killed).Round(time.Millisecond), err)
		case e.Backend != "second":
			t.Fatalf("request %d answered by %q, want second", total, e.Backend)
		}
	}
	t.Logf("%d requests in the %v after killing one client: %d failed within %v, %d after", total, recovery+2*time.Second, failed, recovery, late)
	if got := srv.metric(t, "tether_sessions_replaced_total") - replacedBefore; got != 0 {
		t.Errorf("tether_sessions_replaced_total grew by %v, want 0: the clients must not replace each other", got)
	}
}

// TestTokenRotation: the client reads its token file at every connect, so
// a rotated token takes effect at the next reconnect without a restart.
func TestTokenRotation(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	b := newBackend(t, "backend", nil)
	tokenFile := writeToken(t, k.issue(t, "alpha", time.Hour, "--account", "one"))
	c := startClient(t, srv, clientOpts{tokenFile: tokenFile, routes: []string{"/=" + b.url()}})
	if got := srv.tunnels(t)["alpha"].Account; got != "one" {
		t.Fatalf("account %q, want one", got)
	}

	replaceFile(t, tokenFile, k.issue(t, "alpha", time.Hour, "--account", "two")+"\n")
	// Force a reconnect: restart the server on the same tunnel address.
	srv.stop()
	srv2 := startServer(t, k, serverOpts{tunnelAddr: srv.tunnelAddr})
	srv2.waitServedBy(t, "alpha", "backend", 30*time.Second)
	if got := srv2.tunnels(t)["alpha"].Account; got != "two" {
		t.Errorf("after the reconnect: account %q, want two (the rotated token)", got)
	}
	if c.exited() {
		t.Errorf("client exited")
	}
}

// TestTokenExpiry: a session ends when its token expires; the client keeps
// retrying and is not ready; a fresh token written into the file makes it
// ready again without a restart.
func TestTokenExpiry(t *testing.T) {
	t.Parallel()
	const ttl = 5 * time.Second
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	b := newBackend(t, "backend", nil)
	issued := time.Now()
	tokenFile := writeToken(t, k.issue(t, "alpha", ttl))
	c := startClient(t, srv, clientOpts{tokenFile: tokenFile, routes: []string{"/=" + b.url()}})
	srv.waitServedBy(t, "alpha", "backend", ttl)

	// The session ends when the token expires, or at the latest when the
	// server's clock-skew leeway (30s) has passed too.
	c.waitNotReady(t, ttl+45*time.Second)
	t.Logf("client not ready %v after the token was issued with ttl %v", time.Since(issued).Round(time.Millisecond), ttl)
	// exp is in whole seconds: the token may expire up to 1s before ttl.
	if time.Since(issued) < ttl-time.Second {
		t.Errorf("session ended %v after issue; want it to last until the token expires (%v)", time.Since(issued), ttl)
	}
	// From then on the server refuses the expired token, and says why.
	accepted := srv.metric(t, "tether_logins_accepted_total")
	testutil.WaitFor(t, 30*time.Second, func() error {
		st, err := c.status()
		if err != nil {
			return err
		}
		if !strings.Contains(st.LastError, "expired") {
			return fmt.Errorf("client /status last_error = %q, want the server's refusal: expired "+
				"(meanwhile the server accepted %v more logins with the expired token)",
				st.LastError, srv.metric(t, "tether_logins_accepted_total")-accepted)
		}
		return nil
	})
	if r := srv.mustGet(t, "alpha", "/"); r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != "tunnel_down" {
		t.Errorf("with the token expired: got %d %q, want 503 tunnel_down", r.code, r.header.Get("X-Tether-Error"))
	}
	if code, body, err := c.readyz(); err != nil || code == http.StatusOK {
		t.Errorf("client /readyz = %d %q %v; want not ready", code, body, err)
	}
	if _, ok := srv.tunnels(t)["alpha"]; ok {
		t.Errorf("server still lists alpha with an expired token")
	}

	replaceFile(t, tokenFile, k.issue(t, "alpha", time.Hour)+"\n")
	fresh := time.Now()
	c.waitReady(t, 45*time.Second)
	t.Logf("ready again %v after the fresh token was written", time.Since(fresh).Round(time.Millisecond))
	srv.waitServedBy(t, "alpha", "backend", 10*time.Second)
	if c.exited() {
		t.Errorf("client exited; want it to keep running")
	}
}
