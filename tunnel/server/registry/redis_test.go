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

	"go.uber.org/zap/zapcore"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestReplicasSeeEachOther: three replicas on one Redis see each other's
// holds and releases, and each sees only the others in Holders.
func TestReplicasSeeEachOther(t *testing.T) {
	srv := startRedis(t)
	a := runReplica(t, srv.URL(), "a")
	b := runReplica(t, srv.URL(), "b")
	c := runReplica(t, srv.URL(), "c")

	a.Hold("t1")
	b.Hold("t1")
	b.Hold("t2")
	ha, hb, hb2 := a.holder(t, "t1"), b.holder(t, "t1"), b.holder(t, "t2")
	testutil.WaitFor(t, 5*time.Second, all(
		func() error { return holdersAre(c, "t1", ha, hb) },
		func() error { return holdersAre(c, "t2", hb2) },
		func() error { return holdersAre(a, "t1", hb) },
		func() error { return holdersAre(a, "t2", hb2) },
		func() error { return holdersAre(b, "t1", ha) },
		func() error { return holdersAre(b, "t2") },
	))
	if ha.Epoch == hb.Epoch || hb.Epoch == hb2.Epoch {
		t.Errorf("epochs are not fresh per hold: %d %d %d", ha.Epoch, hb.Epoch, hb2.Epoch)
	}
	want := map[string][]Holder{"t1": {ha, hb}, "t2": {hb2}}
	for _, r := range []*replica{a, b, c} {
		if got := r.Snapshot(); !maps.EqualFunc(got, want, slices.Equal) {
			t.Errorf("snapshot of %s: got %v, want %v", r.cfg.Replica, got, want)
		}
	}

	b.Hold("t1") // again: the same hold, the same epoch
	if got := b.epoch(t, "t1"); got != hb.Epoch {
		t.Errorf("a second Hold changed the epoch: got %d, want %d", got, hb.Epoch)
	}

	b.Release("t1")
	testutil.WaitFor(t, 5*time.Second, all(
		func() error { return holdersAre(c, "t1", ha) },
		func() error { return holdersAre(a, "t1") },
		func() error { return holdersAre(c, "t2", hb2) },
		func() error { return isUp(c) },
	))
	wantKeys := []string{"tether:tunnel:t1:a", "tether:tunnel:t2:b"}
	if got := srv.keys(t); !slices.Equal(got, wantKeys) {
		t.Errorf("keys in redis: got %q, want %q", got, wantKeys)
	}
	st := c.Status()
	if st.Backend != "redis" || st.Held != 0 || st.Remote != 2 || st.Target != srv.URL() {
		t.Errorf("status of c: got %+v, want redis, held 0, remote 2, target %s", st, srv.URL())
	}
}

// TestLateReleaseKeepsNewerHold: a release of an old epoch, arriving after
// the same replica held the tunnel again, deletes nothing.
func TestLateReleaseKeepsNewerHold(t *testing.T) {
	srv := startRedis(t)
	// A client that reconnects at once: its release and its new hold reach
	// the write loop together, which writes the hold before the release.
	a := newReplica(t, srv.URL(), "a", "")
	a.Hold("t")
	old := a.epoch(t, "t")
	a.Release("t")
	a.Hold("t")
	newer := a.holder(t, "t")
	a.start(t)
	b := runReplica(t, srv.URL(), "b")

	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(b, "t", newer) })
	// A release from the old epoch that comes later still (say from the
	// previous process of a pod that restarted under the same name).
	if err := a.deleteHolds(t.Context(), []entry{{"t", old}}); err != nil {
		t.Fatalf("late release: %v", err)
	}
	// b has seen everything published before this barrier.
	a.Hold("barrier")
	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(b, "barrier", a.holder(t, "barrier")) })
	if err := holdersAre(b, "t", newer); err != nil {
		t.Errorf("after the late release: %v", err)
	}
	if got, want := srv.keys(t), []string{"tether:tunnel:barrier:a", "tether:tunnel:t:a"}; !slices.Equal(got, want) {
		t.Errorf("keys in redis: got %q, want %q", got, want)
	}

	// The same release with the current epoch does delete.
	if err := a.deleteHolds(t.Context(), []entry{{"t", newer.Epoch}}); err != nil {
		t.Fatalf("release: %v", err)
	}
	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(b, "t") })
}

// TestDeadReplicaExpires: a replica cut off from Redis (as good as dead to
// the others) disappears from the others' caches and from Redis within the
// TTL.
func TestDeadReplicaExpires(t *testing.T) {
	srv := startRedis(t)
	p := newPartition(t, srv.Addr)
	a := runReplica(t, p.url(), "a")
	b := runReplica(t, srv.URL(), "b")
	a.Hold("t")
	ha := a.holder(t, "t")
	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(b, "t", ha) })

	p.cutOff()
	cut := time.Now()
	testutil.WaitFor(t, 5*testTTL, func() error { return holdersAre(b, "t") })
	// The deadline is the last beat plus the TTL, checked every TTL/10.
	if took, limit := time.Since(cut), testTTL+testTTL/10+testTTL/2; took > limit {
		t.Errorf("the dead replica's hold went from the cache after %v; want within the TTL, %v, plus the sweep (%v with slack)", took, testTTL, limit)
	}
	testutil.WaitFor(t, 2*testTTL, func() error {
		if keys := srv.keys(t); len(keys) > 0 {
			return fmt.Errorf("keys in redis: %q", keys)
		}
		return nil
	})
	// An operation in flight runs to its timeout, then the release has one.
	if took, limit := a.stop(t), 2*a.opTimeout+time.Second; took > limit {
		t.Errorf("Run took %v to return without Redis; want at most %v", took, limit)
	}
}

// TestOutageKeepsViewAndRecoversEmpty: while Redis does not answer, Hold and
// Release return at once, every replica keeps its last view of the others,
// and the outage is logged once; when Redis comes back empty, every hold is
// back in every cache and in Redis.
func TestOutageKeepsViewAndRecoversEmpty(t *testing.T) {
	srv := startRedis(t)
	p := newPartition(t, srv.Addr)
	a := runReplica(t, p.url(), "a")
	b := runReplica(t, p.url(), "b")
	a.Hold("ta")
	a.Hold("gone")
	b.Hold("tb")
	ha, hgone, hb := a.holder(t, "ta"), a.holder(t, "gone"), b.holder(t, "tb")
	testutil.WaitFor(t, 5*time.Second, all(
		func() error { return holdersAre(b, "ta", ha) },
		func() error { return holdersAre(b, "gone", hgone) },
		func() error { return holdersAre(a, "tb", hb) },
	))

	p.cutOff()
	for _, op := range []struct {
		name string
		f    func()
	}{
		{"a.Hold(ta2)", func() { a.Hold("ta2") }},
		{"a.Release(gone)", func() { a.Release("gone") }},
		{"b.Hold(tb2)", func() { b.Hold("tb2") }},
	} {
		start := time.Now()
		op.f()
		// A Redis call would take its whole timeout; half of it tells the
		// two apart on a loaded machine.
		if took := time.Since(start); took > a.opTimeout/2 {
			t.Errorf("%s took %v while Redis does not answer; want no wait", op.name, took)
		}
	}
	testutil.WaitFor(t, 5*testTTL, func() error {
		if a.Status().Up || b.Status().Up {
			return errors.New("a registry still reports up")
		}
		return nil
	})
	// Well past the TTL, the last known view stands: nobody can tell a
	// replica that died from one that lost Redis.
	quietFor(t, 2*testTTL, all(
		func() error { return holdersAre(b, "ta", ha) },
		func() error { return holdersAre(b, "gone", hgone) },
		func() error { return holdersAre(a, "tb", hb) },
	))

	srv.Restart() // empty: no persistence
	p.heal()
	ha2, hb2 := a.holder(t, "ta2"), b.holder(t, "tb2")
	testutil.WaitFor(t, 10*testTTL, all(
		func() error { return holdersAre(b, "ta", ha) },
		func() error { return holdersAre(b, "ta2", ha2) },
		func() error { return holdersAre(b, "gone") },
		func() error { return holdersAre(a, "tb", hb) },
		func() error { return holdersAre(a, "tb2", hb2) },
		func() error {
			want := []string{"tether:tunnel:ta2:a", "tether:tunnel:ta:a", "tether:tunnel:tb2:b", "tether:tunnel:tb:b"}
			if got := srv.keys(t); !slices.Equal(got, want) {
				return fmt.Errorf("keys in redis: got %q, want %q", got, want)
			}
			return nil
		},
		func() error { return isUp(a) },
		func() error { return isUp(b) },
	))
	for _, r := range []*replica{a, b} {
		warns := r.logs.FilterMessageSnippet("unreachable").FilterLevelExact(zapcore.WarnLevel).Len()
		infos := r.logs.FilterMessage("redis registry reachable again").Len()
		if warns != 1 || infos != 1 {
			t.Errorf("%s logged the outage %d times at Warn and its end %d times at Info; want once each", r.cfg.Replica, warns, infos)
		}
		if st := r.Status(); st.Errors == 0 || st.LastError == "" {
			t.Errorf("status of %s after the outage: got %+v, want errors counted and the last one", r.cfg.Replica, st)
		}
	}
}

// TestNoExpiryWhileRedisIsAway: a replica whose beats stopped shortly
// before Redis stopped answering stays in the cache for as long as Redis
// does not answer — nobody can tell whether it died — and goes once Redis
// answers again and its TTL has passed.
func TestNoExpiryWhileRedisIsAway(t *testing.T) {
	srv := startRedis(t)
	pa, pb := newPartition(t, srv.Addr), newPartition(t, srv.Addr)
	a := runReplica(t, pa.url(), "a")
	b := runReplica(t, pb.url(), "b")
	a.Hold("t")
	ha := a.holder(t, "t")
	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(b, "t", ha) })

	pa.cutOff() // a's beats stop
	quietFor(t, testTTL/2, func() error { return holdersAre(b, "t", ha) })
	pb.cutOff() // then Redis stops answering b, before a's TTL is over
	quietFor(t, 3*testTTL, func() error { return holdersAre(b, "t", ha) })

	pb.heal()
	testutil.WaitFor(t, 5*testTTL, all(
		func() error { return holdersAre(b, "t") },
		func() error { return isUp(b) },
	))
}

// TestRestartUnderSameIDDropsOldHolds: a replica that comes back under the
// same ID (a pod restarted) deletes the holds its previous process left
// rather than letting them live until the TTL.
func TestRestartUnderSameIDDropsOldHolds(t *testing.T) {
	srv := startRedis(t)
	p := newPartition(t, srv.Addr)
	long := func(c *Config) { c.TTL = time.Minute }
	old := runReplica(t, p.url(), "a", long)
	b := runReplica(t, srv.URL(), "b", long)
	old.Hold("t1")
	old.Hold("t2")
	testutil.WaitFor(t, 5*time.Second, all(
		func() error { return holdersAre(b, "t1", old.holder(t, "t1")) },
		func() error { return holdersAre(b, "t2", old.holder(t, "t2")) },
	))
	p.cutOff() // the old process is gone without a word

	a := newReplica(t, srv.URL(), "a", "", long)
	a.Hold("t2")
	a.start(t)
	testutil.WaitFor(t, 5*time.Second, all(
		func() error { return holdersAre(b, "t1") },
		func() error { return holdersAre(b, "t2", a.holder(t, "t2")) },
	))
	if got, want := srv.keys(t), []string{"tether:tunnel:t2:a"}; !slices.Equal(got, want) {
		t.Errorf("keys in redis: got %q, want %q", got, want)
	}
}

// TestBeatRepairsCache: a cache that lost a live replica's holds (say it
// stalled for longer than the TTL) gets them back from the replica's next
// beat, which says how many tunnels it holds.
func TestBeatRepairsCache(t *testing.T) {
	srv := startRedis(t)
	a := runReplica(t, srv.URL(), "a")
	b := runReplica(t, srv.URL(), "b")
	a.Hold("t")
	ha := a.holder(t, "t")
	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(b, "t", ha) })

	if gone := b.table.expire(time.Now().Add(time.Hour)); !slices.Equal(gone, []string{"a"}) {
		t.Fatalf("expire forgot %q, want [a]", gone)
	}
	if err := holdersAre(b, "t"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*testTTL, func() error { return holdersAre(b, "t", ha) })
}

// TestWaitForHold: Wait returns when another replica starts holding the
// tunnel, or when its context ends, and leaves nothing behind.
func TestWaitForHold(t *testing.T) {
	srv := startRedis(t)
	a := runReplica(t, srv.URL(), "a")
	b := runReplica(t, srv.URL(), "b")

	done := make(chan error, 1)
	go func() { done <- b.Wait(t.Context(), "t") }()
	testutil.WaitFor(t, 5*time.Second, func() error {
		b.table.mu.RLock()
		defer b.table.mu.RUnlock()
		if b.table.waiters["t"] == nil {
			return errors.New("Wait is not waiting yet")
		}
		return nil
	})
	a.Hold("t")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after another replica held the tunnel")
	}
	if err := holdersAre(b, "t", a.holder(t, "t")); err != nil {
		t.Errorf("after Wait: %v", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := b.Wait(ctx, "nobody"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait for a tunnel nobody holds: got %v, want %v", err, context.DeadlineExceeded)
	}
	b.table.mu.RLock()
	n := len(b.table.waiters)
	b.table.mu.RUnlock()
	if n != 0 {
		t.Errorf("%d waiters left after Wait returned", n)
	}
}

// TestPrefixesIsolateDeployments: two deployments on one Redis with
// different prefixes do not see each other, even when a prefix holds glob
// characters that would match the other's keys.
func TestPrefixesIsolateDeployments(t *testing.T) {
	srv := startRedis(t)
	ab := func(c *Config) { c.Prefix = "ab:" }
	glob := func(c *Config) { c.Prefix = "a*:" }
	x1 := runReplica(t, srv.URL(), "x1", ab)
	x2 := runReplica(t, srv.URL(), "x2", ab)
	x1.Hold("x")
	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(x2, "x", x1.holder(t, "x")) })

	// y2 starts after x's key exists: its first scan would find it.
	y1 := runReplica(t, srv.URL(), "y1", glob)
	y1.Hold("y")
	y2 := runReplica(t, srv.URL(), "y2", glob)
	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(y2, "y", y1.holder(t, "y")) })
	x3 := runReplica(t, srv.URL(), "x3", ab)
	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(x3, "x", x1.holder(t, "x")) })

	for _, tc := range []struct {
		r    *replica
		want map[string][]Holder
	}{
		{y2, map[string][]Holder{"y": {y1.holder(t, "y")}}},
		{x2, map[string][]Holder{"x": {x1.holder(t, "x")}}},
		{x3, map[string][]Holder{"x": {x1.holder(t, "x")}}},
	} {
		if got := tc.r.Snapshot(); !maps.EqualFunc(got, tc.want, slices.Equal) {
			t.Errorf("snapshot of %s: got %v, want %v", tc.r.cfg.Replica, got, tc.want)
		}
	}
	if got, want := srv.keys(t), []string{"a*:tunnel:y:y1", "ab:tunnel:x:x1"}; !slices.Equal(got, want) {
		t.Errorf("keys in redis: got %q, want %q", got, want)
	}
}

// TestHoldBeforeRun: holds made before Run (at startup, before the server
// runs the registry) reach Redis when it runs; when Run ends, they are
// released at once, long before their TTL.
func TestHoldBeforeRun(t *testing.T) {
	srv := startRedis(t)
	long := func(c *Config) { c.TTL = time.Minute }
	a := newReplica(t, srv.URL(), "a", "", long)
	for i := range 3 * batch / 2 { // more than one script call
		a.Hold(fmt.Sprintf("t%d", i))
	}
	a.start(t)
	b := runReplica(t, srv.URL(), "b", long)
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := b.Status().Remote; n != 3*batch/2 {
			return fmt.Errorf("b sees %d tunnels, want %d", n, 3*batch/2)
		}
		return nil
	})
	if got := b.Holders("t7"); len(got) != 1 || got[0].Replica != "a" {
		t.Errorf("holders of t7: got %v, want a", got)
	}
	a.stop(t)
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := b.Status().Remote; n != 0 {
			return fmt.Errorf("b still sees %d tunnels after a stopped", n)
		}
		if keys := srv.keys(t); len(keys) > 0 {
			return fmt.Errorf("keys left in redis: %d, e.g. %s", len(keys), strings.Join(keys[:1], ""))
		}
		return nil
	})
}
