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
