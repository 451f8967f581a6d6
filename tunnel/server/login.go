package server

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server/gate"
)

// The login, from the gate through frp and its auth plugin and back, in the
// order it runs:
//
//  1. The gate reads the frp Login on a connection's first stream. A
//     probe is answered there, with what Probe says (probe.go). A login is
//     admitted once per connection, stamped with the session's ID and
//     handed to frp (HandOver).
//  2. frp asks the auth plugin (auth.Plugin): it verifies the token, scopes
//     the client's run ID to the tunnel (auth.ScopedRunID) and calls Login.
//  3. Login binds the session to the tunnel (gate.Session.Bind): its routes
//     checked, its handler made (it builds the router at the first
//     request), the tunnel's sessions here joined (a live session with
//     the same run ID is the client's own stale one, and is replaced), its
//     life bounded by its token, and a tether client told which replica it
//     reached (a hello notice).
//  4. frp accepts the login, and the client registers its route. The plugin
//     checks it and puts it in the tunnel's group; AddRoute makes the
//     session serve requests, and the registry learns that this replica
//     serves the tunnel.
//  5. The session ends with its connection (the gate tells Ended): it
//     leaves the table, and the registry learns when the tunnel's last
//     session here is gone.
//
// serving implements auth.Tunnels for steps 3 and 4.

// Login binds session sessionID to claims under runID (step 3).
func (s *serving) Login(sessionID string, claims *auth.Claims, runID string) error {
	sess, ok := s.gate.Session(sessionID)
	if !ok {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: gate.ErrClosed.Error()}
	}
	advertised := sess.AdvertisedRoutes()
	if _, err := parseAdvertised(advertised); err != nil {
		return &auth.RejectError{Reason: auth.ReasonProxy, Detail: err.Error() + "; fix the client's --route flags"}
	}
	stock := advertised == nil
	if err := sess.Bind(claims, runID, stock); err != nil {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: err.Error()}
	}
	m := &member{sess: sess, handler: s.newHandler(sess, stock)}
	sess.OnEnd(m.handler.CloseIdle)
	replaced, err := s.sessions.join(m, s.cfg.MaxSessionsPerTunnel)
	if err != nil {
		return joinReject(err)
	}
	if replaced != nil {
		replaced.sess.Close("replaced by a new login from " + sess.RemoteAddr())
		s.metrics.sessionsReplaced.Inc()
		sess.Logger().Info("session replaced", zap.String("run_id", runID),
			zap.String("old_client_address", replaced.sess.RemoteAddr()), zap.String("client_address", sess.RemoteAddr()))
	}
	// A session lives no longer than its token: the client's next login
	// reads the current token file.
	sess.After(time.Until(s.verifier.ValidUntil(claims)), func() { sess.Close("token expired") })
	sess.Logger().Info("tunnel connected",
		zap.String("account", claims.Account), zap.String("runtime", claims.Runtime),
		zap.String("client_address", sess.RemoteAddr()), zap.String("client_version", sess.ClientVersion()),
		zap.String("transport", sess.Transport()), zap.String("kid", claims.KeyID),
		zap.Time("token_expires", claims.ExpiresAt), zap.String("session", sess.ID()), zap.String("run_id", runID))
	if !stock {
		sess.Notify(tunnel.Notice{Kind: tunnel.NoticeHello, Replica: s.cfg.ReplicaID, Alone: s.registry.Status().Backend == "memory"})
	}
	return nil
}

// Silent is what becomes of a session whose client stopped answering
// (gate.Host): while another session serves its tunnel, it closes, so that
// its requests go there now rather than after the heartbeat timeout. The
// tunnel's only session stays: the heartbeat decides.
func (s *serving) Silent(sess *gate.Session) {
	if !s.sessions.othersServe(sess) {
		sess.Logger().Debug("client did not answer a ping; its tunnel has no other session to send requests to",
			zap.String("session", sess.ID()))
		return
	}
	s.metrics.sessionsSilent.Inc()
	sess.Logger().Warn("closing a session whose client stopped answering; its tunnel's other sessions serve",
		zap.String("session", sess.ID()), zap.String("client_address", sess.RemoteAddr()))
	sess.Close(fmt.Sprintf("the client stopped answering (nothing for %v, then no answer to a ping within %v)", gate.SilenceBound, gate.SilencePing))
}

func joinReject(err error) *auth.RejectError {
	reason := auth.ReasonSessionLimit
	if je, ok := errors.AsType[*joinError](err); ok && je.mixed {
		reason = auth.ReasonMixedClients
	}
	return &auth.RejectError{Reason: reason, Detail: err.Error()}
}

// AddRoute makes the session serve its route (step 4): one route per
// session.
func (s *serving) AddRoute(sessionID, proxyName string) error {
	sess, ok := s.gate.Session(sessionID)
	if !ok || !sess.Alive() {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection has closed; reconnect"}
	}
	name := sess.Tunnel()
	if name == "" {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "route registration before login; log in first"}
	}
	m, ok := s.sessions.get(sessionID)
	if !ok {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection has closed; reconnect"}
	}
	if !m.setRoute(proxyName) {
		return &auth.RejectError{Reason: auth.ReasonProxy,
			Detail: fmt.Sprintf("this connection of tunnel %q already serves a route; a connection serves exactly one http route", name)}
	}
	if sess.Stock() {
		// frp's vhost learns the route after this answer, and answers the
		// client once it has: requests go to the vhost from then on.
		m.routePending.Store(true)
		sess.OnControlWrite(func() {
			if m.routePending.CompareAndSwap(true, false) {
				s.sessions.serve(m)
			}
		})
	} else {
		s.sessions.serve(m)
	}
	sess.Logger().Info("route registered", zap.String("route", proxyName), zap.String("session", sess.ID()))
	return nil
}

// RemoveRoute stops a session serving the route frp closed.
func (s *serving) RemoveRoute(sessionID, proxyName string) {
	if m, ok := s.sessions.get(sessionID); ok && m.clearRoute(proxyName) {
		m.routePending.Store(false)
		s.sessions.unserve(m)
	}
}

// Ended forgets a session whose connection is gone (gate.Host).
func (s *serving) Ended(sess *gate.Session) { s.sessions.leave(sess) }
