package server

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/tunnel/server/gate"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// sessionTable is this replica's logged-in sessions, by tunnel, each with
// what the server keeps of it (member). It is the one place that knows
// which sessions serve a tunnel here, and it tells the registry when this
// replica starts and stops serving one: the registry itself knows names
// and replicas only.
//
// A tunnel may have several sessions here (several client processes, or a
// client's --connections landing on one replica): requests are spread over
// those that serve, round-robin.
type sessionTable struct {
	reg registry.Registry

	mu      sync.RWMutex
	byID    map[string]*member // by session ID
	tunnels map[string]*tunnelSessions
}

// member is a logged-in session and what the server keeps of it.
type member struct {
	sess    *gate.Session
	handler sessionHandler // how requests reach the client
	// retired is set when a draining server stops sending the session new
	// requests because its tunnel is served elsewhere.
	retired atomic.Bool
	// routePending is set while a stock frpc's route is registered in the
	// auth plugin but not yet in frp's vhost: the session serves once frp
	// has answered the client (its next write on the control stream).
	routePending atomic.Bool
	// requests counts the requests routed to this session by status class:
	// index 1..5 for 1xx..5xx, index 0 for requests that failed before any
	// response.
	requests [6]atomic.Uint64

	mu    sync.Mutex
	route string // the registered frp proxy name; "" while none
}

// tunnelSessions are one tunnel's sessions on this replica.
type tunnelSessions struct {
	all     []*member // logged in, oldest first
	serving []*member // of all, those with a registered route; replaced, never changed in place
	next    atomic.Uint32
}

func newSessionTable(reg registry.Registry) *sessionTable {
	return &sessionTable{reg: reg, byID: make(map[string]*member), tunnels: make(map[string]*tunnelSessions)}
}

// get returns the member with session ID id.
func (t *sessionTable) get(id string) (*member, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	m, ok := t.byID[id]
	return m, ok
}

// setRoute records the member's route; a session has at most one.
func (m *member) setRoute(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.route != "" && m.route != name {
		return false
	}
	m.route = name
	return true
}

// clearRoute forgets the route name, and reports whether it was the
// member's.
func (m *member) clearRoute(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.route != name {
		return false
	}
	m.route = ""
	return true
}

// routeName is the member's route, "" while none.
func (m *member) routeName() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.route
}

// serving returns the member's handler while it serves requests: its route
// registered, its session not closed.
func (m *member) serving() (sessionHandler, bool) {
	m.mu.Lock()
	route := m.route
	m.mu.Unlock()
	if route == "" || m.sess.CloseReason() != "" {
		return nil, false
	}
	return m.handler, true
}

// joinError says why a logged-in session cannot join its tunnel here.
type joinError struct {
	detail string
	mixed  bool // a stock frpc beside tether clients, or the reverse
}

func (e *joinError) Error() string { return e.detail }

// join adds a logged-in session to its tunnel. The live session of the
// tunnel with the same run ID, if any, is returned for the caller to close:
// the new login replaces it. A tunnel holds at most limit sessions here,
// and its sessions are all tether clients or all stock frpc: frp's vhost
// would send a stock frpc's requests to a tether client's route too.
func (t *sessionTable) join(m *member, limit int) (replaced *member, err error) {
	s := m.sess
	name, runID, stock := s.Tunnel(), s.RunID(), s.Stock()
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.tunnels[name]
	if ts == nil {
		ts = &tunnelSessions{}
		t.tunnels[name] = ts
	}
	others := 0
	for _, o := range ts.all {
		switch {
		case o.sess.RunID() == runID:
			replaced = o
		case o.sess.Stock() != stock:
			return nil, &joinError{detail: kindConflict(name, stock), mixed: true}
		default:
			others++
		}
	}
	if others >= limit {
		return nil, &joinError{detail: tooManySessions(name, limit)}
	}
	ts.all = append(ts.all, m)
	t.byID[s.ID()] = m
	if replaced != nil {
		t.leaveLocked(replaced)
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

// leave removes a session from its tunnel, when its connection ends. It is
// safe to call for a session that never joined or already left.
func (t *sessionTable) leave(s *gate.Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.byID[s.ID()]; m != nil && m.sess == s {
		t.leaveLocked(m)
	}
}

func (t *sessionTable) leaveLocked(m *member) {
	if t.byID[m.sess.ID()] == m {
		delete(t.byID, m.sess.ID())
	}
	name := m.sess.Tunnel()
	ts := t.tunnels[name]
	if ts == nil {
		return
	}
	ts.all = slices.DeleteFunc(slices.Clone(ts.all), func(o *member) bool { return o == m })
	t.setServingLocked(name, ts, slices.DeleteFunc(slices.Clone(ts.serving), func(o *member) bool { return o == m }))
	if len(ts.all) == 0 {
		delete(t.tunnels, name)
	}
}

// serve makes a joined session serve requests: frp registered its route.
func (t *sessionTable) serve(m *member) {
	name := m.sess.Tunnel()
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.tunnels[name]
	if ts == nil || !slices.Contains(ts.all, m) || slices.Contains(ts.serving, m) {
		return
	}
	t.setServingLocked(name, ts, append(slices.Clone(ts.serving), m))
}

// unserve stops a session serving requests: frp closed its route.
func (t *sessionTable) unserve(m *member) {
	name := m.sess.Tunnel()
	t.mu.Lock()
	defer t.mu.Unlock()
	if ts := t.tunnels[name]; ts != nil {
		t.setServingLocked(name, ts, slices.DeleteFunc(slices.Clone(ts.serving), func(o *member) bool { return o == m }))
	}
}

// setServingLocked replaces a tunnel's serving sessions and tells the
// registry when the tunnel starts or stops being served here. A retired
// session (a drain) does not count: its tunnel was released already.
func (t *sessionTable) setServingLocked(name string, ts *tunnelSessions, serving []*member) {
	before, after := countActive(ts.serving), countActive(serving)
	ts.serving = serving
	switch {
	case before == 0 && after > 0:
		t.reg.Hold(name)
	case before > 0 && after == 0:
		t.reg.Release(name)
	}
}

func countActive(list []*member) int {
	n := 0
	for _, m := range list {
		if !m.retired.Load() {
			n++
		}
	}
	return n
}

// pick returns a session serving tunnel name for the next request, or nil.
// Sessions take turns; one that just failed a dial (suspect), one in
// skip, and, unless retiredToo, one a drain retired, are passed over while
// another serves.
func (t *sessionTable) pick(name string, retiredToo bool, skip []*member) *member {
	t.mu.RLock()
	ts := t.tunnels[name]
	var serving []*member
	if ts != nil {
		serving = ts.serving
	}
	t.mu.RUnlock()
	if len(serving) == 0 {
		return nil
	}
	start := int(ts.next.Add(1))
	now := time.Now()
	var fallback *member
	for i := range serving {
		m := serving[(start+i)%len(serving)]
		if slices.Contains(skip, m) || (m.retired.Load() && !retiredToo) {
			continue
		}
		if m.sess.Suspect(now) || m.retired.Load() {
			if fallback == nil {
				fallback = m
			}
			continue
		}
		return m
	}
	return fallback
}

// othersServe reports whether a session of s's tunnel other than s serves,
// not retired and not suspect.
func (t *sessionTable) othersServe(s *gate.Session) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	ts := t.tunnels[s.Tunnel()]
	if ts == nil {
		return false
	}
	now := time.Now()
	for _, o := range ts.serving {
		if o.sess != s && !o.retired.Load() && !o.sess.Suspect(now) {
			return true
		}
	}
	return false
}

// serves reports whether a session that is not retired serves tunnel name.
func (t *sessionTable) serves(name string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	ts := t.tunnels[name]
	return ts != nil && countActive(ts.serving) > 0
}

// retire stops the tunnel's sessions here from taking new requests, and
// releases the tunnel in the registry, so that other replicas stop sending
// it here: a draining replica does this once another replica serves the
// tunnel. It returns the sessions retired.
func (t *sessionTable) retire(name string) []*member {
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.tunnels[name]
	if ts == nil {
		return nil
	}
	served := countActive(ts.serving) > 0
	for _, m := range ts.all {
		m.retired.Store(true)
	}
	if served {
		t.reg.Release(name)
	}
	return slices.Clone(ts.all)
}

// tunnelNames returns the names of the tunnels with sessions here, sorted.
func (t *sessionTable) tunnelNames() []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	names := make([]string, 0, len(t.tunnels))
	for n := range t.tunnels {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// sessionsOf returns the logged-in sessions of tunnel name, oldest first.
func (t *sessionTable) sessionsOf(name string) []*gate.Session {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var list []*gate.Session
	if ts := t.tunnels[name]; ts != nil {
		for _, m := range ts.all {
			list = append(list, m.sess)
		}
	}
	return list
}

// closeIdle closes the idle streams sess's handler keeps for later
// requests.
func (t *sessionTable) closeIdle(sess *gate.Session) {
	if m, ok := t.get(sess.ID()); ok && m.sess == sess {
		m.handler.CloseIdle()
	}
}

// list returns every logged-in session, by tunnel name, then oldest first.
func (t *sessionTable) list() []*member {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var list []*member
	for _, ts := range t.tunnels {
		list = append(list, ts.all...)
	}
	slices.SortStableFunc(list, func(a, b *member) int {
		if c := strings.Compare(a.sess.Tunnel(), b.sess.Tunnel()); c != 0 {
			return c
		}
		return a.sess.ConnectedAt().Compare(b.sess.ConnectedAt())
	})
	return list
}

// lookup returns the oldest logged-in session of tunnel name, for a probe
// that reports who serves a tunnel.
func (t *sessionTable) lookup(name string) (*gate.Session, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if ts := t.tunnels[name]; ts != nil && len(ts.all) > 0 {
		return ts.all[0].sess, true
	}
	return nil, false
}
