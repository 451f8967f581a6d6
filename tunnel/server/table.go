package server

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/tunnel/server/registry"
)

// sessionTable is this replica's sessions: every connection by session ID
// (frp's plugin calls name a session by ID), and the logged-in ones by
// tunnel. It is the one place that knows which sessions serve a tunnel
// here, and it tells the registry when this replica starts and stops
// serving one: the registry itself knows names and replicas only.
//
// A tunnel may have several sessions here (several client processes, or a
// client's --connections landing on one replica): requests are spread over
// those that serve, round-robin.
type sessionTable struct {
	reg registry.Registry

	mu      sync.RWMutex
	byID    map[string]*Session
	tunnels map[string]*tunnelSessions
}

// tunnelSessions are one tunnel's sessions on this replica.
type tunnelSessions struct {
	all     []*Session // logged in, oldest first
	serving []*Session // of all, those with a registered route; replaced, never changed in place
	next    atomic.Uint32
}

func newSessionTable(reg registry.Registry) *sessionTable {
	return &sessionTable{reg: reg, byID: make(map[string]*Session), tunnels: make(map[string]*tunnelSessions)}
}

// add records a new connection.
func (t *sessionTable) add(s *Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byID[s.id] = s
}

// get returns the connection with session ID id.
func (t *sessionTable) get(id string) (*Session, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s, ok := t.byID[id]
	return s, ok
}

// all returns every connection, logged in or not.
func (t *sessionTable) all() []*Session {
	t.mu.RLock()
	defer t.mu.RUnlock()
	list := make([]*Session, 0, len(t.byID))
	for _, s := range t.byID {
		list = append(list, s)
	}
	return list
}

// each calls f for every connection, logged in or not, with the table
// locked for reading: f must not call the table.
func (t *sessionTable) each(f func(*Session)) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, s := range t.byID {
		f(s)
	}
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
func (t *sessionTable) join(s *Session, limit int) (replaced *Session, err error) {
	name, runID, stock := s.Tunnel(), s.RunID(), s.stock()
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
		case o.RunID() == runID:
			replaced = o
		case o.stock() != stock:
			return nil, &joinError{detail: kindConflict(name, stock), mixed: true}
		default:
			others++
		}
	}
	if others >= limit {
		return nil, &joinError{detail: tooManySessions(name, limit)}
	}
	ts.all = append(ts.all, s)
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
func (t *sessionTable) leave(s *Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byID, s.id)
	t.leaveLocked(s)
}

func (t *sessionTable) leaveLocked(s *Session) {
	name := s.Tunnel()
	ts := t.tunnels[name]
	if ts == nil {
		return
	}
	ts.all = slices.DeleteFunc(slices.Clone(ts.all), func(o *Session) bool { return o == s })
	t.setServingLocked(name, ts, slices.DeleteFunc(slices.Clone(ts.serving), func(o *Session) bool { return o == s }))
	if len(ts.all) == 0 {
		delete(t.tunnels, name)
	}
}

// serve makes a joined session serve requests: frp registered its route.
func (t *sessionTable) serve(s *Session) {
	name := s.Tunnel()
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.tunnels[name]
	if ts == nil || !slices.Contains(ts.all, s) || slices.Contains(ts.serving, s) {
		return
	}
	t.setServingLocked(name, ts, append(slices.Clone(ts.serving), s))
}

// unserve stops a session serving requests: frp closed its route.
func (t *sessionTable) unserve(s *Session) {
	name := s.Tunnel()
	t.mu.Lock()
	defer t.mu.Unlock()
	if ts := t.tunnels[name]; ts != nil {
		t.setServingLocked(name, ts, slices.DeleteFunc(slices.Clone(ts.serving), func(o *Session) bool { return o == s }))
	}
}

// setServingLocked replaces a tunnel's serving sessions and tells the
// registry when the tunnel starts or stops being served here. A retired
// session (a drain) does not count: its tunnel was released already.
func (t *sessionTable) setServingLocked(name string, ts *tunnelSessions, serving []*Session) {
	before, after := countActive(ts.serving), countActive(serving)
	ts.serving = serving
	switch {
	case before == 0 && after > 0:
		t.reg.Hold(name)
	case before > 0 && after == 0:
		t.reg.Release(name)
	}
}

func countActive(list []*Session) int {
	n := 0
	for _, s := range list {
		if !s.retired.Load() {
			n++
		}
	}
	return n
}

// pick returns a session serving tunnel name for the next request, or nil.
// Sessions take turns; one that just failed a dial (suspect), one in
// skip, and, unless retiredToo, one a drain retired, are passed over while
// another serves.
func (t *sessionTable) pick(name string, retiredToo bool, skip []*Session) *Session {
	t.mu.RLock()
	ts := t.tunnels[name]
	var serving []*Session
	if ts != nil {
		serving = ts.serving
	}
	t.mu.RUnlock()
	if len(serving) == 0 {
		return nil
	}
	start := int(ts.next.Add(1))
	now := time.Now()
	var fallback *Session
	for i := range serving {
		s := serving[(start+i)%len(serving)]
		if slices.Contains(skip, s) || (s.retired.Load() && !retiredToo) {
			continue
		}
		if s.suspect(now) || s.retired.Load() {
			if fallback == nil {
				fallback = s
			}
			continue
		}
		return s
	}
	return fallback
}

// othersServe reports whether a session of s's tunnel other than s serves,
// not retired and not suspect.
func (t *sessionTable) othersServe(s *Session) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	ts := t.tunnels[s.Tunnel()]
	if ts == nil {
		return false
	}
	now := time.Now()
	for _, o := range ts.serving {
		if o != s && !o.retired.Load() && !o.suspect(now) {
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
func (t *sessionTable) retire(name string) []*Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.tunnels[name]
	if ts == nil {
		return nil
	}
	served := countActive(ts.serving) > 0
	for _, s := range ts.all {
		s.retired.Store(true)
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
func (t *sessionTable) sessionsOf(name string) []*Session {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if ts := t.tunnels[name]; ts != nil {
		return slices.Clone(ts.all)
	}
	return nil
}

// list returns every logged-in session, by tunnel name, then oldest first.
func (t *sessionTable) list() []*Session {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var list []*Session
	for _, ts := range t.tunnels {
		list = append(list, ts.all...)
	}
	slices.SortStableFunc(list, func(a, b *Session) int {
		if c := strings.Compare(a.Tunnel(), b.Tunnel()); c != 0 {
			return c
		}
		return a.connectedAt.Compare(b.connectedAt)
	})
	return list
}

// lookup returns the oldest logged-in session of tunnel name, for a probe
// that reports who serves a tunnel.
func (t *sessionTable) lookup(name string) (*Session, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if ts := t.tunnels[name]; ts != nil && len(ts.all) > 0 {
		return ts.all[0], true
	}
	return nil, false
}
