package server

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server/gate"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// members is which sessions serve which tunnel on this replica: every fact
// about a logged-in session that is not the session's own (its route, how
// far it serves, its handler, its requests) has its one owner here, under
// one lock. Steps 3, 4 and 6 of a login (the package doc) are its own. It
// implements auth.Tunnels, takes the gate's word on silent
// and ended sessions, and is the only one to tell the registry when this
// replica starts and stops serving a tunnel: the registry itself knows
// names and replicas only.
//
// A tunnel may have several members here (several client processes, or a
// client's --connections landing on one replica): requests are spread over
// those that serve, round-robin.
type members struct {
	// Static after newMembers.
	gate       *gate.Gate
	reg        registry.Registry
	tokens     *tokenKeeper
	metrics    *metrics
	newHandler func(sess *gate.Session, stock bool) sessionHandler
	limit      int    // --max-sessions-per-tunnel
	replica    string // this replica's ID, told to tether clients (hello)
	// webhooks learns each tunnel's logins, when it starts being served
	// here and when its last member leaves (webhooks.go); set before the
	// first login.
	webhooks *webhooks

	// Guarded by mu: who is a member, and each member's state and route.
	mu      sync.RWMutex
	byID    map[string]*member // by session ID
	tunnels map[string]*tunnelMembers
}

// member is a logged-in session, as a member of its tunnel here.
type member struct {
	// Static after Login.
	sess    *gate.Session
	handler sessionHandler // how requests reach the client

	// Counted by the entry: requests routed to the member by status class,
	// index 1..5 for 1xx..5xx, index 0 for requests that failed before any
	// response.
	requests [6]atomic.Uint64
	stats    *tunnelRecord // the tunnel's totals, which outlive the member

	// Guarded by members.mu.
	state   memberState
	retired bool   // a drain moved its tunnel to another replica
	route   string // the registered frp proxy name; "" while none
}

// memberState is how far a member's route has come. A member starts
// joined (Login) and serves once its route is registered (AddRoute), at
// once for a tether client, once frp's vhost knows it for a stock frpc
// (route pending until frp answered the client); RemoveRoute takes it back
// to joined. A drain may retire it at any point (member.retired): a
// retired member takes a request only when nothing else can, and leaves
// with its session.
type memberState uint8

const (
	memberJoined       memberState = iota // logged in; no route
	memberRoutePending                    // a stock frpc's route registered in the auth plugin, not yet in frp's vhost
	memberServing                         // its route registered: it takes requests
)

// tunnelMembers are one tunnel's members on this replica.
type tunnelMembers struct {
	all     []*member // logged in, oldest first
	serving []*member // of all, those in memberServing; replaced, never changed in place
	next    atomic.Uint32
}

func newMembers(g *gate.Gate, reg registry.Registry, tokens *tokenKeeper, m *metrics,
	newHandler func(*gate.Session, bool) sessionHandler, limit int, replica string,
) *members {
	return &members{
		gate: g, reg: reg, tokens: tokens, metrics: m, newHandler: newHandler, limit: limit, replica: replica,
		byID: make(map[string]*member), tunnels: make(map[string]*tunnelMembers),
	}
}

var _ auth.Tunnels = (*members)(nil)

// Login binds session sessionID to claims under runID, and makes it a
// member of its tunnel (step 3).
func (ms *members) Login(sessionID string, claims *auth.Claims, runID string) error {
	sess, ok := ms.gate.Session(sessionID)
	if !ok {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: gate.ErrClosed.Error()}
	}
	advertised := sess.AdvertisedRoutes()
	routes, err := parseAdvertised(advertised)
	if err != nil {
		return &auth.RejectError{Reason: auth.ReasonProxy, Detail: err.Error() + "; fix the client's --route flags"}
	}
	if rej := ms.tokens.refusal(claims); rej != nil {
		return rej
	}
	stock := advertised == nil
	if err := sess.Bind(claims, runID, stock); err != nil {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: err.Error()}
	}
	m := &member{sess: sess, handler: ms.newHandler(sess, stock), stats: ms.metrics.tunnels.join(sess)}
	sess.OnEnd(m.handler.CloseIdle)
	replaced, err := ms.join(m)
	if err != nil {
		return joinReject(err)
	}
	if replaced != nil {
		replaced.Close("replaced by a new login from " + sess.RemoteAddr())
		ms.metrics.sessionsReplaced.Inc()
		sess.Logger().Info("session replaced", zap.String("run_id", runID),
			zap.String("old_client_address", replaced.RemoteAddr()), zap.String("client_address", sess.RemoteAddr()))
	}
	// A session lives by its token (tokens.go); one revoked while it
	// joined closes now, as enforce may have looked before it joined.
	ms.tokens.keep(sess)
	if ms.tokens.closeRevoked(sess) {
		return nil
	}
	ms.remember(m, routes)
	sess.Logger().Info("tunnel connected",
		zap.String("account", claims.Account), zap.String("runtime", claims.Runtime),
		zap.String("client_address", sess.RemoteAddr()), zap.String("client_version", sess.ClientVersion()),
		zap.String("transport", sess.Transport()), zap.String("kid", claims.KeyID), zap.String("jti", claims.ID),
		zap.Time("token_expires", claims.ExpiresAt), zap.String("session", sess.ID()), zap.String("run_id", runID))
	if !stock {
		sess.Notify(tunnel.Notice{Kind: tunnel.NoticeHello, Replica: ms.replica, Alone: ms.reg.Status().Backend == "memory"})
	}
	return nil
}

// remember tells the webhook buffer the routes m's login advertised,
// unless m left already: under the lock, so that the tunnel's Left, when
// its last member leaves, comes after.
func (ms *members) remember(m *member, routes []proxy.Route) {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	if ms.byID[m.sess.ID()] == m {
		ms.webhooks.loggedIn(m.sess.Tunnel(), routes)
	}
}

// joinError says why a logged-in session cannot join its tunnel here.
type joinError struct {
	detail string
	mixed  bool // a stock frpc beside tether clients, or the reverse
}

func (e *joinError) Error() string { return e.detail }

func joinReject(err error) *auth.RejectError {
	reason := auth.ReasonSessionLimit
	if je, ok := errors.AsType[*joinError](err); ok && je.mixed {
		reason = auth.ReasonMixedClients
	}
	return &auth.RejectError{Reason: reason, Detail: err.Error()}
}

// join makes m a member of its tunnel. The live member of the tunnel with
// the same run ID, if any, leaves, and its session is returned for the
// caller to close: the new login replaces it. A tunnel has at most limit
// members here, and its members are all tether clients or all stock frpc:
// frp's vhost would send a stock frpc's requests to a tether client's route
// too.
func (ms *members) join(m *member) (replaced *gate.Session, err error) {
	s := m.sess
	name, runID, stock := s.Tunnel(), s.RunID(), s.Stock()
	ms.mu.Lock()
	defer ms.mu.Unlock()
	t := ms.tunnels[name]
	if t == nil {
		t = &tunnelMembers{}
		ms.tunnels[name] = t
	}
	var old *member
	others := 0
	for _, o := range t.all {
		switch {
		case o.sess.RunID() == runID:
			old = o
		case o.sess.Stock() != stock:
			return nil, &joinError{detail: kindConflict(name, stock), mixed: true}
		default:
			others++
		}
	}
	if others >= ms.limit {
		return nil, &joinError{detail: tooManySessions(name, ms.limit)}
	}
	t.all = append(t.all, m)
	ms.byID[s.ID()] = m
	if old != nil {
		ms.leaveLocked(old)
		replaced = old.sess
	}
	return replaced, nil
}

func kindConflict(name string, stock bool) string {
	if stock {
		return fmt.Sprintf("tunnel %q is served here by tether clients; a stock frpc cannot serve it beside them: stop them, or run tether client instead", name)
	}
	return fmt.Sprintf("tunnel %q is served here by stock frpc; a tether client cannot serve it beside them: stop them first", name)
}

func tooManySessions(name string, limit int) string {
	return fmt.Sprintf("tunnel %q already has %d sessions on this server (--max-sessions-per-tunnel): stop clients it does not need, or lower their --connections", name, limit)
}

// AddRoute makes the member serve its route (step 4): one route per
// session.
func (ms *members) AddRoute(sessionID, proxyName string) error {
	sess, ok := ms.gate.Session(sessionID)
	if !ok || !sess.Alive() {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection has closed; reconnect"}
	}
	name := sess.Tunnel()
	if name == "" {
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "route registration before login; log in first"}
	}
	ms.mu.Lock()
	m := ms.byID[sessionID]
	switch {
	case m == nil:
		ms.mu.Unlock()
		return &auth.RejectError{Reason: auth.ReasonSession, Detail: "the connection has closed; reconnect"}
	case m.route != "" && m.route != proxyName:
		ms.mu.Unlock()
		return &auth.RejectError{Reason: auth.ReasonProxy,
			Detail: fmt.Sprintf("this connection of tunnel %q already serves a route; a connection serves exactly one http route", name)}
	}
	m.route = proxyName
	switch {
	case m.state == memberServing: // the same route again
	case sess.Stock():
		// frp's vhost learns the route after this answer, and answers the
		// client once it has: requests go to the vhost from then on.
		m.state = memberRoutePending
		sess.OnControlWrite(func() { ms.routeAnswered(m) })
	default:
		ms.serveLocked(m)
	}
	ms.mu.Unlock()
	sess.Logger().Info("route registered", zap.String("route", proxyName), zap.String("session", sess.ID()))
	return nil
}

// routeAnswered makes a member whose route was pending serve: frp has
// answered the client since the route was registered.
func (ms *members) routeAnswered(m *member) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if m.state == memberRoutePending {
		ms.serveLocked(m)
	}
}

// RemoveRoute stops a member serving the route frp closed.
func (ms *members) RemoveRoute(sessionID, proxyName string) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m := ms.byID[sessionID]
	if m == nil || m.route != proxyName {
		return
	}
	m.route = ""
	m.state = memberJoined
	ms.unserveLocked(m)
}

// serveLocked makes a member of its tunnel serve requests.
func (ms *members) serveLocked(m *member) {
	m.state = memberServing
	name := m.sess.Tunnel()
	t := ms.tunnels[name]
	if t == nil || !slices.Contains(t.all, m) || slices.Contains(t.serving, m) {
		return
	}
	ms.setServingLocked(name, t, append(slices.Clone(t.serving), m))
}

// unserveLocked takes m off its tunnel's serving members.
func (ms *members) unserveLocked(m *member) {
	name := m.sess.Tunnel()
	if t := ms.tunnels[name]; t != nil {
		ms.setServingLocked(name, t, slices.DeleteFunc(slices.Clone(t.serving), func(o *member) bool { return o == m }))
	}
}

// Silent is what becomes of a session whose client stopped answering
// (gate.Host): while another member serves its tunnel, it closes, so that
// its requests go there now rather than after the heartbeat timeout. The
// tunnel's only session stays: the heartbeat decides.
func (ms *members) Silent(sess *gate.Session) {
	if !ms.othersServe(sess) {
		sess.Logger().Debug("client did not answer a ping; its tunnel has no other session to send requests to",
			zap.String("session", sess.ID()))
		return
	}
	ms.metrics.sessionsSilent.Inc()
	sess.Logger().Warn("closing a session whose client stopped answering; its tunnel's other sessions serve",
		zap.String("session", sess.ID()), zap.String("client_address", sess.RemoteAddr()))
	sess.Close(fmt.Sprintf("the client stopped answering (nothing for %v, then no answer to a ping within %v)", gate.SilenceBound, gate.SilencePing))
}

// Ended is the end of a session's connection (gate.Host): its member
// leaves (steps 5 and 6). It is safe for a session that never joined or already left.
func (ms *members) Ended(sess *gate.Session) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if m := ms.byID[sess.ID()]; m != nil && m.sess == sess {
		ms.leaveLocked(m)
	}
}

func (ms *members) leaveLocked(m *member) {
	if ms.byID[m.sess.ID()] == m {
		delete(ms.byID, m.sess.ID())
	}
	name := m.sess.Tunnel()
	t := ms.tunnels[name]
	if t == nil {
		return
	}
	t.all = slices.DeleteFunc(slices.Clone(t.all), func(o *member) bool { return o == m })
	ms.unserveLocked(m)
	if len(t.all) == 0 {
		delete(ms.tunnels, name)
		ms.webhooks.left(name)
	}
}

// setServingLocked replaces a tunnel's serving members and tells the
// registry when the tunnel starts or stops being served here. A retired
// member (a drain) does not count: its tunnel was released already.
func (ms *members) setServingLocked(name string, t *tunnelMembers, list []*member) {
	before, after := countActive(t.serving), countActive(list)
	t.serving = list
	switch {
	case before == 0 && after > 0:
		ms.reg.Hold(name)
		ms.webhooks.serving(name)
	case before > 0 && after == 0:
		ms.reg.Release(name)
	}
}

func countActive(list []*member) int {
	n := 0
	for _, m := range list {
		if !m.retired {
			n++
		}
	}
	return n
}

// pick returns a member serving tunnel name for the next request, or nil.
// Members take turns; one whose session just failed a dial (suspect), one
// in skip, and, unless retiredToo, one a drain retired, are passed over
// while another serves.
func (ms *members) pick(name string, retiredToo bool, skip []*member) *member {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	t := ms.tunnels[name]
	if t == nil || len(t.serving) == 0 {
		return nil
	}
	start := int(t.next.Add(1))
	now := time.Now()
	var fallback *member
	for i := range t.serving {
		m := t.serving[(start+i)%len(t.serving)]
		if slices.Contains(skip, m) || (m.retired && !retiredToo) {
			continue
		}
		if m.sess.Suspect(now) || m.retired {
			if fallback == nil {
				fallback = m
			}
			continue
		}
		return m
	}
	return fallback
}

// handler returns m's handler while m serves requests: its route
// registered, its session open.
func (ms *members) handler(m *member) (sessionHandler, bool) {
	ms.mu.RLock()
	ok := m.state == memberServing
	ms.mu.RUnlock()
	if !ok || m.sess.CloseReason() != "" {
		return nil, false
	}
	return m.handler, true
}

// othersServe reports whether a member of sess's tunnel other than sess
// serves, not retired and not suspect.
func (ms *members) othersServe(sess *gate.Session) bool {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	t := ms.tunnels[sess.Tunnel()]
	if t == nil {
		return false
	}
	now := time.Now()
	for _, o := range t.serving {
		if o.sess != sess && !o.retired && !o.sess.Suspect(now) {
			return true
		}
	}
	return false
}

// serves reports whether a member that is not retired serves tunnel name.
func (ms *members) serves(name string) bool {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	t := ms.tunnels[name]
	return t != nil && countActive(t.serving) > 0
}

// retire stops the tunnel's members here from taking new requests, and
// releases the tunnel in the registry, so that other replicas stop sending
// it here: a draining replica does this once another replica serves the
// tunnel.
func (ms *members) retire(name string) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	t := ms.tunnels[name]
	if t == nil {
		return
	}
	served := countActive(t.serving) > 0
	for _, m := range t.all {
		m.retired = true
	}
	if served {
		ms.reg.Release(name)
	}
}

// closeIdle closes the idle streams that sess's handler keeps for later
// requests.
func (ms *members) closeIdle(sess *gate.Session) {
	ms.mu.RLock()
	m := ms.byID[sess.ID()]
	ms.mu.RUnlock()
	if m != nil && m.sess == sess {
		m.handler.CloseIdle()
	}
}

// tunnelNames returns the names of the tunnels with members here, sorted.
func (ms *members) tunnelNames() []string {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	names := make([]string, 0, len(ms.tunnels))
	for n := range ms.tunnels {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// sessionsOf returns the sessions of tunnel name's members, oldest first.
func (ms *members) sessionsOf(name string) []*gate.Session {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	var list []*gate.Session
	if t := ms.tunnels[name]; t != nil {
		for _, m := range t.all {
			list = append(list, m.sess)
		}
	}
	return list
}

// sessions returns the sessions of every member.
func (ms *members) sessions() []*gate.Session {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	list := make([]*gate.Session, 0, len(ms.byID))
	for _, m := range ms.byID {
		list = append(list, m.sess)
	}
	return list
}

// list returns every member, by tunnel name, then oldest first.
func (ms *members) list() []*member {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	var list []*member
	for _, t := range ms.tunnels {
		list = append(list, t.all...)
	}
	slices.SortStableFunc(list, func(a, b *member) int {
		if c := strings.Compare(a.sess.Tunnel(), b.sess.Tunnel()); c != 0 {
			return c
		}
		return a.sess.ConnectedAt().Compare(b.sess.ConnectedAt())
	})
	return list
}

// lookup returns the session of tunnel name's oldest member, for a probe
// that reports who serves a tunnel.
func (ms *members) lookup(name string) (*gate.Session, bool) {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	if t := ms.tunnels[name]; t != nil && len(t.all) > 0 {
		return t.all[0].sess, true
	}
	return nil, false
}

// info returns what the admin API says of m.
func (ms *members) info(m *member) Info {
	ms.mu.RLock()
	route, retired := m.route, m.retired
	ms.mu.RUnlock()
	s := m.sess
	in, out := s.Traffic()
	info := Info{
		ClientAddress:  s.RemoteAddr(),
		ConnectedSince: s.ConnectedAt().UTC(),
		ClientVersion:  s.ClientVersion(),
		BytesIn:        in,
		BytesOut:       out,
		Transport:      s.Transport(),
		Route:          route,
		Session:        s.ID(),
		RunID:          s.RunID(),
		Retired:        retired,
	}
	if c := s.Claims(); c != nil {
		info.Name = c.Tunnel
		info.Account = c.Account
		info.Runtime = c.Runtime
		info.TokenExpires = c.ExpiresAt.UTC()
	}
	for i := range m.requests {
		info.Requests += m.requests[i].Load()
	}
	return info
}

// countRequest records one request routed to m by its status code (0 =
// failed before a response).
func (m *member) countRequest(status int) {
	m.requests[statusClass(status)].Add(1)
	m.stats.count(status)
}
