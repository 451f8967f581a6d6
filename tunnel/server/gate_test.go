package server

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/prometheus/client_golang/prometheus/testutil"

	wait "github.com/tether-dev/tether/internal/testutil"
)

// A healthy tunnel keeps serving while another client misbehaves in every
// way the session layer must stop.
func TestHostileClientsCannotTouchAnotherTunnel(t *testing.T) {
	s := startServer(t)
	s.startClient(t, "alpha", backend(t, "alpha").URL)
	healthy := func(t *testing.T) {
		t.Helper()
		if code, body, _ := s.get(t, "alpha", "/x"); code != http.StatusOK || !strings.HasPrefix(body, "alpha /x") {
			t.Fatalf("tunnel alpha: got %d %q, want 200 from alpha's backend", code, body)
		}
	}

	t.Run("login naming another tunnel's run ID", func(t *testing.T) {
		alpha, ok := s.members.lookup("alpha")
		if !ok {
			t.Fatal("tunnel alpha has no session")
		}
		c := dialRaw(t, s.tunnel)
		resp, _ := c.login(s.keys.token(t, "beta", time.Hour), alpha.RunID())
		if resp.Error != "" {
			t.Fatalf("login of beta: %s", resp.Error)
		}
		if want := "beta." + alpha.RunID(); resp.RunID != want {
			t.Errorf("beta's run ID %q, want %q: scoped to beta", resp.RunID, want)
		}
		if reason := alpha.CloseReason(); reason != "" {
			t.Fatalf("alpha's session was closed: %s", reason)
		}
		healthy(t)
	})

	t.Run("work connection in another tunnel's name", func(t *testing.T) {
		c := dialRaw(t, s.tunnel)
		if resp, _ := c.login(s.keys.token(t, "beta", time.Hour), ""); resp.Error != "" {
			t.Fatalf("login of beta: %s", resp.Error)
		}
		alpha, ok := s.members.lookup("alpha")
		if !ok {
			t.Fatal("tunnel alpha has no session")
		}
		before := testutil.ToFloat64(s.metrics.refusedStreams.WithLabelValues("foreign_work_conn"))
		if !c.refused(&msg.NewWorkConn{RunID: alpha.RunID()}) {
			t.Fatal("a work connection naming tunnel alpha, sent on beta's session, was not refused")
		}
		if got := testutil.ToFloat64(s.metrics.refusedStreams.WithLabelValues("foreign_work_conn")); got != before+1 {
			t.Errorf("tether_streams_refused_total{reason=foreign_work_conn} = %v, want %v", got, before+1)
		}
		healthy(t)
	})

	t.Run("work connection before login", func(t *testing.T) {
		c := dialRaw(t, s.tunnel)
		if !c.refused(&msg.NewWorkConn{RunID: "alpha"}) {
			t.Fatal("a work connection on an anonymous session was not refused")
		}
		healthy(t)
	})

	t.Run("visitor connection", func(t *testing.T) {
		c := dialRaw(t, s.tunnel)
		if resp, _ := c.login(s.keys.token(t, "gamma", time.Hour), ""); resp.Error != "" {
			t.Fatalf("login of gamma: %s", resp.Error)
		}
		if !c.refused(&msg.NewVisitorConn{RunID: "gamma", ProxyName: "alpha"}) {
			t.Fatal("a visitor connection to alpha's proxy was not refused")
		}
		healthy(t)
	})

	t.Run("second login on one connection", func(t *testing.T) {
		c := dialRaw(t, s.tunnel)
		if resp, _ := c.login(s.keys.token(t, "delta", time.Hour), ""); resp.Error != "" {
			t.Fatalf("login of delta: %s", resp.Error)
		}
		if !c.refused(&msg.Login{Metas: map[string]string{"token": s.keys.token(t, "alpha", time.Hour)}}) {
			t.Fatal("a second login on a logged-in connection was not refused")
		}
		if sess, ok := s.members.lookup("alpha"); !ok || sess.CloseReason() != "" {
			t.Fatal("tunnel alpha lost its session")
		}
		healthy(t)
	})

	t.Run("garbage first message", func(t *testing.T) {
		c := dialRaw(t, s.tunnel)
		stream, err := c.mux.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		_, _ = stream.Write([]byte("GET / HTTP/1.1\r\nHost: alpha.tunnels.test\r\n\r\n"))
		_ = stream.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, _ := stream.Read(make([]byte, 1)); n != 0 {
			t.Fatal("the server answered a stream that did not start with an frp message")
		}
		healthy(t)
	})
}

// A new login with a session's run ID ends that session at once: a client
// whose connection died silently gets its route back without waiting for a
// heartbeat to expire. A login with another run ID joins the tunnel beside
// it.
func TestNewLoginReplacesSessionAtOnce(t *testing.T) {
	s := startServer(t)
	first := dialRaw(t, s.tunnel)
	if resp, _ := first.login(s.keys.token(t, "alpha", time.Hour), "0f3a9c21-0"); resp.Error != "" || resp.RunID != "alpha.0f3a9c21-0" {
		t.Fatalf("first login: error %q, run ID %q; want alpha.0f3a9c21-0", resp.Error, resp.RunID)
	}
	old, ok := s.members.lookup("alpha")
	if !ok {
		t.Fatal("first login did not register tunnel alpha")
	}

	other := dialRaw(t, s.tunnel)
	if resp, _ := other.login(s.keys.token(t, "alpha", time.Hour), "0f3a9c21-1"); resp.Error != "" {
		t.Fatalf("login with another run ID: %s", resp.Error)
	}
	if len(s.members.sessionsOf("alpha")) != 2 || old.CloseReason() != "" {
		t.Fatalf("a login with another run ID replaced the first session (%q)", old.CloseReason())
	}

	second := dialRaw(t, s.tunnel)
	resp, _ := second.login(s.keys.token(t, "alpha", time.Hour), "alpha.0f3a9c21-0")
	if resp.Error != "" {
		t.Fatalf("second login: %s", resp.Error)
	}
	if resp.RunID != "alpha.0f3a9c21-0" {
		t.Errorf("run ID %q, want the first session's", resp.RunID)
	}
	select {
	case <-old.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the replaced session is still open")
	}
	if list := s.members.sessionsOf("alpha"); len(list) != 2 || slices.Contains(list, old) {
		t.Fatalf("tunnel alpha's sessions after the replacement: %d, the old one among them: %v", len(list), slices.Contains(list, old))
	}
	if got := testutil.ToFloat64(s.metrics.sessionsReplaced); got != 1 {
		t.Errorf("tether_sessions_replaced_total = %v, want 1", got)
	}
}

// A connection that never logs in is closed after LoginTimeout.
func TestAnonymousConnectionIsClosed(t *testing.T) {
	s := startServer(t, func(c *Config) { c.LoginTimeout = 300 * time.Millisecond })
	c := dialRaw(t, s.tunnel)
	if _, err := c.mux.OpenStream(); err != nil { // a stream, but never a login
		t.Fatal(err)
	}
	select {
	case <-c.mux.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("an anonymous connection outlived the login timeout")
	}
}

// A session lives no longer than its token (plus the verifier's leeway,
// here none).
func TestSessionEndsWhenTokenExpires(t *testing.T) {
	s := startServerLeeway(t, -1)
	c := dialRaw(t, s.tunnel)
	if resp, _ := c.login(s.keys.token(t, "alpha", 2*time.Second), ""); resp.Error != "" {
		t.Fatalf("login: %s", resp.Error)
	}
	sess, ok := s.members.lookup("alpha")
	if !ok {
		t.Fatal("tunnel alpha not registered")
	}
	select {
	case <-c.mux.CloseChan():
	case <-time.After(10 * time.Second):
		t.Fatal("the session outlived its token")
	}
	if got := sess.CloseReason(); got != "token expired" {
		t.Errorf("close reason %q, want %q", got, "token expired")
	}
	wait.WaitFor(t, 5*time.Second, func() error {
		if _, ok := s.members.lookup("alpha"); ok {
			return fmt.Errorf("tunnel alpha still registered")
		}
		return nil
	})
}

// Connections that are not TLS are dropped without disturbing anyone.
func TestPlainTCPIsDropped(t *testing.T) {
	s := startServer(t)
	s.startClient(t, "alpha", backend(t, "alpha").URL)
	resp, err := http.Get("http://" + s.tunnel + "/")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("plain HTTP to the tunnel listener got %s, want the connection dropped", resp.Status)
	}
	if code, _, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
		t.Fatalf("tunnel alpha: %d after a plain-TCP visitor", code)
	}
}
