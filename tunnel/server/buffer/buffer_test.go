package buffer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

func TestOpenWithoutStore(t *testing.T) {
	if _, err := Open(Config{}, registry.Backing{}, zap.NewNop()); !errors.Is(err, ErrDisabled) {
		t.Fatalf("Open in memory: got %v, want ErrDisabled", err)
	}
	_, err := Open(Config{MaxBytes: 10, MaxTotalBytes: 5, LeaseTTL: time.Millisecond, Retention: -1}, registry.Backing{}, zap.NewNop())
	for _, want := range []string{"--buffer-max-total-bytes", "lease TTL", "--buffer-retention"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open with a bad config: got %v, want it to name %s", err, want)
		}
	}
}

// TestDeliverInOrder: requests come back in the order they were stored,
// byte for byte, one tunnel's apart from another's; listings show no body,
// header or query.
func TestDeliverInOrder(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind) {
		b := k.newBuffer(t, Config{})
		ctx := t.Context()
		var reqs []*Request
		for i := range 5 {
			reqs = append(reqs, webhook("acme", i))
		}
		start := time.Now().Add(-time.Millisecond)
		es := appendAll(t, b, reqs...)
		appendAll(t, b, webhook("other", 9))
		if !slices.IsSorted(ids(es)) || len(slices.Compact(ids(es))) != 5 {
			t.Fatalf("IDs do not sort in arrival order: %q", ids(es))
		}
		e := es[0]
		if e.State != Queued || e.Path != "/webhooks/github" || e.Method != "POST" || e.Tunnel != "acme" ||
			e.QueuedAt.Before(start.Truncate(time.Millisecond)) || e.Size != requestSize(reqs[0]) {
			t.Errorf("entry: got %+v", e)
		}
		list, err := b.List(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(list), ids(es)) {
			t.Errorf("List: got %q, want %q", ids(list), ids(es))
		}
		if s := fmt.Sprintf("%+v", list); strings.Contains(s, "s3cr3t") || strings.Contains(s, "sha256") {
			t.Errorf("List shows the query or headers: %s", s)
		}
		st, err := b.Stats(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		var size int64
		for _, r := range reqs {
			size += requestSize(r)
		}
		if st.Queued != 5 || st.Rejected != 0 || st.Bytes != size || !st.Oldest.Equal(es[0].QueuedAt) {
			t.Errorf("stats: got %+v, want 5 queued, %d bytes, oldest %v", st, size, es[0].QueuedAt)
		}

		l, err := b.Acquire(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range reqs {
			got, err := l.Next(ctx)
			if err != nil {
				t.Fatalf("next #%d: %v", i, err)
			}
			if got.ID != es[i].ID {
				t.Fatalf("next #%d: got %s, want %s", i, got.ID, es[i].ID)
			}
			if err := sameRequest(got, want); err != nil {
				t.Fatal(err)
			}
			if err := l.Ack(ctx, got.ID); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Next(ctx); !errors.Is(err, ErrEmpty) {
			t.Errorf("next after the last: got %v, want ErrEmpty", err)
		}
		all, err := b.All(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 1 || all["other"].Queued != 1 {
			t.Errorf("All: got %+v, want only other with 1 queued", all)
		}
		if c := b.Counts(); c.Accepted != 6 || c.Delivered != 5 {
			t.Errorf("counts: got %+v, want 6 accepted, 5 delivered", c)
		}
	})
}

// TestRetryRejectRequeue: a request waiting for its retry holds back the
// newer ones; a rejected one moves aside, stays listed, and goes back to its
// place when requeued.
func TestRetryRejectRequeue(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind) {
		b := k.newBuffer(t, Config{})
		ctx := t.Context()
		es := appendAll(t, b, webhook("acme", 1), webhook("acme", 2), webhook("acme", 3))
		l, err := b.Acquire(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		due := time.Now().Add(300 * time.Millisecond)
		if err := l.Retry(ctx, es[0].ID, Failure{Err: "upstream answered 503", Reached: true, NextAttemptAt: due}); err != nil {
			t.Fatal(err)
		}
		var nd *NotDueError
		if _, err := l.Next(ctx); !errors.As(err, &nd) || !errors.Is(err, ErrNotDue) || nd.ID != es[0].ID || !nd.At.Equal(due.Truncate(time.Millisecond)) {
			t.Fatalf("next before the retry is due: got %v, want not due (%s at %v)", err, es[0].ID, due)
		}
		// An attempt that did not reach the client does not count.
		if err := l.Retry(ctx, es[0].ID, Failure{Err: "no session", NextAttemptAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		got, err := l.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != es[0].ID || got.Attempts != 1 || got.LastError != "no session" {
			t.Fatalf("next after the retry: got %s with %d attempts, last error %q; want %s, 1, \"no session\"", got.ID, got.Attempts, got.LastError, es[0].ID)
		}

		if err := l.Reject(ctx, es[0].ID, "upstream answered 400"); err != nil {
			t.Fatal(err)
		}
		if got, err := l.Next(ctx); err != nil || got.ID != es[1].ID {
			t.Fatalf("next after the reject: got %v, %v; want %s", got, err, es[1].ID)
		}
		list, err := b.List(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 3 || list[0].State != Rejected || list[0].Attempts != 2 || list[0].LastError != "upstream answered 400" || list[1].State != Queued {
			t.Fatalf("list: got %+v; want the first rejected after 2 attempts, the rest queued", list)
		}
		if st, _ := b.Stats(ctx, "acme"); st.Queued != 2 || st.Rejected != 1 {
			t.Errorf("stats: got %+v, want 2 queued, 1 rejected", st)
		}
		if err := l.Ack(ctx, es[0].ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("ack of a rejected request: got %v, want ErrNotFound", err)
		}
		if err := b.Requeue(ctx, "acme", es[1].ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("requeue of a queued request: got %v, want ErrNotFound", err)
		}
		if err := b.Requeue(ctx, "acme", es[0].ID); err != nil {
			t.Fatal(err)
		}
		if got, err := l.Next(ctx); err != nil || got.ID != es[0].ID {
			t.Fatalf("next after the requeue: got %v, %v; want %s back at its place", got, err, es[0].ID)
		}

		if err := b.Drop(ctx, "acme", es[1].ID); err != nil {
			t.Fatal(err)
		}
		if err := b.Drop(ctx, "acme", es[1].ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("drop twice: got %v, want ErrNotFound", err)
		}
		appendAll(t, b, webhook("other", 1))
		if n, err := b.DropAll(ctx, "acme"); err != nil || n != 2 {
			t.Fatalf("drop all: got %d, %v; want 2", n, err)
		}
		all, err := b.All(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := all["acme"]; ok || len(all) != 1 {
			t.Errorf("All after drop all: got %+v, want only other", all)
		}
		if st, _ := b.Stats(ctx, "acme"); st != (Stats{}) {
			t.Errorf("stats after drop all: got %+v, want none", st)
		}
	})
}

// TestQuotas: a tunnel's requests and bytes, and all tunnels' bytes, are
// bounded; a tunnel that is full takes nothing from the others.
func TestQuotas(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind) {
		one := requestSize(webhook("acme", 0))
		b := k.newBuffer(t, Config{MaxRequests: 3, MaxBytes: 4 * one, MaxTotalBytes: 5 * one})
		ctx := t.Context()
		appendAll(t, b, webhook("acme", 0), webhook("acme", 0), webhook("acme", 0))
		var full *FullError
		_, err := b.Append(ctx, webhook("acme", 0))
		if !errors.Is(err, ErrFull) || !errors.As(err, &full) || full.Flag != "--buffer-max-requests" || full.Used != 3 {
			t.Fatalf("4th request: got %v, want ErrFull naming --buffer-max-requests with 3 stored", err)
		}
		// Another tunnel still has room...
		appendAll(t, b, webhook("other", 0), webhook("other", 0))
		// ...until the server-wide cap.
		_, err = b.Append(ctx, webhook("third", 0))
		if !errors.As(err, &full) || full.Flag != "--buffer-max-total-bytes" || full.Used != 5*one {
			t.Fatalf("past the server-wide cap: got %v, want ErrFull naming --buffer-max-total-bytes", err)
		}
		// Delivering frees room.
		l, err := b.Acquire(ctx, "other")
		if err != nil {
			t.Fatal(err)
		}
		r, err := l.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Ack(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
		appendAll(t, b, webhook("third", 0))

		big := k.newBuffer(t, Config{MaxBytes: one + 10})
		appendAll(t, big, webhook("acme", 0))
		_, err = big.Append(ctx, webhook("acme", 0))
		if !errors.As(err, &full) || full.Flag != "--buffer-max-bytes" || full.Used != one || full.Size != one {
			t.Fatalf("past a tunnel's bytes: got %v, want ErrFull naming --buffer-max-bytes", err)
		}
		if c := b.Counts(); c.Full != 2 || c.Accepted != 6 {
			t.Errorf("counts: got %+v, want 2 full, 6 accepted", c)
		}
	})
}

// TestExpiry: Run drops what outlived the retention, counts it, and keeps
// what is younger.
func TestExpiry(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind) {
		const retention = 600 * time.Millisecond
		b := k.newBuffer(t, Config{Retention: retention})
		old := appendAll(t, b, webhook("acme", 1), webhook("other", 1))
		l, err := b.Acquire(t.Context(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Reject(t.Context(), old[0].ID, "400"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- b.Run(ctx) }()
		defer func() {
			cancel()
			<-done
		}()
		var young []Entry
		testutil.WaitFor(t, 10*time.Second, func() error {
			if young == nil && time.Since(old[0].QueuedAt) > retention/2 {
				young = appendAll(t, b, webhook("acme", 2))
			}
			if c := b.Counts(); c.Expired != 2 {
				return fmt.Errorf("%d expired, want 2", c.Expired)
			}
			return nil
		})
		if took := time.Since(old[0].QueuedAt); took < retention {
			t.Errorf("expired after %v, before the retention %v", took, retention)
		}
		list, err := b.List(t.Context(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		if young == nil || !slices.Equal(ids(list), ids(young)) {
			t.Errorf("after expiry: got %q, want only the younger request %q", ids(list), ids(young))
		}
	})
}

// TestLeaseTakeover: one deliverer at a time; when the holder stops
// renewing, another takes over and gets the same head (at least once), and
// the old holder can change nothing.
func TestLeaseTakeover(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind) {
		const ttl = 300 * time.Millisecond
		b := k.newBuffer(t, Config{LeaseTTL: ttl})
		ctx := t.Context()
		es := appendAll(t, b, webhook("acme", 1), webhook("acme", 2))
		old, err := b.Acquire(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Acquire(ctx, "acme"); !errors.Is(err, ErrLeased) {
			t.Fatalf("second acquire: got %v, want ErrLeased", err)
		}
		if other, err := b.Acquire(ctx, "other"); err != nil {
			t.Fatalf("another tunnel's lease: %v", err)
		} else if err := other.Release(ctx); err != nil {
			t.Fatal(err)
		}
		inFlight, err := old.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Renewals keep it past the TTL.
		keepCtx, stopKeeping := context.WithCancel(ctx)
		kept := make(chan error)
		go func() { kept <- old.Keep(keepCtx) }()
		quietFor(t, 2*ttl, func() error {
			if _, err := b.Acquire(ctx, "acme"); !errors.Is(err, ErrLeased) {
				return fmt.Errorf("acquire while kept: got %v, want ErrLeased", err)
			}
			return nil
		})
		stopKeeping()
		if err := <-kept; err != nil {
			t.Fatalf("Keep: %v", err)
		}

		// The holder stops renewing (it died, or stalled): another takes over.
		var next *Lease
		testutil.WaitFor(t, 10*ttl, func() error {
			next, err = b.Acquire(ctx, "acme")
			return err
		})
		if next.Fence() <= old.Fence() {
			t.Errorf("fence of the new lease %d is not above the old one's %d", next.Fence(), old.Fence())
		}
		got, err := next.Next(ctx)
		if err != nil || got.ID != inFlight.ID {
			t.Fatalf("the new holder's next: got %v, %v; want the request in flight, %s", got, err, inFlight.ID)
		}
		for name, change := range map[string]func() error{
			"ack":    func() error { return old.Ack(ctx, es[0].ID) },
			"retry":  func() error { return old.Retry(ctx, es[0].ID, Failure{NextAttemptAt: time.Now().Add(time.Hour)}) },
			"reject": func() error { return old.Reject(ctx, es[0].ID, "400") },
			"renew":  func() error { return old.Renew(ctx) },
		} {
			if err := change(); !errors.Is(err, ErrLeaseLost) {
				t.Errorf("%s by the old holder: got %v, want ErrLeaseLost", name, err)
			}
		}
		if err := old.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Acquire(ctx, "acme"); !errors.Is(err, ErrLeased) {
			t.Errorf("the old holder's release freed the new holder's lease: %v", err)
		}
		list, _ := b.List(ctx, "acme")
		if len(list) != 2 || list[0].Attempts != 0 || list[0].State != Queued {
			t.Errorf("the old holder changed the queue: %+v", list)
		}
		if err := next.Ack(ctx, got.ID); err != nil {
			t.Fatal(err)
		}
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
		last, err := b.Acquire(ctx, "acme")
		if err != nil {
			t.Fatalf("acquire after release: %v", err)
		}
		// A lease that expired is lost even if nobody took it over. (An
		// ID that names nothing: while the lease holds, ErrNotFound.)
		testutil.WaitFor(t, 10*ttl, func() error {
			if err := last.Ack(ctx, formatID(1, 0)); !errors.Is(err, ErrLeaseLost) {
				return fmt.Errorf("ack after the lease expired: got %v, want ErrLeaseLost", err)
			}
			return nil
		})
	})
}

// quietFor fails the test if cond fails at any check during d.
func quietFor(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if err := cond(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-t.Context().Done():
			return
		}
	}
}

// TestConcurrentAppends: many callers at once all get their own ID, in the
// order each made its calls, and the counts add up (for the race detector
// too).
func TestConcurrentAppends(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind) {
		b := k.newBuffer(t, Config{})
		const callers, each = 8, 15
		got := make([][]string, callers)
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				for i := range each {
					e, err := b.Append(t.Context(), webhook(fmt.Sprintf("t%d", c%3), i))
					if err != nil {
						t.Error(err)
						return
					}
					got[c] = append(got[c], e.ID)
				}
			})
		}
		wg.Wait()
		var all []string
		for c, list := range got {
			if !slices.IsSorted(list) {
				t.Errorf("caller %d got IDs out of order: %q", c, list)
			}
			all = append(all, list...)
		}
		slices.Sort(all)
		if len(slices.Compact(all)) != callers*each {
			t.Errorf("got %d distinct IDs, want %d", len(slices.Compact(all)), callers*each)
		}
		stats, err := b.All(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range stats {
			n += s.Queued
		}
		if n != callers*each {
			t.Errorf("stored: %d, want %d", n, callers*each)
		}
	})
}

// TestDataDirPersists: what Append returned is in the file after a reopen.
func TestDataDirPersists(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	b := boltBuffer(t, s, Config{})
	want := []*Request{webhook("acme", 1), webhook("acme", 2)}
	es := appendAll(t, b, want...)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkStored(t, boltBuffer(t, openStore(t, dir), Config{}), es, want)
}

// TestRedisPersists: with AOF, what Append returned survives a crash of
// Redis.
func TestRedisPersists(t *testing.T) {
	srv := testutil.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	b := redisBuffer(t, srv.URL(), "a", Config{})
	want := []*Request{webhook("acme", 1), webhook("acme", 2)}
	es := appendAll(t, b, want...)
	srv.Restart()
	checkStored(t, redisBuffer(t, srv.URL(), "b", Config{}), es, want)
}

// checkStored checks that b holds the requests want, stored as es, in
// order.
func checkStored(t *testing.T, b *Buffer, es []Entry, want []*Request) {
	t.Helper()
	list, err := b.List(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(list), ids(es)) {
		t.Fatalf("after the restart: got %q, want %q", ids(list), ids(es))
	}
	l, err := b.Acquire(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		got, err := l.Next(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := sameRequest(got, w); err != nil {
			t.Fatal(err)
		}
		if err := l.Ack(t.Context(), got.ID); err != nil {
			t.Fatal(err)
		}
	}
	// IDs go on from where they were.
	if e := appendAll(t, b, webhook("acme", 3)); e[0].ID <= es[len(es)-1].ID {
		t.Errorf("a new ID %s after the restart is not above the last one %s", e[0].ID, es[len(es)-1].ID)
	}
}

// TestRedisReplicasShare: replicas share one queue per tunnel, its lease,
// and the server-wide cap.
func TestRedisReplicasShare(t *testing.T) {
	srv := testutil.StartRedis(t)
	one := requestSize(webhook("acme", 0))
	cfg := Config{MaxTotalBytes: 3 * one, MaxBytes: 3 * one}
	a := redisBuffer(t, srv.URL(), "a", cfg)
	b := redisBuffer(t, srv.URL(), "b", cfg)
	ea := appendAll(t, a, webhook("acme", 0))
	eb := appendAll(t, b, webhook("acme", 0))
	appendAll(t, a, webhook("other", 0))
	if _, err := b.Append(t.Context(), webhook("third", 0)); !errors.Is(err, ErrFull) {
		t.Fatalf("past the cap shared by the replicas: got %v, want ErrFull", err)
	}
	la, err := a.Acquire(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(t.Context(), "acme"); !errors.Is(err, ErrLeased) || !strings.Contains(err.Error(), "replica a") {
		t.Fatalf("b's acquire: got %v, want ErrLeased naming replica a", err)
	}
	for _, want := range []string{ea[0].ID, eb[0].ID} {
		got, err := la.Next(t.Context())
		if err != nil || got.ID != want {
			t.Fatalf("next: got %v, %v; want %s", got, err, want)
		}
		if err := la.Ack(t.Context(), got.ID); err != nil {
			t.Fatal(err)
		}
	}
}
