package server

import (
	"context"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server/gate"
)

// How a draining replica lets its clients move.
const (
	// moveTick is how often a drain looks at what moved.
	moveTick = 100 * time.Millisecond
	// retireGrace is how long a retired session stays open after its
	// tunnel was released in the registry, so that replicas which read the
	// registry before the release still find it.
	retireGrace = 500 * time.Millisecond
)

// drain shuts the server down without losing a request.
//
// Readiness fails at once, so that load balancers stop sending, and no new
// tunnel client is accepted (the gate's Serve has ended with the same
// context). With replicas to move to (a shared registry),
// every tether client is told to move (a move notice): it opens a
// replacement session, which lands on another replica, and keeps the old one
// meanwhile. A tunnel served elsewhere is retired here: released in the
// registry, so that no replica forwards it here any more, and its sessions
// here take no new request (requests that still arrive here are forwarded to
// its new replica); each closes once its last request has ended. Stock frpc
// clients, which cannot be told, close when the tether clients have moved.
// Then in-flight requests, forwarded ones included, get what is left of
// ShutdownTimeout to finish (connections that never sent a request close at
// once), and the sessions that remain close.
//
// gateServed is closed when the gate's Serve has returned: from then on no
// session starts, and the gate's sessions can all be closed and waited for.
func (s *replica) drain(entrySrv, peerSrv *http.Server, gateServed <-chan struct{}) {
	s.draining.Store(true)
	deadline := time.Now().Add(s.srv.cfg.ShutdownTimeout)
	s.srv.log.Info("draining", zap.Duration("timeout", s.srv.cfg.ShutdownTimeout), zap.Int("sessions", len(s.members.list())))
	if s.srv.registry.Status().Backend != "memory" { // there may be replicas to move to
		s.moveClients(deadline)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var wg sync.WaitGroup
	for _, srv := range []*http.Server{entrySrv, peerSrv} {
		if srv == nil {
			continue
		}
		wg.Go(func() {
			if err := srv.Shutdown(ctx); err != nil {
				s.srv.log.Warn("in-flight requests did not finish in time; closing them", zap.Error(err))
				_ = srv.Close()
			}
		})
	}
	s.closeUnusedWhile(&wg)
	<-gateServed
	s.gate.CloseAll("server shutting down")
	s.gate.Wait()
}

// closeUnusedWhile closes the HTTP connections that never sent a byte until
// the servers' shutdowns (wg) have ended, or Shutdown would wait for them.
func (s *replica) closeUnusedWhile(shutdowns *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { shutdowns.Wait(); close(done) }()
	t := time.NewTicker(moveTick)
	defer t.Stop()
	for {
		s.entryConns.closeUnused()
		if s.peerConns != nil {
			s.peerConns.closeUnused()
		}
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}

// moveClients tells the tether clients to move and closes each session here
// once its tunnel is served elsewhere and its requests have ended. It
// returns when no session is left, or when only stock frpc sessions and
// sessions that cannot move are, or at half the time to deadline: the
// other half is for in-flight requests.
func (s *replica) moveClients(deadline time.Time) {
	for _, m := range s.members.list() {
		if !m.sess.Stock() {
			m.sess.Notify(tunnel.Notice{Kind: tunnel.NoticeMove, Replica: s.srv.cfg.ReplicaID})
		}
	}
	giveUp := time.Now().Add(time.Until(deadline) / 2)
	retiredAt := make(map[string]time.Time)
	t := time.NewTicker(moveTick)
	defer t.Stop()
	for {
		waiting := false
		for _, name := range s.members.tunnelNames() {
			sessions := s.members.sessionsOf(name)
			at, retired := retiredAt[name]
			if !retired && len(s.srv.registry.Holders(name)) > 0 {
				s.members.retire(name)
				retiredAt[name], at, retired = time.Now(), time.Now(), true
				s.srv.log.Info("tunnel moved to another replica; its sessions here close once their requests end",
					zap.String("tunnel", name), zap.Int("sessions", len(sessions)))
			}
			if !retired {
				// Not served elsewhere (yet): a tether client is on its
				// way; a stock frpc cannot be told.
				waiting = waiting || !allStock(sessions)
				continue
			}
			for _, sess := range sessions {
				if time.Since(at) >= retireGrace && sess.Idle() {
					sess.Close("moved to another replica")
					continue
				}
				s.members.closeIdle(sess)
				waiting = true
			}
		}
		if !waiting || time.Now().After(giveUp) {
			return
		}
		<-t.C
	}
}

func allStock(sessions []*gate.Session) bool {
	for _, s := range sessions {
		if !s.Stock() {
			return false
		}
	}
	return true
}
