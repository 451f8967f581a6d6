package server

import (
	"fmt"
	"net/http"
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

	t.Run("login reusing another tunnel's run ID", func(t *testing.T) {
		c := dialRaw(t, s.tunnel)
		resp, _ := c.login(s.keys.token(t, "beta", time.Hour), "alpha")
		if !strings.Contains(resp.Error, "belongs to another tunnel") {
			t.Fatalf("login answer error %q, want a run ID rejection", resp.Error)
		}
		healthy(t)
	})

	t.Run("work connection in another tunnel's name", func(t *testing.T) {
		c := dialRaw(t, s.tunnel)
		if resp, _ := c.login(s.keys.token(t, "beta", time.Hour), ""); resp.Error != "" {
			t.Fatalf("login of beta: %s", resp.Error)
		}
		before := testutil.ToFloat64(s.metrics.refusedStreams.WithLabelValues("foreign_work_conn"))
		if !c.refused(&msg.NewWorkConn{RunID: "alpha"}) {
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
		if sess, ok := s.registry.Lookup("alpha"); !ok || sess.CloseReason() != "" {
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

// A new login for a tunnel ends the old session at once: a client whose
// connection died silently gets its route back without waiting for a
// heartbeat to expire.
func TestNewLoginReplacesSessionAtOnce(t *testing.T) {
	s := startServer(t)
	first := dialRaw(t, s.tunnel)
	if resp, _ := first.login(s.keys.token(t, "alpha", time.Hour), ""); resp.Error != "" {
		t.Fatalf("first login: %s", resp.Error)
	}
	old, ok := s.registry.Lookup("alpha")
	if !ok {
		t.Fatal("first login did not register tunnel alpha")
	}

	second := dialRaw(t, s.tunnel)
	resp, _ := second.login(s.keys.token(t, "alpha", time.Hour), "alpha")
	if resp.Error != "" {
		t.Fatalf("second login: %s", resp.Error)
	}
	if resp.RunID != "alpha" {
		t.Errorf("run ID %q, want the tunnel name", resp.RunID)
	}
	select {
	case <-old.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the replaced session is still open")
	}
	if cur, ok := s.registry.Lookup("alpha"); !ok || cur == old {
		t.Fatal("tunnel alpha is not served by the new session")
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
	sess, ok := s.registry.Lookup("alpha")
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
		if _, ok := s.registry.Lookup("alpha"); ok {
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
