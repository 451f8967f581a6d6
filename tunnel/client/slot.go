package client

import (
	"bufio"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/fatedier/frp/pkg/config/v1"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
)

const (
	// minReconnectDelay is the first delay of a slot's backoff.
	minReconnectDelay = 200 * time.Millisecond
	// maxRedials bounds how many times in a row a slot leaves a replica
	// another slot holds at once, closing the session that landed there:
	// behind an address with one replica, or fewer replicas than slots,
	// some slots must share one. A slot left sharing keeps trying, with a
	// session opened beside the shared one (spreading, status.go).
	maxRedials = 3
	// streamPeek is the read buffer in front of a server-opened stream: it
	// holds the first byte that tells a notice from a dial request, and a
	// dial request of a usual length, before the stream carries bytes.
	streamPeek = 256
	// leaveGrace bounds how long a session that gave its slot over to
	// another waits for its connections to end: the server sends it no new
	// request once its route is withdrawn, and closes its idle streams
	// within 30 s.
	leaveGrace = 60 * time.Second
	// leaveCheck is how often a leaving session looks at its connections.
	leaveCheck = 250 * time.Millisecond
)

// A slot is one of the client's Connections: it keeps one session to the
// server up with its own reconnect loop, backoff and jitter. Every session
// of a slot logs in with one of the slot's two run IDs and registers the
// route named after it, so that a session that replaces a lost one (a NAT
// dropped the connection) replaces it on the server at once, and a
// replacement made for a move registers the same route on another replica.
// The other run ID is for a session opened beside the slot's own, to leave
// a replica the slot shares with another: wherever it lands, it replaces
// nothing; when it takes the slot over, its run ID becomes the slot's.
type slot struct {
	c      *Client
	index  int
	runIDs [2]string             // "<instance>-<index>", "<instance>-<index>b"
	routes [2]v1.ProxyConfigurer // http proxies "<tunnel>.<runID>" at subdomain <tunnel>
	log    *zap.Logger
}

func newSlot(c *Client, index int) *slot {
	s := &slot{c: c, index: index, log: c.log.With(zap.Int("slot", index))}
	for i, suffix := range []string{"", "b"} {
		s.runIDs[i] = c.instance + "-" + strconv.Itoa(index) + suffix
		s.routes[i] = frpRouteConfig(c.tunnel, s.runIDs[i])
	}
	return s
}

// session is one connection of a slot, from connect until its serve ends.
type session struct {
	mux   *yamux.Session
	state *sessionState
	// dials counts the upstream connections it carries (dial requests
	// being served).
	dials atomic.Int32
	ended chan outcome // receives serve's outcome; room for it
}

// outcome is how a session of a slot ended, for the slot's next step.
type outcome struct {
	loggedIn bool // the login succeeded
	moved    bool // the server asked it to move, or it gave its slot over: the replacement runs
	redial   bool // the client closed it to land on another replica: again at once
}

// run keeps the slot connected until ctx ends. After a session that logged
// in, the next attempt comes at once (jittered by up to 200ms, so that the
// clients of a restarted server do not return in lockstep); after each
// failure the delay doubles up to MaxReconnectDelay. A session that moves or
// leaves a shared replica is replaced at once, without a delay.
//
// While the slot's session shares its replica with another slot's, on a
// server with other replicas, the slot opens spreading sessions beside it
// when status plans them (make-before-break): one that reaches a replica no
// other slot holds takes the slot over, and the shared one leaves.
func (s *slot) run(ctx context.Context) {
	var sessions sync.WaitGroup
	defer sessions.Wait()
	delay := minReconnectDelay
	var cur, spreading *session
	for {
		if cur == nil && spreading != nil {
			// The slot's session ended or moves away first: the spreading
			// one is the slot's now, wherever it landed.
			cur, spreading = spreading, nil
			s.c.status.onAdopted(cur.state)
		}
		if cur == nil {
			if cur = s.connect(ctx, &sessions, false); cur == nil {
				if !s.pause(ctx, &delay) {
					return
				}
				continue
			}
		}
		var spread <-chan time.Time
		var timer *time.Timer
		if spreading == nil {
			if at, ok := s.c.status.planSpread(s.index); ok {
				timer = time.NewTimer(time.Until(at))
				spread = timer.C
			}
		}
		var spreadEnded <-chan outcome
		var kept <-chan struct{}
		if spreading != nil {
			spreadEnded, kept = spreading.ended, spreading.state.kept
		}
		select {
		case <-ctx.Done():
		case o := <-cur.ended:
			cur = nil
			switch {
			case o.moved || o.redial:
				delay = minReconnectDelay
			case spreading != nil:
			default:
				if o.loggedIn {
					delay = minReconnectDelay
				}
				if !s.pause(ctx, &delay) {
					return
				}
			}
		case <-cur.state.moveNow:
			cur, delay = nil, minReconnectDelay // it serves on: the replacement starts now
		case <-spread:
			spreading = s.connect(ctx, &sessions, true)
		case <-spreadEnded:
			spreading = nil
		case <-kept:
			cur, spreading = spreading, nil // the shared session leaves by itself
		case <-s.c.status.wake(s.index):
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// pause waits the jittered delay before the next attempt, and doubles the
// delay up to MaxReconnectDelay. It reports false when ctx ended first.
func (s *slot) pause(ctx context.Context, delay *time.Duration) bool {
	wait := *delay/2 + rand.N(*delay/2+1) //nolint:gosec // jitter, not a secret
	s.log.Debug("next connection attempt", zap.Duration("in", wait))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	*delay = min(2**delay, s.c.cfg.MaxReconnectDelay)
	return true
}

// connect makes one session of the slot, a spreading one when spreading is
// set, and serves it in sessions until it ends: its outcome then arrives on
// its ended channel. It returns nil when the connection failed. The client
// never closes a session told to move: the draining server knows when its
// last request has finished.
func (s *slot) connect(ctx context.Context, sessions *sync.WaitGroup, spreading bool) *session {
	conn, via, err := s.c.dial(ctx)
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case spreading:
			s.c.status.onSpreadFailed(s.index, err)
			s.log.Info("connect to reach another server replica failed; the session on the shared one serves on", zap.Error(err))
		default:
			s.c.status.onFailed(s.index, nil, err)
			s.log.Warn("connect to tunnel server failed; retrying", zap.Error(err))
		}
		return nil
	}
	mux, err := yamux.Client(tunnel.CoalesceFrames(conn, gathererOf(conn)), tunnel.MuxConfig(s.c.cfg.HeartbeatTimeout, s.log))
	if err != nil {
		_ = conn.Close()
		if spreading {
			s.c.status.onSpreadFailed(s.index, err)
		} else {
			s.c.status.onFailed(s.index, nil, err)
		}
		return nil
	}
	sess := &session{mux: mux, state: s.c.status.onConnected(s.index, via, spreading), ended: make(chan outcome, 1)}
	sessions.Go(func() { sess.ended <- s.serve(ctx, sess) })
	return sess
}

// serveStreams answers the streams the server opens, until the session
// ends, and waits for their connections to end.
func (s *slot) serveStreams(sess *session) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		stream, err := sess.mux.AcceptStream()
		if err != nil {
			return
		}
		conns.Go(func() { s.serveStream(sess, stream) })
	}
}

// serveStream tells a notice from a dial request by the stream's first
// byte, and reads the notice or answers the dial request.
func (s *slot) serveStream(sess *session, stream net.Conn) {
	_ = stream.SetReadDeadline(time.Now().Add(dialRequestTimeout))
	br := bufio.NewReaderSize(stream, streamPeek)
	first, err := br.Peek(1)
	if err != nil {
		_ = stream.Close()
		s.log.Debug("stream closed before its first byte", zap.Error(err))
		return
	}
	if !tunnel.IsNotice(first[0]) {
		// The dial path reads the request, and then the stream's bytes,
		// through br: what it buffered is not lost.
		sess.dials.Add(1)
		defer sess.dials.Add(-1)
		s.c.upstreams.serve(&peekedConn{Conn: stream, r: br}, s.log)
		return
	}
	n, err := tunnel.ReadNotice(br)
	_ = stream.Close()
	if err != nil {
		s.log.Debug("unreadable notice", zap.Error(err))
		return
	}
	s.onNotice(sess, n)
}

// onNotice acts on what the server says about session sess.
func (s *slot) onNotice(sess *session, n tunnel.Notice) {
	ss := sess.state
	log := s.log.With(zap.String("replica", n.Replica), zap.String("session", n.Session))
	switch n.Kind {
	case tunnel.NoticeHello:
		tries := maxRedials
		if n.Alone {
			tries = 0 // there is no other replica to reach
		}
		l := s.c.status.onHello(ss, n.Replica, n.Session, n.Alone, tries)
		switch {
		case l.spreading && l.leave:
			log.Debug("session opened to leave a shared replica landed on one another slot holds; the shared one serves on")
			_ = sess.mux.Close()
		case l.spreading:
			log.Info("session reached a replica no other slot holds; the slot's session on the shared one leaves once this one serves")
		case l.leave:
			// Sessions behind one address spread over its replicas only if
			// a slot that lands where another already is tries again.
			log.Info("session landed on a replica another slot holds; reconnecting to reach another", zap.Int("held_by_slot", l.holder))
			_ = sess.mux.Close()
		case l.holder >= 0 && n.Alone:
			log.Info("session on the server's only replica, beside another slot", zap.Int("held_by_slot", l.holder))
		case l.holder >= 0:
			log.Info("session shares its replica with another slot: it serves, and the slot keeps trying to reach another replica",
				zap.Int("held_by_slot", l.holder), zap.Int("tries", maxRedials))
		case l.left != "":
			log.Info("session on server replica, after leaving one another slot holds", zap.String("left_replica", l.left))
		default:
			log.Info("session on server replica")
		}
	case tunnel.NoticeMove:
		first, now := s.c.status.onMove(ss)
		switch {
		case !first:
		case now:
			log.Info("server replica drains: starting a replacement session; this one serves until the server closes it")
		default:
			log.Info("server replica drains: the replacement session starts once the slot's earlier move has finished")
		}
	case tunnel.NoticeToken:
		s.onRenewal(n.Token, log)
	default:
		log.Debug("unknown notice ignored", zap.String("kind", n.Kind))
	}
}

// onRenewal takes a renewed token the server sent, for every later login
// of the client, and keeps it in --renewed-token-file. The token is never
// logged: its jti and times are.
func (s *slot) onRenewal(raw string, log *zap.Logger) {
	tok, err := s.c.tokens.onRenewal(raw)
	switch {
	case errors.Is(err, errNotNewer):
		log.Debug("renewed token ignored", zap.Error(err))
		return
	case err != nil:
		log.Warn("renewed token from the server ignored", zap.Error(err))
		return
	}
	log.Info("token renewed: later logins use it", zap.String("jti", tok.Claims.ID),
		zap.Time("expires_at", tok.Claims.ExpiresAt), zap.String("renews", tok.Claims.Renews))
	if err := s.c.tokens.keep(); err != nil {
		log.Warn("renewed token not kept: a restart of the client logs in with --token-file's token", zap.Error(err))
	}
}

// peekedConn is a stream whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
