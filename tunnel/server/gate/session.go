package gate

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
)

// Session is one connected tunnel client: a TLS (or websocket) connection
// carrying a yamux session. Its first stream is the frp control connection;
// a stock frpc opens more streams as frp work connections, and for a tether
// client the server opens streams of its own that carry HTTP (Dial).
//
// A session starts anonymous and becomes a tunnel's session when its login
// is verified (Bind); from then on every stream on it belongs to that
// tunnel. lifecycle.go has every state it goes through and who changes it.
// Which sessions serve which tunnel is not the session's to know: the host
// keeps that.
type Session struct {
	// Static after accept (openSession).
	id          string
	remoteAddr  string
	transport   string // "tls" or "wss"
	connectedAt time.Time
	gate        *Gate
	mux         *yamux.Session
	conn        *countingConn
	limits      *connLimits    // what it may send before Bind, and the first limit it went over
	slot        *anonymousSlot // its place among the anonymous connections, given back at Bind or at the end
	accept      *acceptor      // its accept loop, running or parked

	// Owned by the accept loop and the streams' admission (accept.go,
	// admit.go): the streams the client opened that are still open here,
	// the goroutines that read their first message, and whether the first
	// stream's opening has been read.
	clientStreams atomic.Int32
	admitting     sync.WaitGroup
	opened        atomic.Bool

	// Owned by Dial (dial.go): the streams the server opened to the
	// client's upstreams that are still open; a drain waits for them.
	dialed atomic.Int32
	// Written by Dial's answer check and the silence watch, read by the
	// host's choice of a session (Suspect): until then (Unix nanoseconds),
	// other sessions are tried first.
	suspectUntil atomic.Int64

	// Owned by the heartbeat sweep (heartbeat.go).
	beat heartbeat
	// The silence watch's timer (heartbeat.go): made by Bind under mu,
	// reset by the connection's writes, stopped by Close under mu.
	silence *time.Timer
	// Set by the host (OnControlWrite), taken by frp's next write on the
	// control stream (admit.go).
	controlWrite atomic.Pointer[func()]

	// Guarded by mu: the lifecycle and what its transitions decide. Every
	// write is in lifecycle.go.
	mu            sync.Mutex
	phase         phase
	closeReason   string                     // why it is closing; "" before
	clientVersion string                     // set by startLogin
	advertised    *string                    // set by startLogin: the routes a tether client advertised (JSON); nil for a stock frpc
	claims        *auth.Claims               // set by Bind: the verified identity
	runID         string                     // set by Bind: the frp run ID, scoped to the tunnel (auth.ScopedRunID)
	stock         bool                       // set by Bind: a stock frpc, which advertised no routes
	streams       map[*yamux.Stream]struct{} // its open streams, opened by either side, until it closes
	timers        []*time.Timer              // After's, stopped by Close
	loginTimers   []*time.Timer              // untilLogin's, stopped by Bind and Close
	onEnd         []func()                   // OnEnd's, run once it has ended
}

func newSession(g *Gate, id string, conn *countingConn, mux *yamux.Session, transport string) *Session {
	return &Session{
		id:          id,
		remoteAddr:  conn.RemoteAddr().String(),
		transport:   transport,
		connectedAt: time.Now(),
		gate:        g,
		mux:         mux,
		conn:        conn,
		streams:     make(map[*yamux.Stream]struct{}),
	}
}

// ID is the session's ID: 128 random bits as hex, stamped on its login.
func (s *Session) ID() string { return s.id }

// RemoteAddr is the client's address, HOST:PORT.
func (s *Session) RemoteAddr() string { return s.remoteAddr }

// Transport is how the client connected: "tls" or "wss".
func (s *Session) Transport() string { return s.transport }

// ConnectedAt is when the connection's handshake completed.
func (s *Session) ConnectedAt() time.Time { return s.connectedAt }

// Traffic returns the bytes read from the client (in) and written to it
// (out) so far, on the connection.
func (s *Session) Traffic() (in, out uint64) { return s.conn.read.Load(), s.conn.written.Load() }

// ClientStreams is the number of streams the client opened that are still
// open here (MaxClientStreams bounds them).
func (s *Session) ClientStreams() int { return int(s.clientStreams.Load()) }

// Idle reports whether no request is in flight on the session: no stream
// the server dialed through it (a tether client), no frp work connection
// (a stock frpc: its control stream is its one stream then).
func (s *Session) Idle() bool { return s.dialed.Load() == 0 && s.clientStreams.Load() <= 1 }

// Suspect reports whether, at now, a recent dial through the session got
// no answer, or its client did not answer the silence watch's ping: for
// suspectFor after it, other sessions are tried first.
func (s *Session) Suspect(now time.Time) bool { return now.UnixNano() < s.suspectUntil.Load() }

// Done is closed when the session's connection has ended.
func (s *Session) Done() <-chan struct{} { return s.mux.CloseChan() }

// Logger returns the session's logger, which names the tunnel once logged
// in. It is made at each call rather than kept: a session logs a handful of
// lines in its life, and a logger with a field holds a kilobyte of encoded
// fields for as long as it is kept.
func (s *Session) Logger() *zap.Logger {
	if name := s.Tunnel(); name != "" {
		return s.gate.sessionLog.With(zap.String("tunnel", name))
	}
	return s.gate.sessionLog
}

// OnControlWrite runs f once, after frp's next write on the session's
// control stream: once frp has told the client what it decided (a route's
// registration, say).
func (s *Session) OnControlWrite(f func()) { s.controlWrite.Store(&f) }
