package server

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
)

// The login, from the gate through frp and its auth plugin and back, in the
// order it runs:
//
//  1. The gate (admitStream) reads the frp Login on a connection's first
//     stream. A probe is answered there (probe.go). A login is admitted once
//     per connection (startLogin, which keeps the routes a tether client
//     advertised), stamped with the session's ID and handed to frp.
//  2. frp asks the auth plugin (auth.Plugin): it verifies the token, scopes
//     the client's run ID to the tunnel (auth.ScopedRunID) and calls Login.
//  3. Login binds the session to the tunnel: its routes checked, its
//     handler made (it builds the router at the first request), the
//     tunnel's sessions here joined (a live session with
//     the same run ID is the client's own stale one, and is replaced), its
//     life bounded by its token, and a tether client told which replica it
//     reached (a hello notice).
//  4. frp accepts the login, and the client registers its route. The plugin
//     checks it and puts it in the tunnel's group; AddRoute makes the
//     session serve requests, and the registry learns that this replica
//     serves the tunnel.
//  5. The session ends with its connection (the gate): it leaves the table,
//     and the registry learns when the tunnel's last session here is gone.
//
// serving implements auth.Tunnels for steps 3 and 4.

// Login binds session sessionID to claims under runID (step 3).
func (s *serving) Login(sessionID string, claims *auth.Claims, runID string) error {
	sess, ok := s.sessions.get(sessionID)
	if !ok {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection closed during login; reconnect"}
	}
	advertised := sess.advertisedRoutes()
	if _, err := parseAdvertised(advertised); err != nil {
		return &auth.RejectError{Reason: auth.ReasonProxy, Detail: err.Error() + "; fix the client's --route flags"}
	}
	stock := advertised == nil
	handler := s.newHandler(sess, stock)
	if !sess.bind(claims, runID, stock, handler) {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "this connection has already logged in; open a new connection"}
	}
	sess.atEnd(handler.CloseIdle)
	// Only a live connection takes a session over: a login whose
	// connection died on the way must not end the session that works. The
	// gate may not have noticed the death yet, so ask the connection too.
	if !sess.alive() {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection closed during login; reconnect"}
	}
	replaced, err := s.sessions.join(sess, s.cfg.MaxSessionsPerTunnel)
	if err != nil {
		return joinReject(err)
	}
	if replaced != nil {
		replaced.Close("replaced by a new login from " + sess.remoteAddr)
		s.metrics.sessionsReplaced.Inc()
		sess.logger().Info("session replaced", zap.String("run_id", runID),
			zap.String("old_client_address", replaced.remoteAddr), zap.String("client_address", sess.remoteAddr))
	}
	sess.watchSilence(s.silent)
	// A session lives no longer than its token: the client's next login
	// reads the current token file.
	sess.after(time.Until(s.verifier.ValidUntil(claims)), func() { sess.Close("token expired") })
	info := sess.Info()
	sess.logger().Info("tunnel connected",
		zap.String("account", claims.Account), zap.String("runtime", claims.Runtime),
		zap.String("client_address", info.ClientAddress), zap.String("client_version", info.ClientVersion),
		zap.String("transport", info.Transport), zap.String("kid", claims.KeyID),
		zap.Time("token_expires", claims.ExpiresAt), zap.String("session", sess.id), zap.String("run_id", runID))
	if !stock {
		s.notify(sess, tunnel.NoticeHello)
	}
	return nil
}

// silent is what becomes of a session whose client stopped answering: while
// another session serves its tunnel, it closes, so that its requests go
// there now rather than after the heartbeat timeout. The tunnel's only
// session stays: the heartbeat decides.
func (s *serving) silent(sess *Session) {
	if !s.sessions.othersServe(sess) {
		sess.logger().Debug("client did not answer a ping; its tunnel has no other session to send requests to",
			zap.String("session", sess.id))
		return
	}
	s.metrics.sessionsSilent.Inc()
	sess.logger().Warn("closing a session whose client stopped answering; its tunnel's other sessions serve",
		zap.String("session", sess.id), zap.String("client_address", sess.remoteAddr))
	sess.Close(fmt.Sprintf("the client stopped answering (nothing for %v, then no answer to a ping within %v)", silenceBound, silencePing))
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
	sess, ok := s.sessions.get(sessionID)
	if !ok || !sess.alive() {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection has closed; reconnect"}
	}
	name := sess.Tunnel()
	if name == "" {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "route registration before login; log in first"}
	}
	if !sess.setRoute(proxyName) {
		return &auth.RejectError{Reason: auth.ReasonProxy,
			Detail: fmt.Sprintf("this connection of tunnel %q already serves a route; a connection serves exactly one http route", name)}
	}
	if sess.stock() {
		// frp's vhost learns the route after this answer, and answers the
		// client once it has: requests go to the vhost from then on.
		sess.routePending.Store(true)
	} else {
		s.sessions.serve(sess)
	}
	sess.logger().Info("route registered", zap.String("route", proxyName), zap.String("session", sess.id))
	return nil
}

// RemoveRoute stops a session serving the route frp closed.
func (s *serving) RemoveRoute(sessionID, proxyName string) {
	if sess, ok := s.sessions.get(sessionID); ok && sess.clearRoute(proxyName) {
		sess.routePending.Store(false)
		s.sessions.unserve(sess)
	}
}

// admitsWork reports whether a work connection claiming runID may reach frp
// from sess: only a logged-in session may open work connections, and only
// for its own run ID, so frp hands it only its own tunnel's requests.
func admitsWork(sess *Session, runID string) error {
	name := sess.Tunnel()
	switch {
	case name == "":
		return fmt.Errorf("work connection before login")
	case runID != sess.RunID():
		return fmt.Errorf("work connection for run ID %q on a session of tunnel %q with run ID %q", runID, name, sess.RunID())
	case !sess.alive():
		return fmt.Errorf("work connection on a closed session of tunnel %q", name)
	}
	return nil
}
