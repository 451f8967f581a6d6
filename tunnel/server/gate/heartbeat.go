package gate

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tether-dev/tether/tunnel"
)

// The gate's side of the heartbeat. yamux would ping every session from
// a goroutine of its own, every third of the heartbeat timeout, whatever
// the client sends. The gate instead looks at all its sessions at once,
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
func (g *Gate) watchHeartbeats(ctx context.Context) {
	tick := time.NewTicker(g.cfg.HeartbeatTimeout / heartbeatSweeps)
	defer tick.Stop()
	quiet := g.cfg.HeartbeatTimeout * 2 / 3
	var due []*Session
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case now = <-tick.C:
		}
		due = due[:0]
		g.each(func(sess *Session) {
			if sess.beat.due(sess.conn.read.Load(), now, quiet) {
				due = append(due, sess)
			}
		})
		for _, sess := range due {
			g.pings.Go(func() { g.heartbeatPing(sess) })
		}
		clear(due)
	}
}

// heartbeatPing pings a quiet session, and closes it when its client does
// not answer within a quarter of the heartbeat timeout.
func (g *Gate) heartbeatPing(sess *Session) {
	defer sess.beat.pinging.Store(false)
	if tunnel.PingWithin(sess.mux, g.cfg.HeartbeatTimeout/4) != nil && sess.Alive() {
		sess.Close("connection lost: " + describeEnd(yamux.ErrKeepAliveTimeout))
	}
}

// How fast the gate notices a client that went silent while it has
// something to say (see watchSilenceLocked). A client answers within a
// round trip: a response, a window update as it reads what it was sent, a
// ping's answer. Silence only triggers a ping; only the ping's bound
// decides, and it is seconds, so that a slow or saturated link is not
// taken for a dead one.
const (
	SilenceBound = time.Second
	SilencePing  = 2 * time.Second
)

// watchSilenceLocked makes the session notice, within SilenceBound +
// SilencePing of sending something, a client that no longer answers (a NAT
// dropped the connection, the client's node froze), instead of after the
// heartbeat timeout: once something written to the client has gone
// unanswered (no byte read since) for SilenceBound, a ping must be answered
// within SilencePing, or the host hears that the session went silent
// (Host.Silent). A request written on a pooled stream of such a session
// would otherwise wait for an answer until the heartbeat timeout. Bind
// starts it, under s.mu.
//
// Only what a request may be waiting for is watched: a write while one of
// the session's streams other than its control stream is open (a dialed
// upstream connection, pooled or in use, or a stock frpc's work
// connection), or any write of a stock frpc's session, which frp may ask
// for a work connection on its control stream. A new dial watches its own
// answer (dial.go). The rest, an idle session's answers to its client's
// pings and control messages, awaits nothing, and arms no timer.
func (s *Session) watchSilenceLocked() {
	stock := s.stock
	s.silence = time.AfterFunc(time.Hour, s.checkSilence)
	s.silence.Stop()
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
	s.silence.Reset(SilenceBound)
}

func (s *Session) checkSilence() {
	since := s.conn.unanswered.Load()
	switch {
	case since == 0 || !s.Alive():
		return // answered
	case time.Since(time.Unix(0, since)) < SilenceBound:
		// Answered, and written to again since.
		s.silence.Reset(SilenceBound - time.Since(time.Unix(0, since)))
		return
	}
	if tunnel.PingWithin(s.mux, SilencePing) != nil && s.Alive() {
		s.suspectUntil.Store(time.Now().Add(suspectFor).UnixNano())
		s.gate.host.Silent(s)
		return
	}
	// The client answered the ping: it is alive, and what it was sent is
	// still on its way or being worked on.
	s.conn.unanswered.Store(0)
}
