package client

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tether-dev/tether/proxy"
)

// Session states, as /status and the tether_client_sessions metric name them.
const (
	// StateConnecting is a slot without a session of its own: dialling,
	// logging in, or waiting before its next attempt.
	StateConnecting = "connecting"
	// StateLoggedIn is a session whose login the server accepted, its route
	// not (yet) registered.
	StateLoggedIn = "logged in"
	// StateReady is a session that serves the tunnel.
	StateReady = "ready"
	// StateMoving is a session whose server replica drains: it serves until
	// the server closes it, while its slot's replacement comes up.
	StateMoving = "moving"
	// StateSpreading is a session a slot opened beside its own, which
	// shares a replica with another slot's, to reach a replica no other
	// slot holds: once it serves there, it takes the slot over.
	StateSpreading = "spreading"
	// StateLeaving is a session that gave its slot over to one on another
	// replica: its route is withdrawn, and it closes once its requests end.
	StateLeaving = "leaving"
)

var sessionStates = []string{StateConnecting, StateLoggedIn, StateReady, StateMoving, StateSpreading, StateLeaving}

// How a slot that shares its replica with another slot's session keeps
// trying to reach another replica (spreading): a round of up to maxRedials
// sessions in a row, each opened beside the shared one, which serves
// meanwhile; the first that lands on a replica no other slot holds takes
// the slot over once it serves, and the shared one then leaves. After a
// round that reached none, the next waits twice as long as the last, from
// minSpreadDelay up to maxSpreadDelay (jittered: half of it to all of it).
const (
	minSpreadDelay = time.Second
	maxSpreadDelay = 30 * time.Second
)

// status is what the client knows about its slots and their sessions, for
// readiness, the /status endpoint, metrics and the slots' decisions (which
// replicas the other slots hold). One lock guards it all, so that a slot
// checks and records where its session landed in one step.
type status struct {
	tunnel, server, transport string
	routes                    []proxy.Route

	mu            sync.Mutex
	slots         []*slotState
	connections   int // successful connections, every slot
	failures      int
	loginRejected int
}

// wake is how a slot learns that something that decides whether it should
// spread changed (a session of any slot landed, became ready or ended):
// one channel per slot, with room for one wake-up.
func (s *status) wake(sl int) <-chan struct{} { return s.slots[sl].wake }

func (s *status) wakeAllLocked() {
	for _, st := range s.slots {
		select {
		case st.wake <- struct{}{}:
		default:
		}
	}
}

// slotState is one slot: its live sessions (at most two: one moving away
// and its replacement) and what it last failed with.
type slotState struct {
	index       int
	sessions    []*sessionState // oldest first
	idleSince   time.Time       // since when it has had no current session
	lastError   string
	lastErrorAt time.Time
	// redials counts the sessions closed in a row because they landed on a
	// replica another slot holds.
	redials int
	// left is the replica the slot's last session left because another
	// slot held it, until a session lands elsewhere.
	left string
	// reconnects counts the sessions after the first, not counting those
	// that replaced a session closed for landing on a held replica.
	reconnects int
	connected  bool // a session has been connected before
	lastRedial bool // the last session to end was closed for a held replica
	// identity is the run ID (of the slot's two) that its sessions log in
	// with; a spreading session logs in with the other, so that landing
	// where the slot's own session is replaces nothing, and gives the slot
	// its run ID when it takes the slot over.
	identity int
	// Spreading: the tries of the current round, the rounds that reached
	// no other replica, and when the next try is due (zero: none planned).
	spreadTries, spreadRounds int
	spreadAt                  time.Time
	wake                      chan struct{}
}

// sessionState is one connection of a slot to the server.
type sessionState struct {
	slot        *slotState
	via         string
	connectedAt time.Time
	since       time.Time // when it entered its current state
	loggedIn    bool
	loggedInAt  time.Time
	routeUp     bool
	routeError  string
	replica     string // from the server's hello
	id          string // the server's session ID, from its hello
	moving      bool   // told to move
	movePending bool   // told to move while an earlier session of the slot still moves
	moveNow     chan struct{}
	redial      bool // closed by the client to land on another replica
	ended       bool
	identity    int  // the slot's run ID it logged in with (slotState.identity)
	alone       bool // the server said it is the only replica
	// A spreading session (spreading) that landed on a replica no other
	// slot holds (keep) takes the slot over once it serves: kept is closed
	// then.
	spreading, keep bool
	kept            chan struct{}
	// leaving is set, and leaveNow closed, when the session gives the slot
	// over to a spreading one.
	leaving  bool
	leaveNow chan struct{}
}

func newStatus(tunnel, server, transport string, routes []proxy.Route, slots int, now time.Time) *status {
	s := &status{tunnel: tunnel, server: server, transport: transport, routes: routes}
	for i := range slots {
		s.slots = append(s.slots, &slotState{index: i, idleSince: now, wake: make(chan struct{}, 1)})
	}
	return s
}

// onConnected records a new session of slot sl, connected via via: a
// spreading one when spreading is set. It returns the session's state,
// which says the run ID it logs in with (identity).
func (s *status) onConnected(sl int, via string, spreading bool) *sessionState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.slots[sl]
	now := time.Now()
	ss := &sessionState{
		slot: st, via: via, connectedAt: now, since: now, identity: st.identity,
		moveNow: make(chan struct{}), kept: make(chan struct{}), leaveNow: make(chan struct{}),
	}
	st.sessions = append(st.sessions, ss)
	s.connections++
	if spreading {
		ss.spreading, ss.identity = true, 1-st.identity
		st.spreadAt = time.Time{}
		return ss
	}
	if st.connected && !st.lastRedial {
		st.reconnects++
	}
	st.connected, st.lastRedial = true, false
	return ss
}

// onAdopted makes spreading session ss the slot's own: the slot's session
// ended, or moves away, before ss took the slot over.
func (s *status) onAdopted(ss *sessionState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ss.spreading {
		return
	}
	ss.spreading, ss.keep = false, false
	ss.slot.identity = ss.identity
	ss.since = time.Now()
}

// onSpreadFailed records a spreading try of slot sl that could not connect.
func (s *status) onSpreadFailed(sl int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.slots[sl]
	st.lastError, st.lastErrorAt = err.Error(), time.Now()
	s.failures++
	s.spreadMissedLocked(st)
}

// spreadMissedLocked plans the next try after one that reached no other
// replica: at once within a round, after the round's delay at its end.
func (s *status) spreadMissedLocked(st *slotState) {
	now := time.Now()
	if st.spreadTries++; st.spreadTries < maxRedials {
		st.spreadAt = now
		return
	}
	st.spreadTries = 0
	st.spreadAt = now.Add(spreadDelay(st.spreadRounds))
	st.spreadRounds++
}

// spreadDelay is the wait after round rounds (from 0) reached no other
// replica: minSpreadDelay doubled each round up to maxSpreadDelay,
// jittered down to half of it.
func spreadDelay(rounds int) time.Duration {
	d := maxSpreadDelay
	if rounds < 5 && minSpreadDelay<<rounds < maxSpreadDelay {
		d = minSpreadDelay << rounds
	}
	return d/2 + rand.N(d/2+1) //nolint:gosec // jitter, not a secret
}

// planSpread returns when slot sl should next try to reach another
// replica, and false when it should not: its session is not ready, does
// not share its replica with a slot of a lower index (of the slots on one
// replica, the lowest stays and the others try), or is on the server's
// only replica, or a try is under way. A slot found sharing starts its
// first round after minSpreadDelay at most.
func (s *status) planSpread(sl int) (at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.slots[sl]
	cur := st.current()
	if cur == nil || !cur.ready() || cur.alone || !slices.ContainsFunc(s.sharersLocked(cur), func(o int) bool { return o < sl }) {
		st.spreadTries, st.spreadRounds, st.spreadAt = 0, 0, time.Time{}
		return time.Time{}, false
	}
	for _, ss := range st.sessions {
		if ss.spreading {
			return time.Time{}, false
		}
	}
	if st.spreadAt.IsZero() {
		st.spreadAt = time.Now().Add(spreadDelay(0))
	}
	return st.spreadAt, true
}

// sharersLocked returns the other slots whose sessions hold the replica of
// ss: their own sessions, or spreading ones that will take them over. A
// session that moves away, leaves or was closed to land elsewhere holds
// nothing for good.
func (s *status) sharersLocked(ss *sessionState) []int {
	var slots []int
	if ss.replica == "" {
		return nil
	}
	for _, o := range s.slots {
		if o == ss.slot {
			continue
		}
		for _, os := range o.sessions {
			if os.replica == ss.replica && !os.moving && !os.redial && !os.leaving && (!os.spreading || os.keep) {
				slots = append(slots, o.index)
				break
			}
		}
	}
	return slots
}

// onEnded forgets an ended session. It reports whether the session had
// logged in, whether it was told to move (or gave its slot over to another
// session) and whether the client closed it to land on another replica.
func (s *status) onEnded(ss *sessionState) (loggedIn, moved, redial bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.wakeAllLocked()
	st := ss.slot
	ss.ended = true
	for i, o := range st.sessions {
		if o == ss {
			st.sessions = append(st.sessions[:i], st.sessions[i+1:]...)
			break
		}
	}
	switch {
	case ss.spreading:
		s.spreadMissedLocked(st)
		return ss.loggedIn, false, true
	case ss.leaving:
		return ss.loggedIn, true, false
	}
	if ss.moving {
		// The slot's later session may have been told to move meanwhile:
		// its replacement starts now.
		for _, o := range st.sessions {
			if o.movePending {
				o.movePending = false
				close(o.moveNow)
			}
		}
	} else {
		st.idleSince = time.Now()
		st.lastRedial = ss.redial
	}
	return ss.loggedIn, ss.moving, ss.redial
}

func (s *status) onLoggedIn(ss *sessionState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss.loggedIn, ss.loggedInAt = true, time.Now()
	if !ss.moving {
		ss.since = ss.loggedInAt
	}
	ss.slot.lastError = ""
}

// onRoute records the server's answer to the session's route registration.
// A spreading session that landed on a replica no other slot holds takes
// its slot over once its route is up: the slot's own session leaves.
func (s *status) onRoute(ss *sessionState, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.wakeAllLocked()
	up := err == nil
	if up != ss.routeUp && !ss.moving {
		ss.since = time.Now()
	}
	ss.routeUp, ss.routeError = up, ""
	if err != nil {
		ss.routeError = err.Error()
	}
	s.takeOverLocked(ss)
}

// takeOverLocked makes spreading session ss the slot's own once it both
// landed on a replica no other slot holds (keep) and serves there: the
// slot's session on the shared replica leaves. The server's hello and the
// route's registration come on different streams, in either order.
func (s *status) takeOverLocked(ss *sessionState) {
	if !ss.spreading || !ss.keep || !ss.ready() || ss.ended {
		return
	}
	st := ss.slot
	now := time.Now()
	if old := st.current(); old != nil {
		old.leaving, old.since = true, now
		close(old.leaveNow)
	}
	ss.spreading, ss.keep, ss.since = false, false, now
	st.identity = ss.identity
	st.spreadTries, st.spreadRounds, st.spreadAt = 0, 0, time.Time{}
	close(ss.kept)
}

// onFailed records a failed attempt of slot sl: before a session was
// connected (ss nil), or on session ss.
func (s *status) onFailed(sl int, ss *sessionState, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.slots[sl]
	st.lastError, st.lastErrorAt = err.Error(), time.Now()
	if ss != nil {
		s.loginRejected++
	} else {
		s.failures++
	}
}

// leaving reports whether the client closed ss to land on another replica.
func (s *status) leaving(ss *sessionState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ss.redial
}

// landing is where a session landed (onHello), for the slot's next step.
type landing struct {
	// leave: the client closes the session, which landed on a replica
	// another slot holds, to try again.
	leave bool
	// holder is that other slot, or -1.
	holder int
	// left is the replica the slot's earlier sessions left, when this one
	// stays.
	left string
	// spreading: the session was a try to leave a shared replica.
	spreading bool
}

// onHello records the replica and server session ID of ss, and whether
// the server is the only replica (alone). A session that lands on a
// replica another slot holds leaves it, while the slot has left fewer than
// tries times in a row; a spreading session leaves it always, and the
// slot's own replica too.
func (s *status) onHello(ss *sessionState, replica, id string, alone bool, tries int) landing {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.wakeAllLocked()
	ss.replica, ss.id, ss.alone = replica, id, alone
	st := ss.slot
	l := landing{holder: -1, spreading: ss.spreading}
	if sharers := s.sharersLocked(ss); len(sharers) > 0 {
		l.holder = sharers[0]
	}
	if ss.spreading {
		if own := st.current(); l.holder >= 0 || own != nil && own.replica == replica {
			ss.redial, l.leave = true, true
			return l
		}
		ss.keep = true
		s.takeOverLocked(ss)
		return l
	}
	if l.holder >= 0 && st.redials < tries && !ss.moving {
		st.redials++
		st.left = replica
		ss.redial, l.leave = true, true
		return l
	}
	if l.holder < 0 {
		st.redials = 0
	}
	l.left, st.left = st.left, ""
	return l
}

// onMove records that the server wants ss to move. now reports whether
// the slot should start the replacement now; it starts later (ss.moveNow is
// closed then) when an earlier session of the slot is still moving away, so
// that a slot never holds more than two sessions. It reports first false
// when ss was already told to move.
func (s *status) onMove(ss *sessionState) (first, now bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.moving || ss.ended || ss.leaving {
		return false, false
	}
	defer s.wakeAllLocked()
	st := ss.slot
	ss.moving, ss.since = true, time.Now()
	st.idleSince = ss.since
	for _, o := range st.sessions {
		if o != ss && o.moving {
			ss.movePending = true
			return true, false
		}
	}
	close(ss.moveNow)
	return true, true
}

// ready reports whether ss serves the tunnel. A leaving session withdrew
// its route.
func (ss *sessionState) ready() bool { return ss.loggedIn && ss.routeUp && !ss.leaving }

func (ss *sessionState) state() string {
	switch {
	case ss.moving:
		return StateMoving
	case ss.leaving:
		return StateLeaving
	case ss.spreading:
		return StateSpreading
	case ss.ready():
		return StateReady
	case ss.loggedIn:
		return StateLoggedIn
	}
	return StateConnecting
}

// current is the slot's own session: not moving away, not leaving, not
// spreading; or nil.
func (st *slotState) current() *sessionState {
	for _, ss := range st.sessions {
		if !ss.moving && !ss.leaving && !ss.spreading {
			return ss
		}
	}
	return nil
}

// readiness is true while a session of any slot is logged in with its
// route registered; otherwise reason says what each slot is missing.
func (s *status) readiness() (ready bool, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readinessLocked()
}

func (s *status) readinessLocked() (ready bool, reason string) {
	for _, st := range s.slots {
		for _, ss := range st.sessions {
			if ss.ready() {
				return true, "ready"
			}
		}
	}
	if len(s.slots) == 1 {
		return false, s.slots[0].missing()
	}
	// Slots that miss the same thing are named together: two slots refused
	// by one server read as one line.
	var order []string
	bySlots := map[string][]string{}
	for _, st := range s.slots {
		m := st.missing()
		if _, ok := bySlots[m]; !ok {
			order = append(order, m)
		}
		bySlots[m] = append(bySlots[m], fmt.Sprint(st.index))
	}
	parts := make([]string, len(order))
	for i, m := range order {
		if n := bySlots[m]; len(n) == 1 {
			parts[i] = "slot " + n[0] + ": " + m
		} else {
			parts[i] = "slots " + strings.Join(n, ", ") + ": " + m
		}
	}
	return false, strings.Join(parts, "; ")
}

// missing says what keeps a slot from serving, with its cause.
func (st *slotState) missing() string {
	var connected, loggedIn *sessionState
	for _, ss := range st.sessions {
		if ss.loggedIn {
			loggedIn = ss
		}
		connected = ss
	}
	switch {
	case loggedIn != nil:
		return withCause("logged in, route not registered", loggedIn.routeError)
	case connected != nil:
		return withCause("connected, not logged in", st.lastError)
	}
	return withCause("not connected to the tunnel server", st.lastError)
}

func withCause(what, cause string) string {
	if cause == "" {
		return what
	}
	return what + ": " + cause
}

// Snapshot is the client's state as /status reports it. The top-level
// fields describe the tunnel as a whole, over all its sessions.
type Snapshot struct {
	Tunnel    string `json:"tunnel"`
	Server    string `json:"server"`
	Transport string `json:"transport"`
	// Via is the path of the oldest live session.
	Via   string `json:"via,omitempty"`
	Ready bool   `json:"ready"`
	// State is "ready", or what each slot is missing.
	State string `json:"state"`
	// Connected is true while any session is connected.
	Connected bool `json:"connected"`
	// ConnectedSince and LoggedInSince are those of the oldest live session.
	ConnectedSince *time.Time `json:"connected_since,omitempty"`
	LoggedInSince  *time.Time `json:"logged_in_since,omitempty"`
	// LastError is the newest error of any slot; a slot forgets its error
	// when it logs in.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// Reconnects sums the slots' reconnections.
	Reconnects int          `json:"reconnects"`
	Routes     []RouteState `json:"routes"`
	// Connections is the number of slots (--connections); 0 from a client
	// older than sessions.
	Connections int `json:"connections,omitempty"`
	// Sessions lists each slot's live sessions, and a "connecting" entry for
	// a slot without a current one.
	Sessions []SessionState `json:"sessions,omitempty"`
	// Token is the token the client logs in with; nil from a client older
	// than renewals.
	Token *TokenState `json:"token,omitempty"`
}

// RouteState is one configured route as /status reports it.
type RouteState struct {
	Prefix   string `json:"prefix"`
	Upstream string `json:"upstream"`
	Adapter  string `json:"adapter"`
}

// SessionState is one session of a slot as /status reports it.
type SessionState struct {
	Slot int `json:"slot"`
	// Replica and Session are the server replica and its session ID, as the
	// server announced them ("" until it does, and from servers that do not).
	Replica string `json:"replica,omitempty"`
	Session string `json:"session,omitempty"`
	// State is connecting, logged in, ready or moving.
	State string `json:"state"`
	// Since is when the session (or the slot, connecting) entered State.
	Since     *time.Time `json:"since,omitempty"`
	Via       string     `json:"via,omitempty"`
	LastError string     `json:"last_error,omitempty"`
	// SharesReplicaWith lists the other slots with a session on this
	// session's replica: if that replica goes, they all go at once. While
	// the server has other replicas, the slots but the lowest of them keep
	// trying to reach one (NextTry), and their sessions serve meanwhile.
	SharesReplicaWith []int `json:"shares_replica_with,omitempty"`
	// NextTry is when the slot next tries to reach another replica; empty
	// while a try is under way (a spreading session) or none is planned.
	NextTry *time.Time `json:"next_try,omitempty"`
}

func (s *status) snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	ready, state := s.readinessLocked()
	snap := Snapshot{
		Tunnel: s.tunnel, Server: s.server, Transport: s.transport, Ready: ready, State: state,
		Connections: len(s.slots),
	}
	var oldest, oldestLoggedIn *sessionState
	var newestErr *slotState
	for _, st := range s.slots {
		snap.Reconnects += st.reconnects
		if st.lastError != "" && (newestErr == nil || st.lastErrorAt.After(newestErr.lastErrorAt)) {
			newestErr = st
		}
		for _, ss := range st.sessions {
			if oldest == nil || ss.connectedAt.Before(oldest.connectedAt) {
				oldest = ss
			}
			if ss.loggedIn && (oldestLoggedIn == nil || ss.loggedInAt.Before(oldestLoggedIn.loggedInAt)) {
				oldestLoggedIn = ss
			}
		}
		snap.Sessions = append(snap.Sessions, s.entriesLocked(st)...)
	}
	if oldest != nil {
		snap.Connected, snap.Via, snap.ConnectedSince = true, oldest.via, timePtr(oldest.connectedAt)
	}
	if oldestLoggedIn != nil {
		snap.LoggedInSince = timePtr(oldestLoggedIn.loggedInAt)
	}
	if newestErr != nil {
		snap.LastError, snap.LastErrorAt = newestErr.lastError, timePtr(newestErr.lastErrorAt)
	}
	for _, r := range s.routes {
		snap.Routes = append(snap.Routes, RouteState{Prefix: r.Prefix, Upstream: r.Upstream.String(), Adapter: r.Adapter})
	}
	return snap
}

// entriesLocked are the slot's lines in /status: its sessions, and
// "connecting" while it has no current one.
func (s *status) entriesLocked(st *slotState) []SessionState {
	var out []SessionState
	cur := st.current()
	for _, ss := range st.sessions {
		e := SessionState{Slot: st.index, Replica: ss.replica, Session: ss.id, State: ss.state(), Since: timePtr(ss.since), Via: ss.via, LastError: ss.routeError}
		if ss == cur && !ss.loggedIn {
			e.LastError = st.lastError
		}
		if ss == cur {
			e.SharesReplicaWith = s.sharersLocked(ss)
			if len(e.SharesReplicaWith) > 0 && !st.spreadAt.IsZero() {
				e.NextTry = timePtr(st.spreadAt)
			}
		}
		out = append(out, e)
	}
	if cur == nil {
		out = append(out, SessionState{Slot: st.index, State: StateConnecting, Since: timePtr(st.idleSince), LastError: st.lastError})
	}
	return out
}

func timePtr(t time.Time) *time.Time { t = t.UTC(); return &t }

// collectors exposes the status as Prometheus metrics.
func (s *status) collectors() []prometheus.Collector {
	read := func(f func() float64) func() float64 {
		return func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return f()
		}
	}
	boolean := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_client_ready", Help: "1 while a session of the tunnel is logged in and its route registered.",
		}, read(func() float64 { ok, _ := s.readinessLocked(); return boolean(ok) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_client_connected", Help: "1 while a connection to the tunnel server is up.",
		}, read(func() float64 {
			for _, st := range s.slots {
				if len(st.sessions) > 0 {
					return 1
				}
			}
			return 0
		})),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_client_connections_total", Help: "Connections established to the tunnel server, by all slots.",
		}, read(func() float64 { return float64(s.connections) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_client_connect_failures_total", Help: "Connection attempts that failed before login (DNS, TCP, proxy, TLS).",
		}, read(func() float64 { return float64(s.failures) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_client_login_rejections_total", Help: "Logins the server rejected (token expired, wrong key, ...).",
		}, read(func() float64 { return float64(s.loginRejected) })),
	}
	for _, state := range sessionStates {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "tether_client_sessions",
			Help:        "Sessions by state, as /status lists them: a slot without a session of its own counts as connecting.",
			ConstLabels: prometheus.Labels{"state": stateLabel(state)},
		}, read(func() float64 {
			n := 0
			for _, st := range s.slots {
				for _, e := range s.entriesLocked(st) {
					if e.State == state {
						n++
					}
				}
			}
			return float64(n)
		})))
	}
	return cs
}

// stateLabel is state as a label value: snake_case, as every label value
// of tether's metrics is ("logged in" is "logged_in"); /status keeps the
// words.
func stateLabel(state string) string { return strings.ReplaceAll(state, " ", "_") }

// healthHandler serves the client's health address:
//
//	/healthz  200 while the process runs
//	/readyz   200 only while a session is logged in with its route registered
//	/status   the state as JSON (what `tether status` prints)
//	/metrics  Prometheus
//	/debug/logs  the client's last log lines, JSON, oldest first
func (c *Client) healthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, reason := c.status.readiness(); !ok {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+reason)
			return
		}
		writeText(w, http.StatusOK, "ready")
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		snap := c.status.snapshot()
		snap.Token = c.tokens.snapshot(time.Now())
		_ = enc.Encode(snap)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/logs", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		c.logs.writeTo(w)
	})
	return mux
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body + "\n"))
}

// LocalHealthAddr is where a process on the same host reaches a client whose
// --health-addr is listenAddr: a wildcard host (0.0.0.0, [::] or none), which
// is how the client listens in a pod, becomes loopback.
func LocalHealthAddr(listenAddr string) string {
	host, port, err := net.SplitHostPort(listenAddr)
	if err != nil {
		return listenAddr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}
