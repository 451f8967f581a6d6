package gate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	_ "unsafe" // go:linkname, for resetStream

	"github.com/hashicorp/yamux"

	"github.com/tether-dev/tether/tunnel"
)

// How long a dial through a session may go unanswered before the server
// asks, with a ping, whether the session is alive at all. A session whose
// connection died silently (a NAT dropped it, the client's node froze) is
// given up after dialAnswerBound + pingBound instead of after the heartbeat
// timeout, and the request goes to another session of the tunnel; a live
// session whose upstream is slow to accept is waited for as long as the
// router's dial timeout allows.
const (
	dialAnswerBound = time.Second
	pingBound       = time.Second
	// suspectFor is how long a session that failed a ping is tried after
	// the tunnel's other sessions.
	suspectFor = 10 * time.Second
)

// Dial connects to addr, one of the tether client's upstreams, through the
// client: it opens a stream, asks the client to connect, and returns the
// stream once the client has. It is the session router's DialContext.
//
// A failure of the session itself (no stream, no answer to the dial and
// none to a ping, the session ended) is a *SessionError: nothing of the
// request has reached the client, so the caller may send it through another
// session. The client's own answers (refused, not found, ...) are errors of
// the upstream, as a local dial's would be.
//
// The connection it returns reads nothing ahead (WaitReady waits for bytes
// without taking them), and lets go of a large receive buffer as it goes
// idle (Shrink): what proxy.ReadyWaiter and proxy.Shrinker ask.
func (s *Session) Dial(ctx context.Context, _, addr string) (net.Conn, error) {
	stream, err := s.mux.OpenStream()
	if err != nil {
		return nil, s.dialError("open a stream", err)
	}
	if !s.track(stream) {
		_ = stream.Close()
		return nil, s.dialError("open a stream", yamux.ErrSessionShutdown)
	}
	fail := func() {
		_ = stream.Close()
		s.untrack(stream)
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = stream.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = stream.SetDeadline(time.Now()) })
	defer stop()
	var state dialState
	watch := time.AfterFunc(dialAnswerBound, func() { s.checkAnswer(stream, &state) })
	code, msg, err := dialThrough(stream, addr)
	answered := state.CompareAndSwap(dialWaiting, dialAnswered)
	watch.Stop()
	switch {
	case !answered:
		fail()
		return nil, s.dialError("dial "+addr, errors.New("no answer, and no answer to a ping"))
	case err != nil:
		fail()
		if !s.Alive() {
			return nil, s.dialError("dial "+addr, err)
		}
		if ctx.Err() != nil {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
		}
		return nil, fmt.Errorf("dial %s through the tunnel: %w", addr, err)
	case code != tunnel.DialOK:
		fail()
		return nil, dialFailure(addr, code, msg)
	}
	_ = stream.SetDeadline(time.Time{})
	s.dialed.Add(1)
	return &tunnelConn{Conn: stream, stream: stream, sess: s}, nil
}

// dialState is where a dial stands: the dial's answer and the liveness
// check race to leave dialWaiting.
type dialState = atomic.Int32

const (
	dialWaiting int32 = iota
	dialAnswered
	dialAbandoned
)

// checkAnswer runs when a dial has waited dialAnswerBound: it pings the
// session and abandons the dial if no pong comes within pingBound.
func (s *Session) checkAnswer(stream *yamux.Stream, state *dialState) {
	if tunnel.PingWithin(s.mux, pingBound) == nil {
		return
	}
	if state.CompareAndSwap(dialWaiting, dialAbandoned) {
		s.suspectUntil.Store(time.Now().Add(suspectFor).UnixNano())
		_ = stream.SetDeadline(time.Now())
	}
}

func dialThrough(stream net.Conn, addr string) (tunnel.DialCode, string, error) {
	if err := tunnel.WriteDialRequest(stream, addr); err != nil {
		return 0, "", err
	}
	return tunnel.ReadDialReply(stream)
}

// dialFailure turns the client's answer into the error the router explains:
// a net.OpError for what a local dial could have met.
func dialFailure(addr string, code tunnel.DialCode, msg string) error {
	var cause error
	switch code {
	case tunnel.DialRefused:
		cause = syscall.ECONNREFUSED
	case tunnel.DialNotFound:
		host, _, _ := net.SplitHostPort(addr)
		cause = &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	case tunnel.DialUnreachable:
		cause = syscall.EHOSTUNREACH
	case tunnel.DialTimeout:
		cause = os.ErrDeadlineExceeded
	case tunnel.DialNotAllowed:
		return &notAllowedError{addr: addr, msg: msg}
	default:
		cause = errors.New(msg)
	}
	return &net.OpError{Op: "dial", Net: "tcp", Source: nil, Addr: nil, Err: cause}
}

// SessionError is a dial that could not go through the session at all. The
// request has not reached the client, so it may be sent through another
// session; when there is none, the caller learns the tunnel disconnected
// (its Response).
type SessionError struct {
	tunnel, session, step string
	err                   error
}

func (s *Session) dialError(step string, err error) *SessionError {
	return &SessionError{tunnel: s.Tunnel(), session: s.id, step: step, err: err}
}

func (e *SessionError) Error() string {
	return fmt.Sprintf("tunnel %q session %s: %s: %v", e.tunnel, e.session, e.step, e.err)
}

func (e *SessionError) Unwrap() error { return e.err }

// Response says how to answer the request (proxy.ResponseError).
func (e *SessionError) Response() (int, string, string) {
	return (&ClosedError{Tunnel: e.tunnel}).Response()
}

// ClosedError is the end of the tunnel's session under a request.
type ClosedError struct{ Tunnel string }

func (e *ClosedError) Error() string { return fmt.Sprintf("tunnel %q disconnected", e.Tunnel) }

// Response says how to answer the request (proxy.ResponseError): 502
// tunnel_disconnected.
func (e *ClosedError) Response() (int, string, string) {
	return http.StatusBadGateway, "tunnel_disconnected",
		fmt.Sprintf("tether: tunnel %q disconnected during the request; retry", e.Tunnel)
}

// notAllowedError: the client refused an upstream it does not route to,
// which means server and client disagree about the client's routes.
type notAllowedError struct{ addr, msg string }

func (e *notAllowedError) Error() string {
	return fmt.Sprintf("the tunnel client refused to connect to %s: %s", e.addr, e.msg)
}

// Response says how to answer the request (proxy.ResponseError). The
// caller is not told the address: the log has it.
func (e *notAllowedError) Response() (int, string, string) {
	return http.StatusBadGateway, "upstream_not_allowed",
		"tether: the tunnel client refused to connect to the route's upstream: it is not one of its routes"
}

// tunnelConn is a dialed upstream connection inside the session. Once the
// session has ended, its errors say so, so that the router answers "tunnel
// disconnected" rather than blaming the upstream. Closing it resets the
// stream (resetStream).
type tunnelConn struct {
	net.Conn
	stream *yamux.Stream
	sess   *Session
	once   sync.Once
	// unshrunk counts the bytes read since yamux last let go of the
	// stream's receive buffer, which it sizes to what waited unread.
	unshrunk atomic.Int64
}

// shrinkAbove: a stream that has received no more than this since its
// receive buffer was last given back keeps it, for the next response to
// reuse; a larger buffer is given back as the stream goes idle.
const shrinkAbove = 64 << 10

// Close resets the stream: the router closes a stream when it is done with
// it, and nothing the upstream sends after that is read.
func (c *tunnelConn) Close() error {
	c.once.Do(func() {
		resetStream(c.stream)
		c.sess.untrack(c.stream)
		c.sess.dialed.Add(-1)
	})
	return nil
}

// resetStream ends a stream at once, as a TCP reset does: the stream stops
// taking data (frames that still arrive for it are dropped as they come),
// the session forgets it, and the other end gets a RST, on which the
// tether client closes its connection to the upstream.
//
// Closing the stream instead (a FIN) leaves it taking whatever the upstream
// still sends, up to the stream's window (6 MiB, tunnel.MuxConfig), until
// the client closes its end, which it does once the upstream closes: an
// upstream that keeps writing on a connection the router is done with made
// the server hold 6 MiB per stream for yamux's five-minute close timeout.
// hashicorp/yamux v0.1.2 exports no reset; this is its own, the one it
// applies to a stream whose close goes unanswered (StreamCloseTimeout).
// TestTunnelConnResets pins what it does.
//
//go:linkname resetStream github.com/hashicorp/yamux.(*Stream).closeTimeout
func resetStream(s *yamux.Stream)

func (c *tunnelConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.unshrunk.Add(int64(n))
	return n, c.explain(err)
}

func (c *tunnelConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	return n, c.explain(err)
}

// Shrink lets go of the stream's receive buffer (proxy.Shrinker): the router calls it as the stream
// becomes idle. A stream that received more than shrinkAbove since the last
// time has yamux let go of its receive buffer (if it holds nothing unread);
// a smaller one is kept, so that small responses do not allocate a new one
// each.
func (c *tunnelConn) Shrink() {
	if c.unshrunk.Load() > shrinkAbove {
		c.stream.Shrink()
		c.unshrunk.Store(0)
	}
}

// WaitReady waits until the stream has bytes to read (proxy.ReadyWaiter): a yamux stream's Read into
// nothing returns once the stream has bytes to read, or has failed.
func (c *tunnelConn) WaitReady() { _, _ = c.stream.Read(nil) }

func (c *tunnelConn) explain(err error) error {
	if err == nil {
		return err
	}
	select {
	case <-c.sess.Done():
		return &ClosedError{Tunnel: c.sess.Tunnel()}
	default:
		return err
	}
}
