package client

import (
	"bufio"
	"context"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
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
	// another slot holds: behind an address with one replica, or fewer
	// replicas than slots, some slots must share one.
	maxRedials = 3
	// streamPeek is the read buffer in front of a server-opened stream: it
	// holds the first byte that tells a notice from a dial request, and a
	// dial request of a usual length, before the stream carries bytes.
	streamPeek = 256
)

// A slot is one of the client's Connections: it keeps one session to the
// server up with its own reconnect loop, backoff and jitter. Every session
// of a slot logs in with the slot's run ID and registers the slot's route,
// so that a session that replaces a lost one (a NAT dropped the connection)
// replaces it on the server at once, and a replacement made for a move
// registers the same route on another replica.
type slot struct {
	c     *Client
	index int
	runID string             // "<instance>-<index>"
	route v1.ProxyConfigurer // http proxy "<tunnel>.<runID>" at subdomain <tunnel>
	log   *zap.Logger
}

func newSlot(c *Client, index int) *slot {
	runID := c.instance + "-" + strconv.Itoa(index)
	return &slot{
		c:     c,
		index: index,
		runID: runID,
		route: frpRouteConfig(c.tunnel, runID),
		log:   c.log.With(zap.Int("slot", index)),
	}
}

// outcome is how a session of a slot ended, for the slot's next step.
type outcome struct {
	loggedIn bool // the login succeeded
	moved    bool // the server asked it to move: the replacement starts at once
	redial   bool // the client closed it to land on another replica: again at once
}

// run keeps the slot connected until ctx ends. After a session that logged
// in, the next attempt comes at once (jittered by up to 200ms, so that the
// clients of a restarted server do not return in lockstep); after each
// failure the delay doubles up to MaxReconnectDelay. A session that moves or
// leaves a shared replica is replaced at once, without a delay.
func (s *slot) run(ctx context.Context) {
	var sessions sync.WaitGroup
	defer sessions.Wait()
	delay := minReconnectDelay
	for {
		o := s.connect(ctx, &sessions)
		if ctx.Err() != nil {
			return
		}
		if o.moved || o.redial {
			delay = minReconnectDelay
			continue
		}
		if o.loggedIn {
			delay = minReconnectDelay
		}
		wait := delay/2 + rand.N(delay/2+1) //nolint:gosec // jitter, not a secret
		s.log.Debug("next connection attempt", zap.Duration("in", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, s.c.cfg.MaxReconnectDelay)
	}
}

// connect makes one session and waits until it ends or is told to move. A
// session told to move keeps serving, in sessions, until the server closes
// it or ctx ends: the client never closes it itself, since the draining
// server knows when its last request has finished.
func (s *slot) connect(ctx context.Context, sessions *sync.WaitGroup) outcome {
	conn, via, err := s.c.dial(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.c.status.onFailed(s.index, nil, err)
			s.log.Warn("connect to tunnel server failed; retrying", zap.Error(err))
		}
		return outcome{}
	}
	mux, err := yamux.Client(tunnel.CoalesceFrames(conn, gathererOf(conn)), tunnel.MuxConfig(s.c.cfg.HeartbeatTimeout, s.log))
	if err != nil {
		_ = conn.Close()
		s.c.status.onFailed(s.index, nil, err)
		return outcome{}
	}
	ss := s.c.status.onConnected(s.index, via)
	ended := make(chan outcome, 1) // the session may end long after connect returned
	sessions.Go(func() { ended <- s.serve(ctx, mux, ss) })
	select {
	case o := <-ended:
		return o
	case <-ss.moveNow:
		return outcome{loggedIn: true, moved: true}
	}
}

// serveStreams answers the streams the server opens, until the session
// ends, and waits for their connections to end.
func (s *slot) serveStreams(mux *yamux.Session, ss *sessionState) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		stream, err := mux.AcceptStream()
		if err != nil {
			return
		}
		conns.Go(func() { s.serveStream(mux, ss, stream) })
	}
}

// serveStream tells a notice from a dial request by the stream's first
// byte, and reads the notice or answers the dial request.
func (s *slot) serveStream(mux *yamux.Session, ss *sessionState, stream net.Conn) {
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
		s.c.upstreams.serve(&peekedConn{Conn: stream, r: br}, s.log)
		return
	}
	n, err := tunnel.ReadNotice(br)
	_ = stream.Close()
	if err != nil {
		s.log.Debug("unreadable notice", zap.Error(err))
		return
	}
	s.onNotice(mux, ss, n)
}

// onNotice acts on what the server says about session ss.
func (s *slot) onNotice(mux *yamux.Session, ss *sessionState, n tunnel.Notice) {
	log := s.log.With(zap.String("replica", n.Replica), zap.String("session", n.Session))
	switch n.Kind {
	case tunnel.NoticeHello:
		tries := maxRedials
		if n.Alone {
			tries = 0 // there is no other replica to reach
		}
		leave, holder, left := s.c.status.onHello(ss, n.Replica, n.Session, tries)
		switch {
		case leave:
			// Sessions behind one address spread over its replicas only if
			// a slot that lands where another already is tries again.
			log.Info("session landed on a replica another slot holds; reconnecting to reach another", zap.Int("held_by_slot", holder))
			_ = mux.Close()
		case holder >= 0 && n.Alone:
			log.Info("session on the server's only replica, beside another slot", zap.Int("held_by_slot", holder))
		case holder >= 0:
			log.Info("session shares its replica with another slot: no other replica answered", zap.Int("held_by_slot", holder), zap.Int("tries", maxRedials))
		case left != "":
			log.Info("session on server replica, after leaving one another slot holds", zap.String("left_replica", left))
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
	default:
		log.Debug("unknown notice ignored", zap.String("kind", n.Kind))
	}
}

// peekedConn is a stream whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
