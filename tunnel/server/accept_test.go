package server

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	wait "github.com/tether-dev/tether/internal/testutil"
)

// Once a tether client has logged in, its session holds no goroutine of
// the gate: the loop that accepts the client's streams parks. It comes
// back when the client opens a stream all the same, and what the stream
// carries is judged as before: here it is no frp message (read as one, its
// header announces exabytes), so the stream is refused and the session
// closed.
func TestAcceptLoopParksAfterLogin(t *testing.T) {
	s := startServer(t)
	lg, err := openLoad(t.Context(), loadPlan{Addr: s.tunnel, Tunnels: 1, PerTunnel: 1}, s.keys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lg.Close)
	sess := s.waitSessions(t, loadTunnel(0), 1)[0].sess
	wait.WaitFor(t, 5*time.Second, func() error {
		if n := goroutinesIn("gate.(*Gate).acceptStreams"); n > 0 {
			return fmt.Errorf("%d accept loops are running", n)
		}
		return nil
	})
	if !sess.Alive() {
		t.Fatalf("the session closed: %s", sess.CloseReason())
	}

	stream, err := lg.sessions[0].mux.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	// The server may end the session before Write returns: what counts is
	// what the server made of it.
	_, _ = stream.Write([]byte("no frp message\n"))
	wait.WaitFor(t, 5*time.Second, func() error {
		if sess.Alive() {
			return errors.New("the session is still open")
		}
		return nil
	})
	if got, want := sess.CloseReason(), "stream refused: too_large"; got != want {
		t.Errorf("close reason %q, want %q", got, want)
	}
	if got := testutil.ToFloat64(s.metrics.refusedStreams.WithLabelValues("too_large")); got != 1 {
		t.Errorf("tether_streams_refused_total{reason=too_large} = %v, want 1", got)
	}
	wait.WaitFor(t, 5*time.Second, func() error {
		if n := len(s.gate.Sessions()); n > 0 {
			return fmt.Errorf("%d sessions are left", n)
		}
		return nil
	})
}

// goroutinesIn counts the goroutines whose stack holds any of fns.
func goroutinesIn(fns ...string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		for _, fn := range fns {
			if strings.Contains(g, fn) {
				count++
				break
			}
		}
	}
	return count
}
