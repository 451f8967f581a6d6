package registry

import (
	"context"
	"time"
)

// Memory is the registry of a single replica: it knows only its own holds,
// so Holders is always empty.
type Memory struct {
	table *table
	since time.Time
}

// NewMemory returns the in-memory registry of replica, whose peer address is
// addr (shown by Snapshot; may be empty).
func NewMemory(replica, addr string) *Memory {
	return &Memory{table: newTable(replica, addr), since: time.Now()}
}

var _ Registry = (*Memory)(nil)

// Hold implements Registry.
func (m *Memory) Hold(tunnel string) { m.table.hold(tunnel) }

// Release implements Registry.
func (m *Memory) Release(tunnel string) { m.table.release(tunnel) }

// Holders implements Registry: there are no other replicas.
func (m *Memory) Holders(string) []Holder { return nil }

// Wait implements Registry.
func (m *Memory) Wait(ctx context.Context, tunnel string) error { return m.table.wait(ctx, tunnel) }

// Snapshot implements Registry.
func (m *Memory) Snapshot() map[string][]Holder { return m.table.snapshot() }

// Status implements Registry: memory is always up.
func (m *Memory) Status() Status {
	held, _ := m.table.counts()
	return Status{Backend: "memory", Up: true, Since: m.since, Held: held}
}

// Run implements Registry: there is nothing to do in the background.
func (m *Memory) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
