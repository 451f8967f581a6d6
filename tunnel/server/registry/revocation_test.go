package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
)

func TestRevocationValidation(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		rev  Revocation
		want string // in the error; "" for valid
	}{
		{"tunnel", Revocation{Tunnel: "acme", Reason: "offboarded"}, ""},
		{"jti until later", Revocation{JTI: "0123abcd", Until: now.Add(time.Hour)}, ""},
		{"both", Revocation{Tunnel: "acme", JTI: "x"}, "both a tunnel and a token ID"},
		{"neither", Revocation{Reason: "?"}, "neither a tunnel nor a token ID"},
		{"tunnel with space", Revocation{Tunnel: "acme corp"}, "printable ASCII without spaces"},
		{"jti with space", Revocation{JTI: "a b"}, "printable ASCII without spaces"},
		{"jti too long", Revocation{JTI: strings.Repeat("a", maxJTILength+1)}, "characters long"},
		{"until past", Revocation{Tunnel: "acme", Until: now.Add(-time.Second)}, "not in the future"},
		{"reason too long", Revocation{Tunnel: "acme", Reason: strings.Repeat("x", maxReasonLength+1)}, "--reason is"},
		{"reason with newline", Revocation{Tunnel: "acme", Reason: "a\nb"}, "control characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewRevocations(Backing{}, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.Add(t.Context(), tc.rev)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Add: %v", err)
				}
				if got.ID == "" || got.CreatedAt.IsZero() {
					t.Errorf("Add returned %+v; want an ID and CreatedAt", got)
				}
				return
			}
			if !errors.Is(err, ErrInvalidRevocation) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Add: got %v, want an ErrInvalidRevocation saying %q", err, tc.want)
			}
			if n := r.Status().Count; n != 0 {
				t.Errorf("an invalid revocation was kept: %d revocations", n)
			}
		})
	}
}

// TestRevokedChecks: a revocation covers its tunnel, or its token and the
// tokens renewed from it, and nothing else; it ends at Until; the longest
// of two revocations of one tunnel is the one in force.
func TestRevokedChecks(t *testing.T) {
	r := startRevocations(t, Backing{})
	ctx := t.Context()
	select {
	case <-r.Ready():
	default:
		t.Fatal("memory revocations are not ready at once")
	}
	ch := r.Changed()
	byTunnel, err := r.Add(ctx, Revocation{Tunnel: "acme", Reason: "offboarded"})
	if err != nil {
		t.Fatal(err)
	}
	changedWithin(t, ch, time.Second, "an Add")
	if _, err := r.Add(ctx, Revocation{JTI: "leaked"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tunnel, jti, original string
		want                  bool
	}{
		{"acme", "any", "", true},
		{"other", "leaked", "", true},
		{"other", "renewed", "leaked", true},
		{"other", "fine", "", false},
		{"other", "fine", "fine0", false},
		{"acme2", "", "", false},
	} {
		if err := revokedIs(r.Revocations, tc.want, tc.tunnel, tc.jti, tc.original)(); err != nil {
			t.Error(err)
		}
	}
	if got, _ := r.Revoked("acme", "", ""); got != byTunnel {
		t.Errorf("Revoked returned %+v, want %+v", got, byTunnel)
	}

	// A shorter revocation of the same tunnel does not hide the longer one.
	short, err := r.Add(ctx, Revocation{Tunnel: "acme", Until: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Revoked("acme", "", ""); got.ID != byTunnel.ID {
		t.Errorf("with a shorter revocation too, Revoked returned %s, want the lasting one %s", got.ID, byTunnel.ID)
	}
	ch = r.Changed()
	if _, err := r.Delete(ctx, byTunnel.ID); err != nil {
		t.Fatal(err)
	}
	changedWithin(t, ch, time.Second, "a Delete")
	if got, _ := r.Revoked("acme", "", ""); got.ID != short.ID {
		t.Errorf("after deleting the lasting one, Revoked returned %q, want %s", got.ID, short.ID)
	}
	if _, err := r.Delete(ctx, byTunnel.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Delete twice: got %v, want ErrNotFound", err)
	}

	// A revocation that ends.
	if _, err := r.Add(ctx, Revocation{Tunnel: "brief", Until: time.Now().Add(200 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	if err := revokedIs(r.Revocations, true, "brief", "", "")(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, revokedIs(r.Revocations, false, "brief", "", ""))
	list, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var tunnels []string
	for _, rev := range list {
		tunnels = append(tunnels, rev.Tunnel+rev.JTI)
	}
	if want := []string{"leaked", "acme"}; !slices.Equal(tunnels, want) {
		t.Errorf("List: got %q, want %q (in force only, oldest first)", tunnels, want)
	}
	if err := r.prune(ctx); err != nil {
		t.Fatal(err)
	}
	if n := r.Status().Count; n != 2 {
		t.Errorf("after prune: %d revocations kept, want 2", n)
	}
}

// TestRevocationsLimit: each backing refuses a revocation past the limit.
func TestRevocationsLimit(t *testing.T) {
	srv := startRedis(t)
	for _, tc := range []struct {
		name string
		b    Backing
	}{
		{"memory", Backing{}},
		{"data-dir", Backing{Store: openStore(t, t.TempDir())}},
		{"redis", Backing{Redis: redisConn(t, srv.URL(), "a")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRevocations(t, tc.b)
			for i := range 3 {
				rev := Revocation{ID: fmt.Sprintf("r%d", i), Tunnel: "acme"}
				err := r.backend.add(t.Context(), rev, 2)
				if want := i == 2; errors.Is(err, ErrTooManyRevocations) != want {
					t.Fatalf("add #%d with a limit of 2: got %v, want ErrTooManyRevocations %v", i+1, err, want)
				}
			}
		})
	}
}

// TestRevocationsPersistInDataDir: revocations and deletions are in the
// file when the call returns, and a new process finds them.
func TestRevocationsPersistInDataDir(t *testing.T) {
	dir := t.TempDir()
	store := openStore(t, dir)
	r := startRevocations(t, Backing{Store: store})
	if r.Kind() != KindDataDir {
		t.Errorf("kind: got %s, want %s", r.Kind(), KindDataDir)
	}
	keep, err := r.Add(t.Context(), Revocation{Tunnel: "acme", Reason: "offboarded", Until: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := r.Add(t.Context(), Revocation{JTI: "leaked"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Delete(t.Context(), gone.ID); err != nil {
		t.Fatal(err)
	}
	r.stop()
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	again := startRevocations(t, Backing{Store: openStore(t, dir)})
	list, err := again.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || !sameRevocation(list[0], keep) {
		t.Fatalf("after reopening: got %+v, want [%+v]", list, keep)
	}
	if err := revokedIs(again.Revocations, true, "acme", "", "")(); err != nil {
		t.Error(err)
	}
}

// sameRevocation compares revocations as they come back from JSON.
func sameRevocation(a, b Revocation) bool {
	return a.ID == b.ID && a.Tunnel == b.Tunnel && a.JTI == b.JTI && a.Reason == b.Reason &&
		a.Until.Equal(b.Until) && a.CreatedAt.Equal(b.CreatedAt)
}

// shareBound is how soon a replica must learn another's change: the
// server's bound for closing a revoked tunnel's sessions is 5 s.
const shareBound = 2 * time.Second

// TestRevocationsSharedByReplicas: a revocation and its deletion made on one
// replica reach the other within the bound, and wake its Changed.
func TestRevocationsSharedByReplicas(t *testing.T) {
	srv := startRedis(t)
	a := startRevocations(t, Backing{Redis: redisConn(t, srv.URL(), "a")})
	b := startRevocations(t, Backing{Redis: redisConn(t, srv.URL(), "b")})
	for _, r := range []*liveRevocations{a, b} {
		select {
		case <-r.Ready():
		case <-time.After(5 * time.Second):
			t.Fatal("revocations not loaded from Redis within 5s")
		}
	}

	ch := b.Changed()
	start := time.Now()
	rev, err := a.Add(t.Context(), Revocation{Tunnel: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if err := revokedIs(a.Revocations, true, "acme", "", "")(); err != nil {
		t.Fatalf("on the replica that added it: %v", err)
	}
	changedWithin(t, ch, shareBound, "another replica's Add")
	if err := revokedIs(b.Revocations, true, "acme", "", "")(); err != nil {
		t.Fatalf("%v, %v after the other replica added it", err, time.Since(start))
	}
	t.Logf("the other replica knew of the revocation after %v", time.Since(start))

	ch = a.Changed()
	if _, err := b.Delete(t.Context(), rev.ID); err != nil {
		t.Fatal(err)
	}
	changedWithin(t, ch, shareBound, "another replica's Delete")
	if err := revokedIs(a.Revocations, false, "acme", "", "")(); err != nil {
		t.Fatal(err)
	}
	if got := srv.keys(t); !slices.Equal(got, []string{"tether:revocations:version"}) {
		t.Errorf("keys in redis: got %q, want only the version", got)
	}
}

// TestRevocationsAcrossReconnect: a replica cut off from Redis while
// another revokes a tunnel knows of it within the bound once it is back;
// meanwhile it keeps what it knew.
func TestRevocationsAcrossReconnect(t *testing.T) {
	srv := startRedis(t)
	p := newPartition(t, srv.Addr)
	a := startRevocations(t, Backing{Redis: redisConn(t, srv.URL(), "a")})
	b := startRevocations(t, Backing{Redis: redisConn(t, p.url(), "b")})
	old, err := a.Add(t.Context(), Revocation{Tunnel: "old"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, shareBound, revokedIs(b.Revocations, true, "old", "", ""))

	p.cutOff()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if b.Status().LastError == "" {
			return errors.New("b has not noticed that Redis is away")
		}
		return nil
	})
	if _, err := a.Add(t.Context(), Revocation{Tunnel: "acme"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Delete(t.Context(), old.ID); err != nil {
		t.Fatal(err)
	}
	quietFor(t, 500*time.Millisecond, revokedIs(b.Revocations, true, "old", "", ""))

	p.heal()
	healed := time.Now()
	testutil.WaitFor(t, 10*time.Second, all(
		revokedIs(b.Revocations, true, "acme", "", ""),
		revokedIs(b.Revocations, false, "old", "", ""),
	))
	// The subscription retries at least every second.
	if took := time.Since(healed); took > shareBound+time.Second {
		t.Errorf("b learned the changes %v after Redis was back; want within %v (with slack)", took, shareBound)
	}
	if warns := b.logs.FilterMessageSnippet("unreachable").FilterLevelExact(zapcore.WarnLevel).Len(); warns != 1 {
		t.Errorf("the outage was logged %d times at Warn, want once", warns)
	}
}

// TestRevocationsSurviveRedisRestart: with AOF, Redis keeps the revocations
// across a crash, and a replica started afterwards loads them.
func TestRevocationsSurviveRedisRestart(t *testing.T) {
	srv := startRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	a := startRevocations(t, Backing{Redis: redisConn(t, srv.URL(), "a")})
	rev, err := a.Add(t.Context(), Revocation{JTI: "leaked", Until: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	a.stop() // no replica could write it back
	srv.Restart()

	b := startRevocations(t, Backing{Redis: redisConn(t, srv.URL(), "b")})
	testutil.WaitFor(t, 5*time.Second, revokedIs(b.Revocations, true, "", "x", "leaked"))
	list, err := b.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || !sameRevocation(list[0], rev) {
		t.Errorf("after the restart: got %+v, want [%+v]", list, rev)
	}
}

// TestRevocationsRestoredIntoEmptyRedis: when Redis comes back empty, a
// running replica writes its copy back, so a revoked tunnel stays revoked
// for a replica that starts afterwards.
func TestRevocationsRestoredIntoEmptyRedis(t *testing.T) {
	srv := startRedis(t)
	a := startRevocations(t, Backing{Redis: redisConn(t, srv.URL(), "a")})
	if _, err := a.Add(t.Context(), Revocation{Tunnel: "acme"}); err != nil {
		t.Fatal(err)
	}
	srv.Restart() // empty
	b := startRevocations(t, Backing{Redis: redisConn(t, srv.URL(), "b")})
	testutil.WaitFor(t, 10*time.Second, revokedIs(b.Revocations, true, "acme", "", ""))
	if n := a.logs.FilterMessageSnippet("wrote this replica's copy back").Len(); n != 1 {
		t.Errorf("the restore was logged %d times, want once", n)
	}
}

// TestRevokedWhileChanging: checks run concurrently with additions and
// deletions (for the race detector), and see each settled state.
func TestRevokedWhileChanging(t *testing.T) {
	r := startRevocations(t, Backing{Store: openStore(t, t.TempDir())})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				ch := r.Changed()
				r.Revoked("acme", "jti", "orig")
				select {
				case <-ch:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	for i := range 20 {
		rev, err := r.Add(t.Context(), Revocation{Tunnel: fmt.Sprintf("t%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if err := revokedIs(r.Revocations, true, rev.Tunnel, "", "")(); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Delete(t.Context(), rev.ID); err != nil {
			t.Fatal(err)
		}
		if err := revokedIs(r.Revocations, false, rev.Tunnel, "", "")(); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()
}

// slowLoad holds its first load, after reading, until released: a reload
// that read before a change made here and would land after it.
type slowLoad struct {
	revocationBackend
	read, release chan struct{}
	once          sync.Once
}

func (s *slowLoad) load(ctx context.Context, cur *revocationSet) (uint64, map[string]Revocation, error) {
	v, revs, err := s.revocationBackend.load(ctx, cur)
	s.once.Do(func() {
		close(s.read)
		<-s.release
	})
	return v, revs, err
}

// TestReloadDoesNotUndoLocalChange: a reload that read the store before an
// Add here does not put back the set without it.
func TestReloadDoesNotUndoLocalChange(t *testing.T) {
	r, err := NewRevocations(Backing{}, nopLog)
	if err != nil {
		t.Fatal(err)
	}
	slow := &slowLoad{revocationBackend: r.backend, read: make(chan struct{}), release: make(chan struct{})}
	r.backend = slow
	listed := make(chan error)
	go func() {
		_, err := r.List(t.Context())
		listed <- err
	}()
	<-slow.read
	if _, err := r.Add(t.Context(), Revocation{Tunnel: "acme"}); err != nil {
		t.Fatal(err)
	}
	close(slow.release)
	if err := <-listed; err != nil {
		t.Fatal(err)
	}
	if err := revokedIs(r, true, "acme", "", "")(); err != nil {
		t.Fatalf("after a reload that raced the Add: %v", err)
	}
}
