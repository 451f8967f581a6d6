package registry

import (
	"fmt"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// BenchmarkHolders measures the request path's lookup of where a tunnel is:
// a read of the local cache, against what one round trip to Redis (a GET on
// loopback) would cost instead.
func BenchmarkHolders(b *testing.B) {
	const tunnels = 1000
	srv := startRedis(b)
	a := newReplica(b, srv.URL(), "a", "")
	names := make([]string, tunnels)
	for i := range names {
		names[i] = fmt.Sprintf("t%d", i)
		a.Hold(names[i])
	}
	a.start(b)
	r := runReplica(b, srv.URL(), "r")
	testutil.WaitFor(b, 10*time.Second, func() error {
		if n := r.Status().Remote; n != tunnels {
			return fmt.Errorf("the cache has %d tunnels, want %d", n, tunnels)
		}
		return nil
	})

	b.Run("cache", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if len(r.Holders(names[i%tunnels])) != 1 {
					b.Fatal("tunnel not found in the cache")
				}
				i++
			}
		})
	})
	b.Run("redis-round-trip", func(b *testing.B) {
		c := srv.client()
		defer c.Close()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if err := c.Get(b.Context(), r.schema.key(names[i%tunnels], "a")).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRevoked measures the check at every login: with no revocation,
// with 10,000 that do not cover the login, and with one that does.
func BenchmarkRevoked(b *testing.B) {
	ctx := b.Context()
	empty, err := NewRevocations(Backing{}, nopLog)
	if err != nil {
		b.Fatal(err)
	}
	many, err := NewRevocations(Backing{}, nopLog)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10_000 {
		rev := Revocation{Tunnel: fmt.Sprintf("t%d", i)}
		if i%2 == 1 {
			rev = Revocation{JTI: fmt.Sprintf("jti%d", i)}
		}
		if _, err := many.Add(ctx, rev); err != nil {
			b.Fatal(err)
		}
	}
	for _, bc := range []struct {
		name   string
		r      *Revocations
		tunnel string
		want   bool
	}{
		{"none", empty, "acme", false},
		{"10k-miss", many, "acme", false},
		{"10k-hit", many, "t42", true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, got := bc.r.Revoked(bc.tunnel, "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"); got != bc.want {
						b.Errorf("Revoked(%s): got %v, want %v", bc.tunnel, got, bc.want)
						return
					}
				}
			})
		})
	}
}
