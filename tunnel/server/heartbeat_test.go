package server

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// A session whose path went dark while it idled (no request waits on it,
// so the silence watch does not apply) is closed by the heartbeat within
// the heartbeat timeout.
func TestHeartbeatClosesADarkSession(t *testing.T) {
	const heartbeat = 3 * time.Second
	s := startServer(t, func(c *Config) { c.HeartbeatTimeout = heartbeat })
	r := newRelay(t, s.tunnel)
	lg, err := openLoad(t.Context(), loadPlan{Addr: r.addr(), Tunnels: 1, PerTunnel: 1}, s.keys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lg.Close)
	sess := s.waitSessions(t, loadTunnel(0), 1)[0].sess

	r.frozen.Store(true)
	frozen := time.Now()
	testutil.WaitFor(t, 3*heartbeat, func() error {
		if sess.Alive() {
			return errors.New("the session is still open")
		}
		return nil
	})
	took := time.Since(frozen)
	t.Logf("the session closed %v after its path went dark: %s", took.Round(time.Millisecond), sess.CloseReason())
	if slack := time.Second; took > heartbeat+slack {
		t.Errorf("the session closed %v after its path went dark, want within the heartbeat timeout %v (+%v)", took, heartbeat, slack)
	}
	if want := "connection lost: no heartbeat answer (the path to the client froze or the client hung)"; sess.CloseReason() != want {
		t.Errorf("close reason %q, want %q", sess.CloseReason(), want)
	}
}

// A client that never pings, but answers, keeps its session: the server
// pings it each time it has been quiet for long enough.
func TestHeartbeatKeepsAQuietClient(t *testing.T) {
	const heartbeat = 3 * time.Second
	s := startServer(t, func(c *Config) { c.HeartbeatTimeout = heartbeat })
	lg, err := openLoad(t.Context(), loadPlan{Addr: s.tunnel, Tunnels: 1, PerTunnel: 1, NoPings: true}, s.keys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lg.Close)
	sess := s.waitSessions(t, loadTunnel(0), 1)[0].sess
	testutil.WaitFor(t, 5*time.Second, func() error {
		if lg.notices.Load() == 0 {
			return errors.New("no hello yet")
		}
		return nil
	})
	_, wrote := sess.Traffic()
	start := time.Now()
	// Three pings of 12 bytes, each sent after two thirds of the heartbeat
	// timeout of quiet: the session outlived twice the heartbeat timeout.
	testutil.WaitFor(t, 5*heartbeat, func() error {
		if !sess.Alive() {
			t.Fatalf("the session closed after %v: %s", time.Since(start), sess.CloseReason())
		}
		if _, out := sess.Traffic(); out-wrote < 3*muxHeaderSize {
			return fmt.Errorf("the server wrote %d bytes to the quiet client", out-wrote)
		}
		return nil
	})
	if took := time.Since(start); took < 2*heartbeat {
		t.Errorf("three pings within %v: the server pinged a client that answered before it was quiet for %v", took, heartbeat*2/3)
	}
}
