package server

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel/server/registry"
)

// fleet is a registry shared in memory by the replicas of a test, in the
// place of Redis: what one replica holds, the others see at once.
type fleet struct {
	mu      sync.Mutex
	holds   map[string]map[string]registry.Holder // tunnel → replica → hold
	changed chan struct{}                         // closed at every change
	epoch   uint64
}

func newFleet() *fleet {
	return &fleet{holds: map[string]map[string]registry.Holder{}, changed: make(chan struct{})}
}

// replica is one replica's view of the fleet: a registry.Registry.
func (f *fleet) replica(id, addr string) *fleetReplica {
	return &fleetReplica{f: f, self: registry.Holder{Replica: id, Addr: addr}}
}

func (f *fleet) changedLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

type fleetReplica struct {
	f    *fleet
	self registry.Holder
}

var _ registry.Registry = (*fleetReplica)(nil)

func (r *fleetReplica) Hold(tunnel string) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if _, ok := r.f.holds[tunnel][r.self.Replica]; ok {
		return
	}
	if r.f.holds[tunnel] == nil {
		r.f.holds[tunnel] = map[string]registry.Holder{}
	}
	r.f.epoch++
	h := r.self
	h.Epoch = r.f.epoch
	r.f.holds[tunnel][r.self.Replica] = h
	r.f.changedLocked()
}

func (r *fleetReplica) Release(tunnel string) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if _, ok := r.f.holds[tunnel][r.self.Replica]; !ok {
		return
	}
	delete(r.f.holds[tunnel], r.self.Replica)
	if len(r.f.holds[tunnel]) == 0 {
		delete(r.f.holds, tunnel)
	}
	r.f.changedLocked()
}

func (r *fleetReplica) Holders(tunnel string) []registry.Holder {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	var out []registry.Holder
	for id, h := range r.f.holds[tunnel] {
		if id != r.self.Replica {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b registry.Holder) int { return strings.Compare(a.Replica, b.Replica) })
	return out
}

func (r *fleetReplica) Wait(ctx context.Context, tunnel string) error {
	for {
		r.f.mu.Lock()
		held, changed := len(r.f.holds[tunnel]) > 0, r.f.changed
		r.f.mu.Unlock()
		if held {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (r *fleetReplica) Snapshot() map[string][]registry.Holder {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	out := map[string][]registry.Holder{}
	for tunnel, holds := range r.f.holds {
		for _, h := range holds {
			out[tunnel] = append(out[tunnel], h)
		}
	}
	return out
}

func (r *fleetReplica) Status() registry.Status {
	return registry.Status{Backend: "fleet", Up: true, Since: time.Now()}
}

// Run releases what the replica holds when ctx ends, as a registry does.
func (r *fleetReplica) Run(ctx context.Context) error {
	<-ctx.Done()
	for tunnel := range r.Snapshot() {
		r.Release(tunnel)
	}
	return nil
}
