package gate

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/hashicorp/yamux"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel"
)

// What a user of the gate relies on, seen from its two doors: a Host that
// records every call and leaves the streams it is handed to the test,
// which plays frp on them, and an Observer that counts. No frp server, no
// registry, no HTTP entry: a real gate on loopback, real TLS, and a client
// speaking yamux and frp's messages.

// recordingHost is the rest of the server reduced to what the gate tells
// it. It never blocks the gate.
type recordingHost struct {
	// Set before the gate serves.
	gate *Gate

	// The streams handed over, in order. HandOver refuses one that finds
	// it full (overflow counts it): a test takes each stream it expects.
	handedOver chan handOverCall
	overflow   atomic.Int32

	mu        sync.Mutex
	workConns []bool // WorkConn's v2, per call
	silent    []*Session
	ended     []endedCall
}

// handOverCall is a HandOver call: the stream, as frp reads it, and what the
// session was then.
type handOverCall struct {
	sess  *Session
	conn  net.Conn
	phase phase
}

// endedCall is an Ended call and what the gate showed the host then.
type endedCall struct {
	sess     *Session
	phase    phase
	connGone bool // the session's connection had ended (Done was closed)
	listed   bool // the gate still listed the session (Gate.Session)
}

func newRecordingHost() *recordingHost {
	return &recordingHost{handedOver: make(chan handOverCall, 64)}
}

func (h *recordingHost) HandOver(sess *Session, conn net.Conn) bool {
	select {
	case h.handedOver <- handOverCall{sess: sess, conn: conn, phase: phaseOf(sess)}:
		return true
	default:
		h.overflow.Add(1)
		return false
	}
}

func (h *recordingHost) WorkConn(stream Stream, v2 bool) net.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.workConns = append(h.workConns, v2)
	return stream
}

func (h *recordingHost) Probe(*Session, *msg.Login) ProbeAnswer {
	return ProbeAnswer{Login: msg.LoginResp{Error: "no probes here"}}
}

func (h *recordingHost) Silent(sess *Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.silent = append(h.silent, sess)
}

func (h *recordingHost) Ended(sess *Session) {
	call := endedCall{sess: sess, phase: phaseOf(sess)}
	select {
	case <-sess.Done():
		call.connGone = true
	default:
	}
	_, call.listed = h.gate.Session(sess.ID())
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = append(h.ended, call)
}

// next returns the next stream handed over, waiting up to 10s.
func (h *recordingHost) next(t *testing.T) handOverCall {
	t.Helper()
	select {
	case ho := <-h.handedOver:
		return ho
	case <-time.After(10 * time.Second):
		t.Fatal("no stream handed over within 10s")
		return handOverCall{}
	}
}

// noneHandedOver fails the test if a stream was handed over that the test
// did not take.
func (h *recordingHost) noneHandedOver(t *testing.T, what string) {
	t.Helper()
	select {
	case ho := <-h.handedOver:
		t.Errorf("%s: a stream of session %s reached the host, want none", what, ho.sess.ID())
	default:
	}
}

// endedCalls returns the Ended calls for sess so far.
func (h *recordingHost) endedCalls(sess *Session) []endedCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	var calls []endedCall
	for _, c := range h.ended {
		if c.sess == sess {
			calls = append(calls, c)
		}
	}
	return calls
}

// waitEnded waits until the host has heard that sess ended, and returns
// what it saw then.
func (h *recordingHost) waitEnded(t *testing.T, sess *Session) endedCall {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if len(h.endedCalls(sess)) == 0 {
			return fmt.Errorf("the host has not heard that session %s ended (close reason %q)", sess.ID(), sess.CloseReason())
		}
		return nil
	})
	return h.endedCalls(sess)[0]
}

// waitOneEnded waits until the host has heard that a session ended, and
// returns that session: for a test with one session, which it may never
// have seen listed.
func (h *recordingHost) waitOneEnded(t *testing.T) *Session {
	t.Helper()
	var sess *Session
	testutil.WaitFor(t, 10*time.Second, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.ended) != 1 {
			return fmt.Errorf("the host heard of %d sessions' end, want 1", len(h.ended))
		}
		sess = h.ended[0].sess
		return nil
	})
	return sess
}

// endedTotal is the number of Ended calls so far.
func (h *recordingHost) endedTotal() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ended)
}

func (h *recordingHost) silentCalls(sess *Session) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, s := range h.silent {
		if s == sess {
			n++
		}
	}
	return n
}

func (h *recordingHost) workConnCalls() []bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]bool(nil), h.workConns...)
}

// phaseOf is where sess is in its lifecycle.
func phaseOf(sess *Session) phase {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.phase
}

// reports returns everything the observer was told, by kind and reason.
func (o *fakeObserver) reports() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.counts)
}

// hostGate is a gate serving on loopback, with a recording host.
type hostGate struct {
	*Gate
	addr string
	host *recordingHost
	obs  *fakeObserver
	// stop ends serving, closes every session and waits for the gate:
	// once it returns, the host has heard everything it will.
	stop func()
}

// serveWithHost serves a gate with a recording host, configured as the
// server's defaults but for what mutate changes (nil changes nothing),
// until the test ends (or stop).
func serveWithHost(t *testing.T, mutate ...func(*Config)) *hostGate {
	t.Helper()
	host, obs := newRecordingHost(), &fakeObserver{}
	g := newTestGate(t, host, obs, mutate...)
	host.gate = g
	addr, stop := serveTestGate(t, g)
	t.Cleanup(func() {
		stop()
		if n := host.overflow.Load(); n > 0 {
			t.Errorf("%d streams handed over that the test never took", n)
		}
	})
	return &hostGate{Gate: g, addr: addr, host: host, obs: obs, stop: stop}
}

// anonymousSession waits until c's connection is the gate's one session,
// and returns it. The client pings first: the gate makes the session once
// the client sends something after TLS (it looks for a wss upgrade).
func (g *hostGate) anonymousSession(t *testing.T, c *rawClient) *Session {
	t.Helper()
	if _, err := c.mux.Ping(); err != nil {
		t.Fatalf("ping the gate: %v", err)
	}
	var sess *Session
	testutil.WaitFor(t, 10*time.Second, func() error {
		list := g.Sessions()
		if len(list) != 1 {
			return fmt.Errorf("%d sessions, want 1", len(list))
		}
		sess = list[0]
		return nil
	})
	return sess
}

// logIn logs c in as tunnel name, playing frp: the login handed over is
// bound under runID, and answered. stock is a stock frpc (no routes
// advertised). It returns the session, frp's end of the control stream and
// the client's.
func (g *hostGate) logIn(t *testing.T, c *rawClient, name, runID string, stock bool) (*Session, net.Conn, *yamux.Stream) {
	t.Helper()
	login := &msg.Login{Version: "0.71.0", RunID: "r", Metas: map[string]string{auth.TokenMetaKey: name}}
	if !stock {
		login.Metas[tunnel.RoutesMetaKey] = `["/=http://127.0.0.1:1"]`
	}
	stream := c.open(v1Encode(t, login))
	ho := g.host.next(t)
	if _, err := msg.ReadMsg(ho.conn); err != nil {
		t.Fatalf("frp reads the login: %v", err)
	}
	if err := ho.sess.Bind(&auth.Claims{Tunnel: name}, runID, stock); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	if err := msg.WriteMsg(ho.conn, &msg.LoginResp{RunID: runID}); err != nil {
		t.Fatal(err)
	}
	var resp msg.LoginResp
	if err := readAnswer(stream, &resp); err != nil || resp.RunID != runID {
		t.Fatalf("the client's login answer: %+v, %v; want run ID %q", resp, err, runID)
	}
	return ho.sess, ho.conn, stream
}

// open opens a stream and writes b on it. The write may fail: the gate
// closes a session as soon as it reads what it refuses, and yamux may
// report that, or the connection's reset, before the write's success. What
// the gate did with the stream is the test's to see.
func (c *rawClient) open(b []byte) *yamux.Stream {
	c.t.Helper()
	stream, err := c.mux.OpenStream()
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := stream.Write(b); err != nil {
		c.t.Logf("write on a new stream: %v", err)
	}
	return stream
}

// readAnswer reads a message of m's type from conn, waiting up to 10s.
func readAnswer(conn net.Conn, m msg.Message) error {
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = conn.SetReadDeadline(time.Time{}) }()
	return msg.ReadMsgInto(conn, m)
}

// waitRefused waits until the client sees stream end without an answer.
func waitRefused(t *testing.T, stream net.Conn) {
	t.Helper()
	_ = stream.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := stream.Read(make([]byte, 1))
	if n > 0 || errors.Is(err, yamux.ErrTimeout) {
		t.Fatalf("the refused stream read %d bytes, %v; want it closed without an answer", n, err)
	}
}

// readExactly reads len(want) bytes from conn and compares them.
func readExactly(t *testing.T, what string, conn net.Conn, want []byte) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(conn, got); err != nil {
		t.Fatalf("%s: read %q, then %v; want %q", what, got, err, want)
	}
	_ = conn.SetReadDeadline(time.Time{})
	if string(got) != string(want) {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}
