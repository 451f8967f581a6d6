package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
)

func TestMemory(t *testing.T) {
	reg, err := Open(Config{Replica: "solo", Addr: "10.0.0.1:7443"}, "", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := reg.(*Memory)
	if !ok {
		t.Fatalf("Open with no URL: got %T, want *Memory", reg)
	}
	m.Hold("t")
	m.Hold("t")
	m.Hold("u")
	snap := m.Snapshot()
	if len(snap) != 2 || len(snap["t"]) != 1 || len(snap["u"]) != 1 {
		t.Fatalf("snapshot: got %v, want t and u, held once each", snap)
	}
	ht := snap["t"][0]
	if ht.Replica != "solo" || ht.Addr != "10.0.0.1:7443" || ht.Epoch == 0 || ht.Epoch >= 1<<53 || ht.Epoch == snap["u"][0].Epoch {
		t.Errorf("holder of t: got %+v (u: %+v), want solo at 10.0.0.1:7443 with a fresh epoch in [1, 2^53)", ht, snap["u"][0])
	}
	if hs := m.Holders("t"); hs != nil {
		t.Errorf("holders: got %v, want none (no other replica)", hs)
	}
	if st := m.Status(); !st.Up || st.Backend != "memory" || st.Held != 2 || st.Remote != 0 {
		t.Errorf("status: got %+v, want up, memory, held 2", st)
	}

	m.Release("u")
	m.Release("never-held")
	if got, want := m.Snapshot(), map[string][]Holder{"t": {ht}}; !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("snapshot after release: got %v, want %v", got, want)
	}
	m.Hold("u")
	if e := m.Snapshot()["u"][0].Epoch; e == snap["u"][0].Epoch {
		t.Errorf("holding u again kept its old epoch %d; want a fresh one", e)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestMemoryWait(t *testing.T) {
	m := NewMemory("solo", "")
	m.Hold("t")
	if err := m.Wait(t.Context(), "t"); err != nil {
		t.Errorf("Wait for a held tunnel: %v", err)
	}

	done := make(chan error, 2)
	for range 2 {
		go func() { done <- m.Wait(t.Context(), "later") }()
	}
	waiting := func() int {
		m.table.mu.RLock()
		defer m.table.mu.RUnlock()
		if w := m.table.waiters["later"]; w != nil {
			return w.n
		}
		return 0
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := waiting(); n < 2 {
			return fmt.Errorf("%d calls waiting, want 2", n)
		}
		return nil
	})
	m.Hold("later") // a client reconnecting
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Wait: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Wait did not return after the tunnel was held")
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := m.Wait(ctx, "never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait for a tunnel never held: got %v, want %v", err, context.DeadlineExceeded)
	}
	if n := len(m.table.waiters); n != 0 {
		t.Errorf("%d waiters left behind", n)
	}
}

func TestOpenMemoryRefusesPassword(t *testing.T) {
	_, err := Open(Config{URL: "memory", Replica: "solo"}, "secret", zaptest.NewLogger(t))
	if err == nil || !strings.Contains(err.Error(), "--registry-password-file") || strings.Contains(err.Error(), "secret") {
		t.Errorf("got %v, want an error about --registry-password-file without the password", err)
	}
}

func TestCollector(t *testing.T) {
	m := NewMemory("solo", "")
	m.Hold("a")
	m.Hold("b")
	want := `
# HELP tether_registry_errors_total Redis operations of the route registry that failed (writes, scans, the subscription).
# TYPE tether_registry_errors_total counter
tether_registry_errors_total 0
# HELP tether_registry_tunnels Tunnels in the route registry, by holder: this replica (self) or, per the cache, other replicas (others).
# TYPE tether_registry_tunnels gauge
tether_registry_tunnels{holder="others"} 0
tether_registry_tunnels{holder="self"} 2
# HELP tether_registry_up 1 while the route registry reads and writes Redis (always 1 for the in-memory registry).
# TYPE tether_registry_up gauge
tether_registry_up 1
`
	if err := promtest.CollectAndCompare(NewCollector(m), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
