package gate

import (
	"errors"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tether-dev/tether/auth"
)

// A session's lifecycle: every state a tunnel connection goes through once
// its handshake is done, and who moves it on. The phase, and what each
// transition decides, are guarded by Session.mu, and every write of them is
// in this file (tunnel/client/status.go keeps the client's sessions the same
// way).
//
//	anonymous ──startLogin──▶ loggingIn ──Bind──▶ bound ──Renew──▶ bound
//	    │                         │                 │
//	    └───────────Close─────────┴──────Close──────┴──▶ closing ──ended──▶ closed
//
// The phases, and who moves a session into each:
//
//   - anonymous: accepted (openSession), waiting for its first stream. It
//     holds a place among the anonymous connections and spends its login
//     budget (limits.go); the gate closes it when no login comes in time
//     (untilLogin's timers) or at a limit.
//   - loggingIn: its login stream went to frp (startLogin, by the stream's
//     admission, admit.go), not verified yet. A second login is refused.
//   - bound: the auth plugin verified the login and the host bound the
//     session (Bind): it belongs to one tunnel for good. Its anonymous place
//     and budget are given back, a tether client's accept loop parks, and
//     its silence watch starts (heartbeat.go). When the host renews its
//     client's token (Renew), it stays bound, by the renewal's claims.
//   - closing: Close was called, with the first reason kept: by the gate
//     (a limit, the heartbeat, a refused stream, frp closing the control
//     stream, the connection's end) or by the host (a newer login replaced
//     it, its client went silent, its token expired, a drain). Its streams
//     stop reading, its timers stop, and no stream is opened on it.
//   - closed: its connection is gone and its streams' admission has ended
//     (ended, by the accept loop's endSession): the host hears of it
//     (Host.Ended) and the OnEnd hooks run, once.
//
// A login probe's session stays anonymous until it closes; a session whose
// login the plugin refused, loggingIn. Bound or not, a session is the
// gate's (Gate.Session) from anonymous until closed.
type phase uint8

const (
	anonymous phase = iota
	loggingIn
	bound
	closing
	closed
)

// startLogin admits the session's one login (anonymous → loggingIn); a
// second login on the same connection is refused, so a session is never
// re-bound to another identity. advertised is what a tether client
// advertised as its routes, nil for a stock frpc.
func (s *Session) startLogin(clientVersion string, advertised *string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.phase != anonymous {
		return false
	}
	s.phase = loggingIn
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
	// ErrBound is a second Bind: the session has logged in already.
	ErrBound = errors.New("this connection has already logged in; open a new connection")
	// ErrClosed is a Bind of a session, or of a connection, that ended.
	ErrClosed = errors.New("the connection closed during login; reconnect")
	// ErrNoLogin is a Bind of a session no login arrived on.
	ErrNoLogin = errors.New("no login arrived on this connection")
)

// Bind makes the session the verified identity's, under its frp run ID
// (loggingIn → bound): from then on every stream on it belongs to
// claims.Tunnel. stock tells a stock frpc (which advertised no routes) from
// a tether client. Only a live connection is bound: a login whose
// connection died on the way must not take over from a session that works,
// and the gate may not have noticed the death yet, so the connection is
// asked too.
func (s *Session) Bind(claims *auth.Claims, runID string, stock bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.phase >= closing || s.mux.IsClosed():
		return ErrClosed
	case s.phase == bound:
		return ErrBound
	case s.phase == anonymous:
		return ErrNoLogin
	}
	s.phase = bound
	s.claims = claims
	s.runID = runID
	s.stock = stock
	s.limits.lift()
	s.slot.loggedIn()
	if !stock && s.accept != nil {
		s.accept.parkLoop() // a tether client opens no more streams
	}
	stopAll(s.loginTimers)
	s.loginTimers = nil
	s.watchSilenceLocked()
	return nil
}

// ErrOtherTunnel is a Renew with the claims of another tunnel than the
// session's.
var ErrOtherTunnel = errors.New("the renewed token is for another tunnel")

// Renew replaces a bound session's claims with those of the renewal of its
// token that the host sent the client (bound → bound): the session then
// lives by the renewal's expiry, is revoked by its jti, and reports it. A
// renewal never moves a session to another tunnel.
func (s *Session) Renew(claims *auth.Claims) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.phase >= closing:
		return ErrClosed
	case s.phase != bound:
		return ErrNoLogin
	case claims.Tunnel != s.claims.Tunnel:
		return ErrOtherTunnel
	}
	s.claims = claims
	return nil
}

// Claims returns the verified identity, or nil before Bind.
func (s *Session) Claims() *auth.Claims {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims
}

// Tunnel is the tunnel name, or "" before Bind.
func (s *Session) Tunnel() string {
	if c := s.Claims(); c != nil {
		return c.Tunnel
	}
	return ""
}

// RunID is the session's frp run ID, or "" before Bind.
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
	return s.stock
}

// Close ends the session for reason (→ closing), once; later calls keep
// the first reason. The connection closes at once.
func (s *Session) Close(reason string) {
	s.beginClose(reason)
	s.interruptReads()
	_ = s.mux.Close()
}

// beginClose moves the session to closing for reason, unless it is closing
// already, and reports whether this call gave the reason: Close follows.
// Its timers stop either way.
func (s *Session) beginClose(reason string) (first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.phase < closing {
		s.phase, s.closeReason, first = closing, reason, true
	}
	stopAll(s.timers)
	stopAll(s.loginTimers)
	if s.silence != nil {
		s.silence.Stop()
	}
	return first
}

func stopAll(timers []*time.Timer) {
	for _, t := range timers {
		t.Stop()
	}
}

// interruptReads makes every read on the session's streams return now.
// While a hashicorp/yamux v0.1.2 session shuts down, a read blocked on one
// of its streams spins until the shutdown reaches that stream: with a few
// hundred streams, that is seconds of every CPU.
func (s *Session) interruptReads() {
	s.mu.Lock()
	streams := make([]*yamux.Stream, 0, len(s.streams))
	for st := range s.streams {
		streams = append(streams, st)
	}
	s.mu.Unlock()
	now := time.Now()
	for _, st := range streams {
		_ = st.SetReadDeadline(now)
	}
}

// CloseReason says why the session closes ("" while it is open).
func (s *Session) CloseReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeReason
}

// Alive reports whether the session is open and its connection has not
// ended, whether or not the gate has noticed yet.
func (s *Session) Alive() bool {
	s.mu.Lock()
	open := s.phase < closing
	s.mu.Unlock()
	return open && !s.mux.IsClosed()
}

// ended moves a closing session to closed, once its connection is gone
// and its streams' admission has ended, and returns the OnEnd hooks for
// the gate to run; nil after the first call.
func (s *Session) ended() []func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.phase == closed {
		return nil
	}
	s.phase = closed
	hooks := s.onEnd
	s.onEnd = nil
	return hooks
}

// After runs f after d unless the session closes first.
func (s *Session) After(d time.Duration, f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.phase >= closing {
		return
	}
	s.timers = append(s.timers, time.AfterFunc(d, f))
}

// untilLogin runs f after d unless the session is bound or closes first.
func (s *Session) untilLogin(d time.Duration, f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.phase >= bound {
		return
	}
	s.loginTimers = append(s.loginTimers, time.AfterFunc(d, f))
}

// OnEnd registers f to run once the session has ended, after the host
// heard of it (Host.Ended); at once if it has ended already.
func (s *Session) OnEnd(f func()) {
	s.mu.Lock()
	if s.phase == closed {
		s.mu.Unlock()
		f()
		return
	}
	defer s.mu.Unlock()
	s.onEnd = append(s.onEnd, f)
}

// track records an open stream of the session. It returns false once the
// session is closing; the caller then closes the stream.
func (s *Session) track(st *yamux.Stream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.phase >= closing {
		return false
	}
	s.streams[st] = struct{}{}
	return true
}

// untrack forgets a stream that was closed.
func (s *Session) untrack(st *yamux.Stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.streams, st)
}
