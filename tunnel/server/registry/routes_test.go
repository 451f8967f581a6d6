package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
)

// startRoutes makes remembered routes kept as b, and runs them until the
// test ends (or stop).
func startRoutes(t testing.TB, b Backing, retention time.Duration) (*Routes, *runner) {
	t.Helper()
	r, err := NewRoutes(RoutesConfig{Retention: retention}, b, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("new routes: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r, run(t, r.Run)
}

// remembers reports whether r.Lookup(tunnel) finds routes (nil: not at
// all).
func remembers(r *Routes, tunnel string, routes ...string) func() error {
	return func() error {
		rem, ok, err := r.Lookup(context.Background(), tunnel)
		switch {
		case err != nil:
			return err
		case routes == nil && ok:
			return fmt.Errorf("tunnel %s: got %+v, want it forgotten", tunnel, rem)
		case routes == nil:
			return nil
		case !ok:
			return fmt.Errorf("tunnel %s is not remembered; want %q", tunnel, routes)
		case !slices.Equal(rem.Routes, routes):
			return fmt.Errorf("routes of %s: got %q, want %q", tunnel, rem.Routes, routes)
		}
		return nil
	}
}

func TestRoutesRemember(t *testing.T) {
	r, _ := startRoutes(t, Backing{}, 500*time.Millisecond)
	before := time.Now()
	if err := r.Remember("acme", []string{"/webhooks=http://events:12000;buffer", "/=http://web"}); err != nil {
		t.Fatal(err)
	}
	if err := remembers(r, "acme", "/webhooks=http://events:12000;buffer", "/=http://web")(); err != nil {
		t.Fatal(err)
	}
	if err := remembers(r, "other")(); err != nil {
		t.Fatal(err)
	}
	// A new login replaces the routes.
	if err := r.Remember("acme", []string{"/hooks=http://h;buffer"}); err != nil {
		t.Fatal(err)
	}
	r.Left("acme")
	rem, ok, err := r.Lookup(t.Context(), "acme")
	if err != nil || !ok {
		t.Fatalf("after Left: got %+v, %v, %v; want remembered", rem, ok, err)
	}
	if rem.LastLogin.Before(before) || rem.LastSeen.Before(rem.LastLogin) || !slices.Equal(rem.Routes, []string{"/hooks=http://h;buffer"}) {
		t.Errorf("after Left: got %+v; want the last login's routes, seen at or after it", rem)
	}
	// Forgotten once the retention has passed since it left.
	testutil.WaitFor(t, 5*time.Second, remembers(r, "acme"))
	if took := time.Since(rem.LastSeen); took < r.Retention() {
		t.Errorf("forgotten %v after it left; want the retention, %v", took, r.Retention())
	}

	for _, tc := range []struct {
		tunnel string
		routes []string
		want   string
	}{
		{"", []string{"/=x"}, "empty"},
		{"a b", []string{"/=x"}, "printable ASCII"},
		{"acme", make([]string, maxRememberedRoutes+1), "routes of"},
		{"acme", []string{strings.Repeat("x", maxRememberedRouteBytes+1)}, "routes of"},
	} {
		if err := r.Remember(tc.tunnel, tc.routes); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Remember(%q, %d routes): got %v, want an error saying %q", tc.tunnel, len(tc.routes), err, tc.want)
		}
	}
}

// TestRoutesPersistInDataDir: what Run wrote is there for the next process,
// and what was pending is written when Run stops.
func TestRoutesPersistInDataDir(t *testing.T) {
	dir := t.TempDir()
	store := openStore(t, dir)
	r, runner := startRoutes(t, Backing{Store: store}, time.Hour)
	if err := r.Remember("acme", []string{"/webhooks=http://e;buffer"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Remember("gone", []string{"/=http://x"}); err != nil {
		t.Fatal(err)
	}
	r.Left("gone")
	runner.stop()
	r.Close()
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	again, _ := startRoutes(t, Backing{Store: openStore(t, dir)}, time.Hour)
	if err := all(remembers(again, "acme", "/webhooks=http://e;buffer"), remembers(again, "gone", "/=http://x"))(); err != nil {
		t.Fatal(err)
	}
	// Pruned from the file once the retention is over.
	if err := again.backend.prune(t.Context(), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := all(remembers(again, "acme"), remembers(again, "gone"))(); err != nil {
		t.Fatal(err)
	}
}

// TestRoutesSharedByReplicas: a login on one replica is known to another;
// while its session lives the tunnel stays remembered past the retention;
// after it left, it is forgotten when the retention ends (Redis expires the
// key).
func TestRoutesSharedByReplicas(t *testing.T) {
	srv := startRedis(t)
	const retention = 2 * time.Second
	a, _ := startRoutes(t, Backing{Redis: redisConn(t, srv.URL(), "a")}, retention)
	b, _ := startRoutes(t, Backing{Redis: redisConn(t, srv.URL(), "b")}, retention)
	if err := a.Remember("acme", []string{"/webhooks=http://e;buffer"}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, remembers(b, "acme", "/webhooks=http://e;buffer"))
	// Served for longer than the retention: a rewrites LastSeen.
	quietFor(t, 2*retention, remembers(b, "acme", "/webhooks=http://e;buffer"))

	a.Left("acme")
	left := time.Now()
	testutil.WaitFor(t, 5*time.Second, func() error {
		rem, ok, err := b.Lookup(t.Context(), "acme")
		if err != nil || !ok || rem.LastSeen.Before(left.Add(-10*time.Millisecond)) {
			return fmt.Errorf("b's view: %+v, %v, %v; want seen when it left", rem, ok, err)
		}
		return nil
	})
	testutil.WaitFor(t, 3*retention, remembers(b, "acme"))
	testutil.WaitFor(t, 3*retention, func() error {
		if keys := srv.keys(t); len(keys) > 0 {
			return fmt.Errorf("keys in redis: %q", keys)
		}
		return nil
	})
}

// TestRoutesWriteAfterOutage: what was remembered while Redis was away is
// written once it is back.
func TestRoutesWriteAfterOutage(t *testing.T) {
	srv := startRedis(t)
	p := newPartition(t, srv.Addr)
	a, _ := startRoutes(t, Backing{Redis: redisConn(t, p.url(), "a")}, time.Hour)
	b, _ := startRoutes(t, Backing{Redis: redisConn(t, srv.URL(), "b")}, time.Hour)
	p.cutOff()
	if err := a.Remember("acme", []string{"/=http://x"}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if a.health.lastError() == "" {
			return errors.New("a has not noticed that Redis is away")
		}
		return nil
	})
	if err := remembers(b, "acme")(); err != nil {
		t.Fatal(err)
	}
	p.heal()
	testutil.WaitFor(t, 10*time.Second, remembers(b, "acme", "/=http://x"))
}
