package server

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
)

// Session is one connected tunnel client: a TLS (or websocket) connection
// carrying a yamux session. Its first stream is the frp control connection;
// a stock frpc opens more streams as frp work connections, and for a tether
// client the server opens streams of its own that carry HTTP (dial.go).
//
// A session starts anonymous and becomes a tunnel's session when its login
// is verified (bind); from then on every stream on it belongs to that
// tunnel. It serves requests once frp has registered its route (serve),
// until the route goes, the session is retired by a drain, or it ends.
type Session struct {
	id          string
	remoteAddr  string
	transport   string // "tls" or "wss"
	connectedAt time.Time
	mux         *yamux.Session
	conn        *countingConn
	baseLog     *zap.Logger // see logger

	// Set by the gate before the session is shared: the connection's
	// limits, and its place among the anonymous connections. The login
	// budget and the place end at login.
	limits *connLimits
	slot   *anonymousSlot
	accept *acceptor
	// clientStreams counts the streams the client opened that are still
	// open here, and admitting the goroutines that read their first
	// message (gate.go).
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
	// retired is set when a draining server stops sending the session new
	// requests because its tunnel is served elsewhere.
	retired atomic.Bool
	// routePending is set while a stock frpc's route is registered in the
	// auth plugin but not yet in frp's vhost: the session serves once frp
	// has answered the client (its next write on the control stream).
	routePending atomic.Bool
	// suspectUntil (Unix nanoseconds) is set when a dial through the
	// session got no answer: until then other sessions are tried first.
	suspectUntil atomic.Int64
	// The silence watch (watchSilence): its timer, and what to do about a
	// client that went silent.
	silence   *time.Timer
	onSilence func(*Session)
	// beat is the heartbeat's view of the session (watchHeartbeats).
	beat heartbeat

	// requests counts the requests routed to this session by status class:
	// index 1..5 for 1xx..5xx, index 0 for requests that failed before any
	// response.
	requests [6]atomic.Uint64

	mu            sync.Mutex
	loginStarted  bool
	advertised    *string // the routes a tether client advertised (JSON), until login; nil for a stock frpc
	claims        *auth.Claims
	runID         string // frp run ID, scoped to the tunnel (auth.ScopedRunID)
	loggedInAt    time.Time
	clientVersion string
	stockClient   bool // a stock frpc, which advertised no routes
	handler       sessionHandler
	route         string // the registered frp proxy name; "" while none
	closeReason   string
	timers        []*time.Timer
	loginTimers   []*time.Timer // stopped at login
	onEnd         []func()      // run once the session has ended
}

func newSession(id string, conn *countingConn, mux *yamux.Session, transport string, log *zap.Logger) *Session {
	return &Session{
		id:          id,
		remoteAddr:  conn.RemoteAddr().String(),
		transport:   transport,
		connectedAt: time.Now(),
		mux:         mux,
		conn:        conn,
		baseLog:     log,
		streams:     make(map[*yamux.Stream]struct{}),
	}
}

// logger returns the session's logger, which names the tunnel once logged
// in. It is made at each call rather than kept: a session logs a handful of
// lines in its life, and a logger with a field holds a kilobyte of encoded
// fields for as long as it is kept.
func (s *Session) logger() *zap.Logger {
	if name := s.Tunnel(); name != "" {
		return s.baseLog.With(zap.String("tunnel", name))
	}
	return s.baseLog
}

// Done is closed when the session has ended.
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

// alive reports whether the session is open and its connection has not
// ended, whether or not the gate has noticed yet.
func (s *Session) alive() bool { return s.CloseReason() == "" && !s.mux.IsClosed() }

// after runs f after d unless the session closes first.
func (s *Session) after(d time.Duration, f func()) {
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

// atEnd registers f to run when the session has ended.
func (s *Session) atEnd(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onEnd = append(s.onEnd, f)
}

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

// advertisedRoutes is what startLogin was given.
func (s *Session) advertisedRoutes() *string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.advertised
}

// bind makes the session the verified identity's, under its frp run ID.
// stock tells a stock frpc (which advertised no routes) from a tether
// client, and handler is how requests will reach the client.
func (s *Session) bind(claims *auth.Claims, runID string, stock bool, handler sessionHandler) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claims != nil || s.closeReason != "" {
		return false
	}
	s.claims = claims
	s.runID = runID
	s.stockClient = stock
	s.handler = handler
	s.loggedInAt = time.Now()
	s.limits.lift()
	s.slot.loggedIn()
	if !stock && s.accept != nil {
		s.accept.parkLoop() // a tether client opens no more streams
	}
	for _, t := range s.loginTimers {
		t.Stop()
	}
	s.loginTimers = nil
	return true
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

// stock reports whether a stock frpc (which advertises no routes) is on the
// other end; it is reached through frp's vhost.
func (s *Session) stock() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stockClient
}

// setRoute records the session's route; a session has at most one.
func (s *Session) setRoute(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.route != "" && s.route != name {
		return false
	}
	s.route = name
	return true
}

// clearRoute forgets the route name, and reports whether it was the
// session's.
func (s *Session) clearRoute(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.route != name {
		return false
	}
	s.route = ""
	return true
}

// serving returns the session's handler while it serves requests: logged
// in, its route registered, not closed.
func (s *Session) serving() (sessionHandler, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.route == "" || s.closeReason != "" || s.handler == nil {
		return nil, false
	}
	return s.handler, true
}

// closeIdle closes the idle streams its handler keeps for later requests.
func (s *Session) closeIdle() {
	s.mu.Lock()
	h := s.handler
	s.mu.Unlock()
	if h != nil {
		h.CloseIdle()
	}
}

// How fast the server notices a client that went silent while it has
// something to say (see watchSilence). A client answers within a round
// trip: a response, a window update as it reads what it was sent, a ping's
// answer. Silence only triggers a ping; only the ping's bound decides, and
// it is seconds, so that a slow or saturated link is not taken for a dead
// one.
const (
	silenceBound = time.Second
	silencePing  = 2 * time.Second
)

// watchSilence makes the session notice, within silenceBound + silencePing
// of sending something, a client that no longer answers (a NAT dropped the
// connection, the client's node froze), instead of after the heartbeat
// timeout: once something written to the client has gone unanswered (no
// byte read since) for silenceBound, a ping must be answered within
// silencePing, or onSilent is called. A request written on a pooled stream
// of such a session would otherwise wait for an answer until the heartbeat
// timeout.
//
// Only what a request may be waiting for is watched: a write while one of
// the session's streams other than its control stream is open (a dialed
// upstream connection, pooled or in use, or a stock frpc's work
// connection), or any write of a stock frpc's session, which frp may ask
// for a work connection on its control stream. A new dial watches its own
// answer (dial.go). The rest, an idle session's answers to its client's
// pings and control messages, awaits nothing, and arms no timer.
func (s *Session) watchSilence(onSilent func(*Session)) {
	stock := s.stock()
	s.mu.Lock()
	s.onSilence = onSilent
	s.silence = time.AfterFunc(time.Hour, s.checkSilence)
	s.silence.Stop()
	s.mu.Unlock()
	s.conn.watch(func() { s.armSilence(stock) })
}

// armSilence runs when a write starts to wait for an answer.
func (s *Session) armSilence(stock bool) {
	if !stock && s.dialed.Load() == 0 && s.clientStreams.Load() <= 1 {
		// Awaits nothing: taken as answered, so that the next write is
		// looked at again.
		s.conn.unanswered.Store(0)
		return
	}
	s.silence.Reset(silenceBound)
}

func (s *Session) checkSilence() {
	since := s.conn.unanswered.Load()
	switch {
	case since == 0 || !s.alive():
		return // answered
	case time.Since(time.Unix(0, since)) < silenceBound:
		// Answered, and written to again since.
		s.silence.Reset(silenceBound - time.Since(time.Unix(0, since)))
		return
	}
	if tunnel.PingWithin(s.mux, silencePing) != nil && s.alive() {
		s.suspectUntil.Store(time.Now().Add(suspectFor).UnixNano())
		s.onSilence(s)
		return
	}
	// The client answered the ping: it is alive, and what it was sent is
	// still on its way or being worked on.
	s.conn.unanswered.Store(0)
}

// suspect reports whether a recent dial through the session got no answer.
func (s *Session) suspect(now time.Time) bool { return now.UnixNano() < s.suspectUntil.Load() }

// The server's side of the heartbeat. yamux would ping every session from
// a goroutine of its own, every third of the heartbeat timeout, whatever
// the client sends. The server instead looks at all its sessions at once,
// heartbeatSweeps times per heartbeat timeout, and pings only a session
// from which nothing was read for two thirds of it, and closes it when the
// ping is not answered within a quarter of it. A tether client pings every
// two thirds of its own heartbeat timeout, 10s by default (tunnel.KeepAlive),
// and the sweep notes a read up to a sweep after it came, so it pings such
// a session only when a client's ping comes late; frpc pings every 30s. An idle session of a client that pings
// thus costs the server no goroutine, no timer and no ping of its own, and
// a dead client is still noticed within the heartbeat timeout: two thirds
// of it silent, at most a sweep more to see it, a quarter for the answer.
const heartbeatSweeps = 12

// heartbeat is what the sweep knows of a session.
type heartbeat struct {
	// Touched by the sweep only: the bytes read from the client at the
	// sweep that last saw them change, and when.
	read  uint64
	since time.Time
	// pinging is set while the sweep's ping is out.
	pinging atomic.Bool
}

// due reports whether a session whose client has sent read bytes so far
// must be pinged at now: nothing read for quiet, and no ping out.
func (b *heartbeat) due(read uint64, now time.Time, quiet time.Duration) bool {
	if read != b.read || b.since.IsZero() {
		b.read, b.since = read, now
		return false
	}
	return now.Sub(b.since) >= quiet && b.pinging.CompareAndSwap(false, true)
}

// watchHeartbeats pings the sessions whose clients went quiet, and closes
// those that do not answer, until ctx ends.
func (s *serving) watchHeartbeats(ctx context.Context) {
	tick := time.NewTicker(s.cfg.HeartbeatTimeout / heartbeatSweeps)
	defer tick.Stop()
	quiet := s.cfg.HeartbeatTimeout * 2 / 3
	var due []*Session
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case now = <-tick.C:
		}
		due = due[:0]
		s.sessions.each(func(sess *Session) {
			if sess.beat.due(sess.conn.read.Load(), now, quiet) {
				due = append(due, sess)
			}
		})
		for _, sess := range due {
			s.pings.Go(func() { s.heartbeatPing(sess) })
		}
		clear(due)
	}
}

// heartbeatPing pings a quiet session, and closes it when its client does
// not answer within a quarter of the heartbeat timeout.
func (s *serving) heartbeatPing(sess *Session) {
	defer sess.beat.pinging.Store(false)
	if tunnel.PingWithin(sess.mux, s.cfg.HeartbeatTimeout/4) != nil && sess.alive() {
		sess.Close("connection lost: " + describeEnd(yamux.ErrKeepAliveTimeout))
	}
}
