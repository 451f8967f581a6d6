package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"go.uber.org/zap"
)

// Revocation takes back a tunnel's or a token's right to log in: while it
// lasts, the server refuses their logins and closes their sessions.
type Revocation struct {
	// ID names the revocation, for DELETE /api/revocations/{id}. It is set
	// by Add; IDs sort in the order the revocations were made.
	ID string `json:"id"`
	// Tunnel is the revoked tunnel: every token of it. Exactly one of
	// Tunnel and JTI is set.
	Tunnel string `json:"tunnel,omitempty"`
	// JTI is the revoked token's ID (jti): that token, and every token
	// renewed from it (which carries its jti as the original).
	JTI string `json:"jti,omitempty"`
	// Until is when the revocation ends; zero means never.
	Until time.Time `json:"until,omitzero"`
	// Reason is the operator's note, shown in listings and logs.
	Reason string `json:"reason,omitempty"`
	// CreatedAt is when Add stored it.
	CreatedAt time.Time `json:"created_at"`
}

// ErrInvalidRevocation is wrapped by every error of Add about what it was
// given (the admin API answers 400 to it).
var ErrInvalidRevocation = errors.New("invalid revocation")

// ErrNotFound is returned by Delete for an ID that names no revocation.
var ErrNotFound = errors.New("not found")

// ErrTooManyRevocations is returned by Add when MaxRevocations are in force.
var ErrTooManyRevocations = errors.New("too many revocations")

// MaxRevocations bounds how many revocations are kept, so that the set every
// replica holds in memory and checks at each login stays small.
const MaxRevocations = 100_000

// Bounds of a revocation's fields.
const (
	maxTunnelLength = 253 // auth allows 63
	maxJTILength    = 256
	maxReasonLength = 512
)

// active reports whether the revocation is in force at now.
func (r Revocation) active(now time.Time) bool { return r.Until.IsZero() || now.Before(r.Until) }

// outlasts reports whether r is in force at least as long as o.
func (r Revocation) outlasts(o Revocation) bool {
	return r.Until.IsZero() || (!o.Until.IsZero() && !r.Until.Before(o.Until))
}

// validate reports every problem of a revocation to add at now.
func (r Revocation) validate(now time.Time) error {
	var errs []error
	switch {
	case r.Tunnel != "" && r.JTI != "":
		errs = append(errs, errors.New("it names both a tunnel and a token ID (jti); revoke one of them (--tunnel NAME or --jti ID)"))
	case r.Tunnel == "" && r.JTI == "":
		errs = append(errs, errors.New("it names neither a tunnel nor a token ID (jti); give --tunnel NAME or --jti ID"))
	case r.Tunnel != "":
		if err := validKey("--tunnel", r.Tunnel, maxTunnelLength); err != nil {
			errs = append(errs, err)
		}
	default:
		if err := validKey("--jti", r.JTI, maxJTILength); err != nil {
			errs = append(errs, err)
		}
	}
	if !r.Until.IsZero() && !r.Until.After(now) {
		errs = append(errs, fmt.Errorf("--until %s is not in the future; leave it out to revoke for good", r.Until.Format(time.RFC3339)))
	}
	if len(r.Reason) > maxReasonLength {
		errs = append(errs, fmt.Errorf("--reason is %d bytes long; want at most %d", len(r.Reason), maxReasonLength))
	} else if !printable(r.Reason) {
		errs = append(errs, errors.New("--reason holds control characters or invalid UTF-8; want one line of text"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRevocation, err)
	}
	return nil
}

// validKey checks a tunnel name or a token ID as far as the registry needs:
// a bounded run of printable ASCII without spaces, fit for a map key, a
// Redis key and a log line. The server checks a tunnel name in full
// (auth.ValidTunnelName) before it gets here.
func validKey(flag, v string, limit int) error {
	if len(v) > limit {
		return fmt.Errorf("%s is %d characters long; want at most %d", flag, len(v), limit)
	}
	for _, c := range []byte(v) {
		if c <= ' ' || c >= 0x7f {
			return fmt.Errorf("%s %q holds %q; want printable ASCII without spaces", flag, v, c)
		}
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control characters, so
// that it can go into a log line and a terminal as it is.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	return !strings.ContainsFunc(s, unicode.IsControl)
}

// newID returns an ID that sorts by creation: the millisecond in 12 hex
// digits, strictly increasing here (a burst borrows from the next
// milliseconds), then 8 random ones so that replicas making revocations at
// the same moment do not collide.
func (r *Revocations) newID(now time.Time) string {
	ms := now.UnixMilli()
	for {
		last := r.lastMS.Load()
		if ms <= last {
			ms = last + 1
		}
		if r.lastMS.CompareAndSwap(last, ms) {
			break
		}
	}
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
	return fmt.Sprintf("%012x", ms) + hex.EncodeToString(b[:])
}

// revocationSet is one immutable view of the revocations, indexed for the
// check at each login. A change builds a new set.
type revocationSet struct {
	// version is the store's version of the set it was loaded from; the
	// Redis backend reloads when Redis has another.
	version uint64
	byID    map[string]Revocation
	// tunnel and jti hold, per key, the revocation that lasts longest: if
	// any of a key's revocations is in force, that one is.
	tunnel map[string]Revocation
	jti    map[string]Revocation
}

func newRevocationSet(version uint64, byID map[string]Revocation) *revocationSet {
	s := &revocationSet{version: version, byID: byID, tunnel: map[string]Revocation{}, jti: map[string]Revocation{}}
	for _, r := range byID {
		m, key := s.tunnel, r.Tunnel
		if r.JTI != "" {
			m, key = s.jti, r.JTI
		}
		if old, ok := m[key]; !ok || r.outlasts(old) {
			m[key] = r
		}
	}
	return s
}

// sameAs reports whether s and o hold the same revocations.
func (s *revocationSet) sameAs(o *revocationSet) bool {
	return maps.Equal(s.byID, o.byID)
}

// revocationBackend keeps the revocations where Backing says. Its methods
// are safe for concurrent use.
type revocationBackend interface {
	// add stores rev, unless limit revocations are stored already
	// (ErrTooManyRevocations). It returns once rev is durable.
	add(ctx context.Context, rev Revocation, limit int) error
	// remove deletes the revocations with these IDs and returns how many
	// there were.
	remove(ctx context.Context, ids ...string) (int, error)
	// load reads every stored revocation and the version of the set; cur
	// is the copy in memory.
	load(ctx context.Context, cur *revocationSet) (version uint64, revs map[string]Revocation, err error)
	// watch keeps r current with changes made elsewhere until ctx ends.
	watch(ctx context.Context, r *Revocations)
	close() error
}

// Revocations is the set of revocations, shared by the replicas as Backing
// says (the package doc tells how), with a copy in memory that Revoked
// checks without locks or I/O.
type Revocations struct {
	backend revocationBackend
	kind    string
	log     *zap.Logger
	// set is what Revoked reads.
	set    atomic.Pointer[revocationSet]
	ready  chan struct{} // closed once set was loaded from the store
	health *outage
	lastMS atomic.Int64 // of the last ID made here

	// mu serialises changes of set, and guards what follows.
	mu      sync.Mutex
	changed chan struct{} // closed at the next change of set
	loaded  bool          // ready is closed
	gen     uint64        // counts the changes made here

	closeOnce sync.Once
	closeErr  error
}

// revocationPrune is how often expired revocations are deleted from the
// store (Revoked ignores them from the moment they end).
const revocationPrune = time.Minute

// NewRevocations returns the revocations kept as b says. With a data
// directory it reads them from the file at once; with Redis, Run loads them
// and Ready tells when. It starts no goroutine.
func NewRevocations(b Backing, log *zap.Logger) (*Revocations, error) {
	if err := b.valid(); err != nil {
		return nil, err
	}
	log = log.Named("revocations")
	r := &Revocations{kind: b.Kind(), log: log, ready: make(chan struct{}), changed: make(chan struct{})}
	r.set.Store(newRevocationSet(0, map[string]Revocation{}))
	switch b.Kind() {
	case KindRedis:
		r.backend = newRedisRevocations(b.Redis, log)
		r.health = newOutage(log, "revocations", b.Redis.Target())
	case KindDataDir:
		r.backend = boltRevocations{b.Store.db}
	default:
		r.backend = &memoryRevocations{byID: map[string]Revocation{}}
	}
	if r.kind != KindRedis {
		if err := r.reload(context.Background()); err != nil {
			return nil, fmt.Errorf("read the revocations in %s: %w", b.Store.Path(), err)
		}
	}
	return r, nil
}

// Kind says where the revocations are kept: KindRedis, KindDataDir, or
// KindMemory (lost when the process ends).
func (r *Revocations) Kind() string { return r.kind }

// Ready is closed once the revocations have been loaded: at once from a
// data directory or memory, and at Run's first successful read of Redis.
// Until then Revoked knows of none.
func (r *Revocations) Ready() <-chan struct{} { return r.ready }

// Revoked returns the revocation in force, if any, against a login by
// tunnel with the token jti, renewed from the token originalJTI (empty when
// it was not renewed). It reads an in-memory copy: no lock, no I/O, no
// allocation; it runs at every login.
func (r *Revocations) Revoked(tunnel, jti, originalJTI string) (Revocation, bool) {
	s := r.set.Load()
	if len(s.byID) == 0 {
		return Revocation{}, false
	}
	var now time.Time
	for _, k := range [...]struct {
		m   map[string]Revocation
		key string
	}{{s.tunnel, tunnel}, {s.jti, jti}, {s.jti, originalJTI}} {
		if k.key == "" {
			continue
		}
		if rev, ok := k.m[k.key]; ok {
			if now.IsZero() {
				now = time.Now()
			}
			if rev.active(now) {
				return rev, true
			}
		}
	}
	return Revocation{}, false
}

// Changed returns a channel that is closed at the next change of the
// revocations, made here or, as Run learns it, by another replica.
// Get the channel before checking the sessions, so that a change made
// during the check is not missed:
//
//	for {
//		ch := revs.Changed()
//		closeRevokedSessions() // calls Revoked for each session
//		select {
//		case <-ch:
//		case <-ctx.Done():
//			return
//		}
//	}
func (r *Revocations) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// Add validates rev (errors wrap ErrInvalidRevocation), gives it an ID and
// CreatedAt, and stores it: the call returns once it is durable where the
// revocations are kept, and Revoked on this replica knows it. The other
// replicas learn it within about a second.
func (r *Revocations) Add(ctx context.Context, rev Revocation) (Revocation, error) {
	now := time.Now()
	if err := rev.validate(now); err != nil {
		return Revocation{}, err
	}
	rev.ID, rev.CreatedAt = r.newID(now), now.UTC().Truncate(time.Millisecond)
	if !rev.Until.IsZero() {
		rev.Until = rev.Until.UTC()
	}
	if err := r.backend.add(ctx, rev, MaxRevocations); err != nil {
		if errors.Is(err, ErrTooManyRevocations) {
			return Revocation{}, fmt.Errorf("%d revocations are in force, the most tether keeps; delete some or let those with --until end: %w", MaxRevocations, err)
		}
		return Revocation{}, fmt.Errorf("store revocation of %s: %w", rev.subject(), err)
	}
	r.update(func(m map[string]Revocation) { m[rev.ID] = rev })
	r.log.Info("revocation added", rev.fields()...)
	return rev, nil
}

// Delete removes the revocation id (ErrNotFound if there is none) and
// returns it. The other replicas learn it within about a second.
func (r *Revocations) Delete(ctx context.Context, id string) (Revocation, error) {
	rev, known := r.set.Load().byID[id]
	n, err := r.backend.remove(ctx, id)
	if err != nil {
		return Revocation{}, fmt.Errorf("delete revocation %s: %w", id, err)
	}
	r.update(func(m map[string]Revocation) { delete(m, id) })
	if n == 0 {
		return Revocation{}, fmt.Errorf("revocation %q: %w; list them with `tether token revocations`", id, ErrNotFound)
	}
	if !known {
		rev = Revocation{ID: id}
	}
	r.log.Info("revocation deleted", rev.fields()...)
	return rev, nil
}

// List reads the revocations in force from the store (so that it shows what
// another replica did a moment ago) and returns them by ID, the oldest
// first.
func (r *Revocations) List(ctx context.Context) ([]Revocation, error) {
	if err := r.reload(ctx); err != nil {
		return nil, fmt.Errorf("read revocations: %w", err)
	}
	now := time.Now()
	var list []Revocation
	for _, rev := range r.set.Load().byID {
		if rev.active(now) {
			list = append(list, rev)
		}
	}
	slices.SortFunc(list, func(a, b Revocation) int { return strings.Compare(a.ID, b.ID) })
	return list, nil
}

// Run keeps the revocations current until ctx ends: with Redis it loads
// them, follows the other replicas' changes (a pub/sub channel, and a check
// every second that repairs a missed message), and rides out outages; with
// any backing it deletes expired revocations from the store. Call it once.
func (r *Revocations) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { r.backend.watch(ctx, r) })
	wg.Go(func() { r.pruneLoop(ctx) })
	wg.Wait()
	return nil
}

// Close releases the connection to Redis, if any. It is idempotent; call
// it after Run returned.
func (r *Revocations) Close() error {
	r.closeOnce.Do(func() { r.closeErr = r.backend.close() })
	return r.closeErr
}

func (r *Revocations) isReady() bool {
	select {
	case <-r.ready:
		return true
	default:
		return false
	}
}

// RevocationsStatus is what Revocations report for readiness and logs.
type RevocationsStatus struct {
	// Kind is where they are kept: redis, data-dir or memory.
	Kind string `json:"kind"`
	// Ready is true once they have been loaded.
	Ready bool `json:"ready"`
	// Count is the number of revocations known, in force or not yet pruned.
	Count int `json:"count"`
	// LastError is the last Redis error; empty if there was none.
	LastError string `json:"last_error,omitempty"`
}

// Status reports where the revocations are kept and how they are.
func (r *Revocations) Status() RevocationsStatus {
	s := RevocationsStatus{Kind: r.kind, Count: len(r.set.Load().byID), Ready: r.isReady()}
	if r.health != nil {
		s.LastError = r.health.lastError()
	}
	return s
}

// reload replaces the in-memory set with what the store holds. A change
// made here while it read may be missing from what it read: then it reads
// again.
func (r *Revocations) reload(ctx context.Context) error {
	for {
		r.mu.Lock()
		gen, cur := r.gen, r.set.Load()
		r.mu.Unlock()
		version, revs, err := r.backend.load(ctx, cur)
		if err != nil {
			return err
		}
		if r.replace(gen, newRevocationSet(version, revs)) {
			return nil
		}
	}
}

// replace makes s the set, unless a change was made here since generation
// gen, and announces a change. It marks the set ready.
func (r *Revocations) replace(gen uint64, s *revocationSet) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen != gen {
		return false
	}
	old := r.set.Swap(s)
	if !s.sameAs(old) {
		r.announce()
	}
	if !r.loaded {
		r.loaded = true
		close(r.ready)
	}
	return true
}

// announce wakes the waiters on Changed. r.mu is held.
func (r *Revocations) announce() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// update applies a change made here to a copy of the set. The version stays:
// with Redis, the next check sees Redis's new one and reloads.
func (r *Revocations) update(change func(map[string]Revocation)) {
	r.mu.Lock()
	cur := r.set.Load()
	m := maps.Clone(cur.byID)
	change(m)
	if maps.Equal(m, cur.byID) {
		r.mu.Unlock()
		return
	}
	r.set.Store(newRevocationSet(cur.version, m))
	r.gen++
	r.announce()
	r.mu.Unlock()
}

// pruneLoop deletes revocations that have ended from the store.
func (r *Revocations) pruneLoop(ctx context.Context) {
	t := time.NewTicker(revocationPrune)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.prune(ctx); err != nil && ctx.Err() == nil {
			r.log.Debug("prune ended revocations", zap.Error(err))
		}
	}
}

// prune deletes the revocations that ended before now.
func (r *Revocations) prune(ctx context.Context) error {
	now := time.Now()
	var ended []string
	for id, rev := range r.set.Load().byID {
		if !rev.active(now) {
			ended = append(ended, id)
		}
	}
	if len(ended) == 0 {
		return nil
	}
	if _, err := r.backend.remove(ctx, ended...); err != nil {
		return err
	}
	r.update(func(m map[string]Revocation) {
		for _, id := range ended {
			delete(m, id)
		}
	})
	return nil
}

// subject names what rev revokes, for messages.
func (r Revocation) subject() string {
	if r.Tunnel != "" {
		return "tunnel " + r.Tunnel
	}
	return "token " + r.JTI
}

// fields are rev's log fields.
func (r Revocation) fields() []zap.Field {
	f := []zap.Field{zap.String("revocation", r.ID)}
	if r.Tunnel != "" {
		f = append(f, zap.String("tunnel", r.Tunnel))
	}
	if r.JTI != "" {
		f = append(f, zap.String("jti", r.JTI))
	}
	if !r.Until.IsZero() {
		f = append(f, zap.Time("until", r.Until))
	}
	if r.Reason != "" {
		f = append(f, zap.String("reason", r.Reason))
	}
	return f
}

// memoryRevocations keeps the revocations of a replica without a data
// directory or Redis: they end with the process.
type memoryRevocations struct {
	mu      sync.Mutex
	version uint64
	byID    map[string]Revocation
}

func (m *memoryRevocations) add(_ context.Context, rev Revocation, limit int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.byID) >= limit {
		return ErrTooManyRevocations
	}
	m.byID[rev.ID] = rev
	m.version++
	return nil
}

func (m *memoryRevocations) remove(_ context.Context, ids ...string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, id := range ids {
		if _, ok := m.byID[id]; ok {
			delete(m.byID, id)
			n++
		}
	}
	if n > 0 {
		m.version++
	}
	return n, nil
}

func (m *memoryRevocations) load(context.Context, *revocationSet) (uint64, map[string]Revocation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version, maps.Clone(m.byID), nil
}

func (m *memoryRevocations) watch(ctx context.Context, _ *Revocations) { <-ctx.Done() }

func (m *memoryRevocations) close() error { return nil }
