package server

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tether-dev/tether/internal/testutil"
)

// The heartbeat pings a session once its client has been quiet for the
// whole quiet time, once until that ping is over, and never a session
// whose client pings more often than that.
func TestHeartbeatDue(t *testing.T) {
	const quiet = 40 * time.Second
	t0 := time.Unix(1_000_000, 0)
	var b heartbeat
	for _, step := range []struct {
		read uint64
		at   time.Duration
		want bool
	}{
		{100, 0, false},                // first sight
		{100, 30 * time.Second, false}, // quiet for 30s
		{130, 35 * time.Second, false}, // the client spoke
		{130, 74 * time.Second, false}, // quiet for 39s
		{130, 75 * time.Second, true},  // quiet for 40s: ping
		{130, 80 * time.Second, false}, // the ping is out
	} {
		if got := b.due(step.read, t0.Add(step.at), quiet); got != step.want {
			t.Fatalf("at %v with %d bytes read: due = %v, want %v", step.at, step.read, got, step.want)
		}
	}
	b.pinging.Store(false) // answered: the answer is read
	if b.due(142, t0.Add(81*time.Second), quiet) {
		t.Fatal("due right after the answer was read")
	}

	// A client that pings every 30s, swept every 5s for an hour.
	var c heartbeat
	read := uint64(0)
	for at := time.Duration(0); at < time.Hour; at += 5 * time.Second {
		if at%(30*time.Second) == 0 {
			read += 45
		}
		if c.due(read, t0.Add(at), quiet) {
			t.Fatalf("a client that pings every 30s was due a ping at %v", at)
		}
	}
}

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
	sess := s.waitSessions(t, loadTunnel(0), 1)[0]

	r.frozen.Store(true)
	frozen := time.Now()
	testutil.WaitFor(t, 3*heartbeat, func() error {
		if sess.alive() {
			return errors.New("the session is still open")
		}
		return nil
	})
	took := time.Since(frozen)
	t.Logf("the session closed %v after its path went dark: %s", took.Round(time.Millisecond), sess.CloseReason())
	if slack := time.Second; took > heartbeat+slack {
		t.Errorf("the session closed %v after its path went dark, want within the heartbeat timeout %v (+%v)", took, heartbeat, slack)
	}
	if want := "connection lost: " + describeEnd(yamux.ErrKeepAliveTimeout); sess.CloseReason() != want {
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
	sess := s.waitSessions(t, loadTunnel(0), 1)[0]
	testutil.WaitFor(t, 5*time.Second, func() error {
		if lg.notices.Load() == 0 {
			return errors.New("no hello yet")
		}
		return nil
	})
	wrote := sess.conn.written.Load()
	start := time.Now()
	// Three pings of 12 bytes, each sent after two thirds of the heartbeat
	// timeout of quiet: the session outlived twice the heartbeat timeout.
	testutil.WaitFor(t, 5*heartbeat, func() error {
		if !sess.alive() {
			t.Fatalf("the session closed after %v: %s", time.Since(start), sess.CloseReason())
		}
		if n := sess.conn.written.Load() - wrote; n < 3*muxHeaderSize {
			return fmt.Errorf("the server wrote %d bytes to the quiet client", n)
		}
		return nil
	})
	if took := time.Since(start); took < 2*heartbeat {
		t.Errorf("three pings within %v: the server pinged a client that answered before it was quiet for %v", took, heartbeat*2/3)
	}
}
