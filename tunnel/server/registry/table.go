package registry

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"slices"
	"strings"
	"sync"
	"time"
)

// table is what a replica knows: the tunnels it holds, and the cache of the
// other replicas' holds. Both registries keep one; only Redis fills the
// cache.
type table struct {
	self Holder // Replica and Addr of this replica; Epoch unused

	mu   sync.RWMutex
	held map[string]uint64 // tunnel → epoch of this replica's hold
	// remote is what Holders returns: tunnel → other replicas' holds,
	// sorted by replica. Each slice is replaced, never changed in place, so
	// that Holders can hand it out without copying.
	remote  map[string][]Holder
	peers   map[string]*peer // other replicas, by ID
	waiters map[string]*waiter
}

// peer is another replica as the cache knows it.
type peer struct {
	// deadline is when the peer counts as dead without further news: its
	// last beat, hold or scanned key plus its TTL.
	deadline time.Time
	holds    map[string]Holder // by tunnel
}

// waiter is the requests waiting for a tunnel to be held: ch is closed when
// it is, and n counts the waiting calls so that the last one to give up
// removes the entry.
type waiter struct {
	ch chan struct{}
	n  int
}

func newTable(replica, addr string) *table {
	return &table{
		self:    Holder{Replica: replica, Addr: addr},
		held:    map[string]uint64{},
		remote:  map[string][]Holder{},
		peers:   map[string]*peer{},
		waiters: map[string]*waiter{},
	}
}

// newEpoch returns a random epoch in [1, 2^53).
func newEpoch() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
	if e := binary.LittleEndian.Uint64(b[:]) & (1<<53 - 1); e != 0 {
		return e
	}
	return 1
}

// hold marks tunnel held here with a fresh epoch, unless it already was;
// added says which.
func (t *table) hold(tunnel string) (added bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.held[tunnel]; ok {
		return false
	}
	t.held[tunnel] = newEpoch()
	t.wake(tunnel)
	return true
}

// release unmarks tunnel and returns the epoch it was held with.
func (t *table) release(tunnel string) (epoch uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.held[tunnel]
	delete(t.held, tunnel)
	return e, ok
}

// ownEpoch returns the epoch of this replica's hold of tunnel.
func (t *table) ownEpoch(tunnel string) (uint64, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	e, ok := t.held[tunnel]
	return e, ok
}

// entry is one hold of this replica.
type entry struct {
	tunnel string
	epoch  uint64
}

// ownHolds returns this replica's holds, all of them or only those of the
// given tunnels.
func (t *table) ownHolds(only map[string]struct{}) []entry {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var list []entry
	if only == nil {
		list = make([]entry, 0, len(t.held))
		for name, e := range t.held {
			list = append(list, entry{name, e})
		}
		return list
	}
	for name := range only {
		if e, ok := t.held[name]; ok {
			list = append(list, entry{name, e})
		}
	}
	return list
}

func (t *table) holders(tunnel string) []Holder {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.remote[tunnel]
}

func (t *table) wait(ctx context.Context, tunnel string) error {
	t.mu.Lock()
	if _, ok := t.held[tunnel]; ok || len(t.remote[tunnel]) > 0 {
		t.mu.Unlock()
		return nil
	}
	w := t.waiters[tunnel]
	if w == nil {
		w = &waiter{ch: make(chan struct{})}
		t.waiters[tunnel] = w
	}
	w.n++
	t.mu.Unlock()

	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waiters[tunnel] == w {
		if w.n--; w.n == 0 {
			delete(t.waiters, tunnel)
		}
	}
	select {
	case <-w.ch:
		return nil
	default:
		return ctx.Err()
	}
}

// wake releases the waiters of tunnel, which has just been held. t.mu is
// held.
func (t *table) wake(tunnel string) {
	if w := t.waiters[tunnel]; w != nil {
		close(w.ch)
		delete(t.waiters, tunnel)
	}
}

func (t *table) snapshot() map[string][]Holder {
	t.mu.RLock()
	defer t.mu.RUnlock()
	all := make(map[string][]Holder, len(t.held)+len(t.remote))
	for name, hs := range t.remote {
		all[name] = slices.Clone(hs)
	}
	for name, e := range t.held {
		h := t.self
		h.Epoch = e
		all[name] = append(all[name], h)
		slices.SortFunc(all[name], byReplica)
	}
	return all
}

func byReplica(a, b Holder) int { return strings.Compare(a.Replica, b.Replica) }

// counts returns how many tunnels this replica and the others hold.
func (t *table) counts() (held, remote int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.held), len(t.remote)
}

// applyHold records that h.Replica holds tunnel, alive until at least
// deadline.
func (t *table) applyHold(tunnel string, h Holder, deadline time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[h.Replica]
	if p == nil {
		p = &peer{holds: map[string]Holder{}}
		t.peers[h.Replica] = p
	}
	if deadline.After(p.deadline) {
		p.deadline = deadline
	}
	if old, ok := p.holds[tunnel]; ok && old == h {
		return
	}
	p.holds[tunnel] = h
	t.rebuild(tunnel)
}

// applyRelease forgets replica's hold of tunnel if it is still the one with
// epoch: a release never undoes a newer hold.
func (t *table) applyRelease(tunnel, replica string, epoch uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[replica]
	if p == nil {
		return
	}
	if h, ok := p.holds[tunnel]; !ok || h.Epoch != epoch {
		return
	}
	delete(p.holds, tunnel)
	if len(p.holds) == 0 {
		delete(t.peers, replica)
	}
	t.rebuild(tunnel)
}

// beat keeps replica alive until deadline. It reports whether the cache
// holds as many of replica's tunnels as the replica says it holds; if not,
// the cache missed an event and needs a resync.
func (t *table) beat(replica string, deadline time.Time, tunnels int) (consistent bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[replica]
	if p == nil {
		return tunnels == 0
	}
	if deadline.After(p.deadline) {
		p.deadline = deadline
	}
	return len(p.holds) == tunnels
}

// expire forgets the replicas whose deadline is before now, and returns
// their IDs.
func (t *table) expire(now time.Time) (gone []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, p := range t.peers {
		if now.Before(p.deadline) {
			continue
		}
		delete(t.peers, id)
		for tunnel := range p.holds {
			t.rebuild(tunnel)
		}
		gone = append(gone, id)
	}
	return gone
}

// replace makes peers the whole cache, as a full scan of Redis found it.
func (t *table) replace(peers map[string]*peer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.peers = peers
	remote := make(map[string][]Holder, len(t.remote))
	for _, p := range peers {
		for tunnel, h := range p.holds {
			remote[tunnel] = append(remote[tunnel], h)
		}
	}
	for tunnel, hs := range remote {
		slices.SortFunc(hs, byReplica)
		remote[tunnel] = hs[:len(hs):len(hs)]
		t.wake(tunnel)
	}
	t.remote = remote
}

// rebuild recomputes remote[tunnel] from the peers. t.mu is held.
func (t *table) rebuild(tunnel string) {
	var hs []Holder
	for _, p := range t.peers {
		if h, ok := p.holds[tunnel]; ok {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		delete(t.remote, tunnel)
		return
	}
	slices.SortFunc(hs, byReplica)
	// A full slice expression, so that a caller's append copies instead of
	// writing into the shared array.
	t.remote[tunnel] = hs[:len(hs):len(hs)]
	t.wake(tunnel)
}
