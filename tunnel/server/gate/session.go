package gate

import (
	"errors"
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
// tunnel. Which sessions serve which tunnel is not the session's to know:
// the host keeps that.
type Session struct {
	id          string
	remoteAddr  string
	transport   string // "tls" or "wss"
	connectedAt time.Time
	gate        *Gate
	mux         *yamux.Session
	conn        *countingConn

	// Set by the gate before the session is shared: the connection's
	// limits, and its place among the anonymous connections. The login
	// budget and the place end at login.
	limits *connLimits
	slot   *anonymousSlot
	accept *acceptor
	// clientStreams counts the streams the client opened that are still
	// open here, and admitting the goroutines that read their first
	// message (admit.go).
	clientStreams atomic.Int32
	admitting     sync.WaitGroup
	// dialed counts the streams the server opened to the client's upstreams
	// (dial.go) that are still open: a drain waits for them to end.
	dialed atomic.Int32
	// streams are the session's open streams, opened by either side.
	streamsMu sync.Mutex
	streams   map[*yamux.Stream]struct{}
	closing   bool
	// opened is set once the first stream's opening has been read.
	opened atomic.Bool
	// suspectUntil (Unix nanoseconds) is set when a dial through the
	// session got no answer: until then other sessions are tried first.
	suspectUntil atomic.Int64
	// silence is the silence watch's timer (heartbeat.go).
	silence *time.Timer
	// beat is the heartbeat's view of the session (watchHeartbeats).
	beat heartbeat
	// controlWrite runs after frp's next write on the control stream
	// (OnControlWrite).
	controlWrite atomic.Pointer[func()]

	mu            sync.Mutex
	loginStarted  bool
	advertised    *string // the routes a tether client advertised (JSON), until login; nil for a stock frpc
	claims        *auth.Claims
	runID         string // frp run ID, scoped to the tunnel (auth.ScopedRunID)
	clientVersion string
	stockClient   bool // a stock frpc, which advertised no routes
	closeReason   string
	timers        []*time.Timer
	loginTimers   []*time.Timer // stopped at login
	onEnd         []func()      // run once the session has ended
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

// Done is closed when the session's connection has ended.
func (s *Session) Done() <-chan struct{} { return s.mux.CloseChan() }

// Close ends the session for reason, once; later calls keep the first reason.
func (s *Session) Close(reason string) {
	s.setCloseReason(reason)
	s.interruptReads()
	_ = s.mux.Close()
}

// track records an open stream of the session. It returns false when the
// session is closing; the caller then closes the stream.
func (s *Session) track(st *yamux.Stream) bool {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.closing {
		return false
	}
	s.streams[st] = struct{}{}
	return true
}

// untrack forgets a stream that was closed.
func (s *Session) untrack(st *yamux.Stream) {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	delete(s.streams, st)
}

// interruptReads makes every read on the session's streams return now.
// While a hashicorp/yamux v0.1.2 session shuts down, a read blocked on one
// of its streams spins until the shutdown reaches that stream: with a few
// hundred streams, that is seconds of every CPU.
func (s *Session) interruptReads() {
	s.streamsMu.Lock()
	s.closing = true
	streams := make([]*yamux.Stream, 0, len(s.streams))
	for st := range s.streams {
		streams = append(streams, st)
	}
	s.streamsMu.Unlock()
	now := time.Now()
	for _, st := range streams {
		_ = st.SetReadDeadline(now)
	}
}

// setCloseReason records why the session ends, unless a reason was given
// before, and reports whether this call gave it. Close follows.
func (s *Session) setCloseReason(reason string) (first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeReason == "" {
		s.closeReason = reason
		first = true
	}
	for _, t := range s.timers {
		t.Stop()
	}
	for _, t := range s.loginTimers {
		t.Stop()
	}
	if s.silence != nil {
		s.silence.Stop()
	}
	return first
}

// CloseReason says why the session ended ("" while it is open).
func (s *Session) CloseReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeReason
}

// Alive reports whether the session is open and its connection has not
// ended, whether or not the gate has noticed yet.
func (s *Session) Alive() bool { return s.CloseReason() == "" && !s.mux.IsClosed() }

// After runs f after d unless the session closes first.
func (s *Session) After(d time.Duration, f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeReason != "" {
		return
	}
	s.timers = append(s.timers, time.AfterFunc(d, f))
}

// untilLogin runs f after d unless the session closes or logs in first.
func (s *Session) untilLogin(d time.Duration, f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeReason != "" || s.claims != nil {
		return
	}
	s.loginTimers = append(s.loginTimers, time.AfterFunc(d, f))
}

// OnEnd registers f to run when the session has ended, after the host
// heard of it (Host.Ended).
func (s *Session) OnEnd(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onEnd = append(s.onEnd, f)
}

// OnControlWrite runs f once, after frp's next write on the session's
// control stream: once frp has told the client what it decided (a route's
// registration, say).
func (s *Session) OnControlWrite(f func()) { s.controlWrite.Store(&f) }

// finish runs the end-of-session hooks; the gate calls it once the session's
// connection is gone.
func (s *Session) finish() {
	s.mu.Lock()
	hooks := s.onEnd
	s.onEnd = nil
	s.mu.Unlock()
	for _, f := range hooks {
		f()
	}
}

// startLogin admits the session's one login; a second login on the same
// connection is refused, so a session is never re-bound to another identity.
// advertised is what a tether client advertised as its routes, nil for a
// stock frpc.
func (s *Session) startLogin(clientVersion string, advertised *string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loginStarted {
		return false
	}
	s.loginStarted = true
	s.clientVersion = clientVersion
	s.advertised = advertised
	return true
}

// AdvertisedRoutes is what a tether client advertised as its routes at
// login (a JSON list of --route specs); nil for a stock frpc.
func (s *Session) AdvertisedRoutes() *string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.advertised
}

// ClientVersion names the client, as its login did: "tether v1.2.3", or
// "frpc 0.71.0".
func (s *Session) ClientVersion() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientVersion
}

// Why Bind refuses.
var (
	// ErrBound: the session has logged in already.
	ErrBound = errors.New("this connection has already logged in; open a new connection")
	// ErrClosed: the session, or its connection, has ended.
	ErrClosed = errors.New("the connection closed during login; reconnect")
)

// Bind makes the session the verified identity's, under its frp run ID:
// from then on every stream on it belongs to claims.Tunnel. stock tells a
// stock frpc (which advertised no routes) from a tether client. Only a
// live connection is bound: a login whose connection died on the way must
// not take over from a session that works, and the gate may not have
// noticed the death yet, so the connection is asked too.
func (s *Session) Bind(claims *auth.Claims, runID string, stock bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.claims != nil:
		return ErrBound
	case s.closeReason != "" || s.mux.IsClosed():
		return ErrClosed
	}
	s.claims = claims
	s.runID = runID
	s.stockClient = stock
	s.limits.lift()
	s.slot.loggedIn()
	if !stock && s.accept != nil {
		s.accept.parkLoop() // a tether client opens no more streams
	}
	for _, t := range s.loginTimers {
		t.Stop()
	}
	s.loginTimers = nil
	s.watchSilenceLocked()
	return nil
}

// Claims returns the verified identity, or nil before login.
func (s *Session) Claims() *auth.Claims {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims
}

// Tunnel is the tunnel name, or "" before login.
func (s *Session) Tunnel() string {
	if c := s.Claims(); c != nil {
		return c.Tunnel
	}
	return ""
}

// RunID is the session's frp run ID, or "" before login.
func (s *Session) RunID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runID
}

// Stock reports whether a stock frpc (which advertises no routes) is on
// the other end; the server reaches it through frp's vhost.
func (s *Session) Stock() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stockClient
}

// Suspect reports whether a recent dial through the session got no
// answer, or its client did not answer the silence watch's ping: until
// suspectFor has passed, other sessions are tried first.
func (s *Session) Suspect(now time.Time) bool { return now.UnixNano() < s.suspectUntil.Load() }
