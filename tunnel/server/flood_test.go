package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	wait "github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/gate"
)

// The floods run in a child process (this test binary, told by floodEnv
// what to do), so that the memory the tests measure is the server's alone.
const floodEnv = "TETHER_TEST_FLOOD"

// runFloodChild is the child: it starts the flood, says "started", answers
// each "report" line on stdin with a JSON FloodReport, and closes the
// flood when stdin ends.
func runFloodChild(plan string) int {
	var f wait.Flood
	if err := json.Unmarshal([]byte(plan), &f); err != nil {
		fmt.Fprintln(os.Stderr, "flood child:", err)
		return 2
	}
	conns := f.Start(context.Background())
	defer conns.Close()
	fmt.Println("started")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		r := conns.Report()
		out := struct {
			wait.FloodReport
			FirstError string
		}{FloodReport: r}
		if r.FirstError != nil {
			out.FirstError = r.FirstError.Error()
		}
		b, _ := json.Marshal(out)
		fmt.Println(string(b))
	}
	return 0
}

// floodChild is a running flood in a child process.
type floodChild struct {
	t      *testing.T
	stdin  io.WriteCloser
	stdout *bufio.Scanner
	done   chan error
}

// startFlood runs f from a child process and returns once all its
// connections have made their attack.
func startFlood(t *testing.T, f wait.Flood) *floodChild {
	t.Helper()
	plan, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), floodEnv+"="+string(plan))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &floodChild{t: t, stdin: stdin, stdout: bufio.NewScanner(stdout), done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(c.stop)
	if !c.stdout.Scan() || c.stdout.Text() != "started" {
		t.Fatalf("flood child did not start: %q %v", c.stdout.Text(), c.stdout.Err())
	}
	return c
}

// report asks the child how its connections fare.
func (c *floodChild) report() wait.FloodReport {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, "report\n"); err != nil {
		c.t.Fatalf("ask the flood child: %v", err)
	}
	if !c.stdout.Scan() {
		c.t.Fatalf("flood child did not report: %v", c.stdout.Err())
	}
	var r struct {
		wait.FloodReport
		FirstError string
	}
	if err := json.Unmarshal(c.stdout.Bytes(), &r); err != nil {
		c.t.Fatalf("flood child report %q: %v", c.stdout.Text(), err)
	}
	if r.FirstError != "" {
		r.FloodReport.FirstError = fmt.Errorf("%s", r.FirstError)
	}
	return r.FloodReport
}

// stop ends the flood: the child closes its connections and exits.
func (c *floodChild) stop() {
	_ = c.stdin.Close()
	if err := <-c.done; err != nil && c.t.Context().Err() == nil {
		c.t.Errorf("flood child: %v", err)
	}
	c.done <- nil // a second stop returns at once
}

// serverMemory is the heap in use and the goroutine stacks, after a GC.
func serverMemory() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

// sources are n loopback addresses, each in a /24 of its own, so that only
// the per-address caps apply to them.
func sources(n int) []string {
	var s []string
	for i := range n {
		s = append(s, fmt.Sprintf("127.0.%d.1", 2+i))
	}
	return s
}

// A flood of anonymous connections holds at most gate.AnonymousConnMemory per
// connection the caps admit, whatever it does; what breaks a rule is closed
// at once, and what exceeds the caps is closed before TLS.
func TestAnonymousFloodMemory(t *testing.T) {
	const maxAnonymous, perIP = 96, 16
	s := startServer(t, func(c *Config) { c.MaxAnonymous, c.MaxAnonymousPerIP = maxAnonymous, perIP })
	s.startClient(t, "alpha", backend(t, "alpha").URL)

	// Attacks that break a rule: the connections close at once. From 4
	// addresses, each within its cap.
	for _, f := range []wait.Flood{
		{Attack: wait.AttackStreams, Streams: 2000},
		{Attack: wait.AttackAnnounce},
	} {
		t.Run(string(f.Attack), func(t *testing.T) {
			f.Addr, f.Sources, f.PerSource, f.Budget = s.tunnel, sources(4), perIP, gate.LoginBudget
			flood := startFlood(t, f)
			var r wait.FloodReport
			wait.WaitFor(t, 10*time.Second, func() error {
				if r = flood.report(); r.Open > 0 || r.Failed > 0 {
					return fmt.Errorf("%+v", r)
				}
				return nil
			})
			t.Logf("%d connections, each closed within %v of its attack", r.Conns, r.SlowestClose)
			if r.SlowestClose > 2*time.Second {
				t.Errorf("the slowest connection closed %v after its attack, want at once", r.SlowestClose)
			}
			flood.stop()
		})
	}
	// Each connection is counted once: at its second stream, or for its
	// first stream's announcement, whichever the server read first.
	if got := testutil.ToFloat64(s.metrics.sessionsLimited.WithLabelValues(gate.LimitStreamBeforeLogin)) +
		testutil.ToFloat64(s.metrics.refusedStreams.WithLabelValues("too_large")); got != 2*4*perIP {
		t.Errorf("tether_sessions_closed_by_limit_total{limit=stream_before_login} + tether_streams_refused_total{reason=too_large} = %v, want %d", got, 2*4*perIP)
	}

	// Attacks that stay within the rules and hold what they can until the
	// server's timeouts: from 8 addresses, twice the per-address cap from
	// each, 256 connections for the 72 slots addresses not known may hold
	// (the other quarter is kept for known ones).
	const held = maxAnonymous - maxAnonymous/gate.ReservedDivisor
	refusedOrEvicted := func() float64 {
		return testutil.ToFloat64(s.metrics.connectionsRefused.WithLabelValues(gate.RefusedAnonymous)) +
			testutil.ToFloat64(s.metrics.connectionsRefused.WithLabelValues(gate.RefusedAnonymousPerIP)) +
			testutil.ToFloat64(s.metrics.sessionsLimited.WithLabelValues(gate.LimitEvicted))
	}
	for _, attack := range []wait.Attack{wait.AttackIdle, wait.AttackHello, wait.AttackFrame, wait.AttackHelloFrame, wait.AttackOpening} {
		t.Run(string(attack), func(t *testing.T) {
			wait.WaitFor(t, 15*time.Second, func() error {
				if n := s.gate.Anonymous(); n != 0 {
					return fmt.Errorf("%d anonymous connections left from before", n)
				}
				return nil
			})
			before := serverMemory()
			refused := refusedOrEvicted()
			f := startFlood(t, wait.Flood{Addr: s.tunnel, Sources: sources(8), PerSource: 2 * perIP, Attack: attack, Budget: gate.LoginBudget})
			wait.WaitFor(t, 10*time.Second, func() error {
				r := refusedOrEvicted() - refused
				if n := s.gate.Anonymous(); n != held || r != 256-held {
					return fmt.Errorf("%d anonymous connections held, %v refused or evicted; want %d and %d", n, r, held, 256-held)
				}
				if r := f.report(); r.Open != held {
					return fmt.Errorf("the flood has %d connections open, want %d: %+v", r.Open, held, r)
				}
				return nil
			})
			inUse := serverMemory()
			if r := f.report(); r.Open != held {
				t.Fatalf("%d connections open when the memory was measured, want %d: %+v", r.Open, held, r)
			}
			growth := int64(inUse) - int64(before) //nolint:gosec // memory sizes fit
			t.Logf("%d connections held: %d KiB more in use, %d KiB each", held, growth>>10, growth/held>>10)
			if bound := int64(held * gate.AnonymousConnMemory); growth > bound {
				t.Errorf("%d anonymous connections hold %d KiB, want at most %d KiB (%d KiB each)", held, growth>>10, bound>>10, gate.AnonymousConnMemory>>10)
			}
			f.stop()
		})
	}
	if code, body, _ := s.get(t, "alpha", "/x"); code != 200 {
		t.Errorf("tunnel alpha after the floods: %d %s", code, body)
	}
}
