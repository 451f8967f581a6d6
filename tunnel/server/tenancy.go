package server

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
)

// tenancy binds verified logins to sessions and sessions to tunnels. The auth
// plugin calls it (it implements auth.Tunnels); the gate asks it whether a
// stream may reach frp.
type tenancy struct {
	verifier *auth.Verifier
	registry Registry
	metrics  *metrics
	log      *zap.Logger
	// forwarder builds how requests reach a freshly logged-in session.
	forwarder func(*Session) (http.Handler, error)

	mu       sync.Mutex
	sessions map[string]*Session // every connected session, logged in or not
}

func newTenancy(verifier *auth.Verifier, registry Registry, m *metrics, log *zap.Logger, forwarder func(*Session) (http.Handler, error)) *tenancy {
	return &tenancy{
		verifier:  verifier,
		registry:  registry,
		metrics:   m,
		log:       log,
		forwarder: forwarder,
		sessions:  make(map[string]*Session),
	}
}

func (t *tenancy) add(s *Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sessions[s.id] = s
}

// remove forgets an ended session and frees its tunnel name.
func (t *tenancy) remove(s *Session) {
	t.mu.Lock()
	delete(t.sessions, s.id)
	t.mu.Unlock()
	t.registry.Release(s)
}

func (t *tenancy) get(id string) (*Session, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.sessions[id]
	return s, ok
}

// all returns every connected session, for shutdown.
func (t *tenancy) all() []*Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	list := make([]*Session, 0, len(t.sessions))
	for _, s := range t.sessions {
		list = append(list, s)
	}
	return list
}

// Login binds the session to claims and makes it its tunnel's session,
// ending the previous one at once: a client whose old connection died
// silently (a NAT dropped it) gets its route back without waiting for a
// heartbeat to expire.
func (t *tenancy) Login(sessionID string, claims *auth.Claims) error {
	sess, ok := t.get(sessionID)
	if !ok {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection closed during login; reconnect"}
	}
	forward, err := t.forwarder(sess)
	if err != nil {
		return &auth.RejectError{Reason: auth.ReasonProxy, Detail: err.Error() + "; fix the client's --route flags"}
	}
	if !sess.bind(claims, forward) {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "this connection has already logged in; open a new connection"}
	}
	// Only a live connection takes the tunnel over: a login whose
	// connection died on the way must not end the session that works. The
	// gate may not have noticed the death yet, so ask the connection too.
	if !sess.alive() {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection closed during login; reconnect"}
	}
	if old := t.registry.Claim(sess); old != nil {
		old.Close("replaced by a new login from " + sess.remoteAddr)
		t.metrics.sessionsReplaced.Inc()
		t.log.Info("session replaced", zap.String("tunnel", claims.Tunnel),
			zap.String("old_client_address", old.remoteAddr), zap.String("client_address", sess.remoteAddr))
	}
	if !sess.alive() {
		// The connection ended while we claimed the name: give it back.
		t.registry.Release(sess)
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection closed during login; reconnect"}
	}
	// A session lives no longer than its token: the client's next login
	// reads the current token file.
	sess.after(time.Until(t.verifier.ValidUntil(claims)), func() { sess.Close("token expired") })
	info := sess.Info()
	sess.logger().Info("tunnel connected",
		zap.String("account", claims.Account), zap.String("runtime", claims.Runtime),
		zap.String("client_address", info.ClientAddress), zap.String("client_version", info.ClientVersion),
		zap.String("transport", info.Transport), zap.String("kid", claims.KeyID),
		zap.Time("token_expires", claims.ExpiresAt), zap.String("session", sess.id))
	return nil
}

// AddRoute records the route of the session's tunnel: one per tunnel, and
// only from the tunnel's current session.
func (t *tenancy) AddRoute(sessionID, proxyName string) error {
	sess, ok := t.get(sessionID)
	if !ok {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection has closed; reconnect"}
	}
	name := sess.Tunnel()
	if cur, ok := t.registry.Lookup(name); !ok || cur != sess {
		return &auth.RejectError{Reason: auth.ReasonSession,
			Detail: fmt.Sprintf("this connection no longer serves tunnel %q: a newer login replaced it", name)}
	}
	if !sess.setRoute(proxyName) {
		return &auth.RejectError{Reason: auth.ReasonProxy,
			Detail: fmt.Sprintf("tunnel %q already serves a route; a tunnel serves exactly one http route", name)}
	}
	sess.logger().Info("route registered", zap.String("route", proxyName))
	return nil
}

// RemoveRoute forgets a route frp closed.
func (t *tenancy) RemoveRoute(sessionID, proxyName string) {
	if sess, ok := t.get(sessionID); ok {
		sess.clearRoute(proxyName)
	}
}

// admitsWork reports whether a work connection claiming runID may reach frp
// from sess: only the tunnel's current, logged-in session may open work
// connections, and only in its own name (the run ID is the tunnel name).
func (t *tenancy) admitsWork(sess *Session, runID string) error {
	name := sess.Tunnel()
	if name == "" {
		return fmt.Errorf("work connection before login")
	}
	if runID != name {
		return fmt.Errorf("work connection for run ID %q on a session of tunnel %q", runID, name)
	}
	if cur, ok := t.registry.Lookup(name); !ok || cur != sess {
		return fmt.Errorf("work connection on a replaced session of tunnel %q", name)
	}
	return nil
}
