package server

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
)

// Sessions that come and go leave nothing behind: after 1,000 sessions
// have connected, logged in, registered their routes, been told hello and
// disconnected, no goroutine of a session is left, and the process's
// goroutines and live heap are back to what they were after the first
// round, within a small slack. A session that leaked a goroutine, a timer,
// a table entry or one of frp's controls would leave 1,000 of them.
//
// The baseline is taken after a first round as large as the others: what
// grows with the number of sessions open at once and never shrinks (Go
// maps, the runtime's goroutine structures) has grown by then.
func TestSessionChurn(t *testing.T) {
	const (
		rounds    = 4
		tunnels   = 125 // per round, two sessions each: 1,000 sessions in all
		perTunnel = 2
		// Slack for what the process may hold more after the churn than
		// before it, whatever the number of sessions: connections kept
		// alive by HTTP clients, a timer or two of the runtime.
		goroutineSlack = 10
		heapSlack      = 512 << 10 // half a KiB per session
	)
	// Warnings only: the test's log is kept in memory until it ends, and
	// each session would add lines to it.
	s := startServerLog(t, 0, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), func(c *Config) { c.MaxAnonymousPerIP = 1024 })
	churn := func(n int) {
		t.Helper()
		lg, err := openLoad(t.Context(), loadPlan{Addr: s.tunnel, Tunnels: n, PerTunnel: perTunnel, Sources: sources(4)}, s.keys)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(lg.Close) // when a wait below fails
		testutil.WaitFor(t, 30*time.Second, func() error {
			if got, want := lg.notices.Load(), int64(n*perTunnel); got < want {
				return fmt.Errorf("%d of %d sessions have their hello", got, want)
			}
			return nil
		})
		lg.Close()
		testutil.WaitFor(t, 30*time.Second, func() error {
			if n := len(s.gate.Sessions()); n > 0 {
				return fmt.Errorf("the server still has %d sessions", n)
			}
			return nil
		})
	}
	quiet := func(what string) (goroutines int, heap uint64) {
		t.Helper()
		testutil.WaitFor(t, 20*time.Second, func() error {
			if n := sessionGoroutines(); n > 0 {
				return fmt.Errorf("%s: %d goroutines of sessions are left", what, n)
			}
			return nil
		})
		return settled()
	}
	churn(tunnels)
	baseGoroutines, baseHeap := quiet("after the first round")
	start := time.Now()
	for range rounds {
		churn(tunnels)
	}
	t.Logf("%d sessions connected and disconnected in %v", rounds*tunnels*perTunnel, time.Since(start).Round(time.Millisecond))
	goroutines, heap := quiet("after the churn")
	if goroutines > baseGoroutines+goroutineSlack || heap > baseHeap+heapSlack {
		// Connections kept alive may still be closing, collections may
		// still free what ending sessions let go.
		testutil.WaitFor(t, 10*time.Second, func() error {
			if goroutines, heap = settled(); goroutines > baseGoroutines+goroutineSlack || heap > baseHeap+heapSlack {
				return fmt.Errorf("%d goroutines and %d KiB of live heap, %d and %d KiB after the first round",
					goroutines, heap>>10, baseGoroutines, baseHeap>>10)
			}
			return nil
		})
	}
	t.Logf("after the churn: %d goroutines (%+d), live heap %d KiB (%+d KiB)",
		goroutines, goroutines-baseGoroutines, heap>>10, (int64(heap)-int64(baseHeap))>>10) //nolint:gosec // heap sizes fit
}

// sessionMarks are functions that only a session's goroutines run, on
// either end: yamux's loops, frp's control, the gate.
var sessionMarks = []string{
	"hashicorp/yamux.(*Session)",
	"frp/server.(*Control)",
	"frp/pkg/msg.(*Dispatcher)",
	"tunnel/server/gate.(*Gate).serveConn",
	"tunnel/server/gate.(*Gate).admitStream",
	"tunnel/server/gate.(*Gate).heartbeatPing",
	"tunnel/server.(*loadSession)",
}

// sessionGoroutines counts the goroutines running or waiting in a
// session's functions.
func sessionGoroutines() int { return goroutinesIn(sessionMarks...) }

// settled returns the number of goroutines and the live heap after
// collections that also empty the sync.Pools.
func settled() (int, uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), ms.HeapAlloc
}
