package server

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// BenchmarkRequestPath measures one small GET through the whole request
// path, in one process: public entry and router, tunnel session, client,
// upstream. Compare with BenchmarkDirect for the cost of the tunnel.
func BenchmarkRequestPath(b *testing.B) {
	s := startServer(b)
	s.startClient(b, "alpha", smallBackend(b).URL)
	benchmarkGET(b, s.entry+"/small", "alpha."+testDomain)
}

// BenchmarkDirect is the same load straight to the upstream.
func BenchmarkDirect(b *testing.B) {
	benchmarkGET(b, smallBackend(b).URL+"/small", "")
}

// BenchmarkReplicaOwner and BenchmarkReplicaForwarded measure the same
// request on two replicas that share a registry: through the public entry
// of the replica that holds the tunnel's session, and through the other
// one, which forwards it over its peer connection. Their difference is the
// cost of forwarding: one HTTP hop on loopback, and no registry round trip
// (the registry answers from its cache).
func BenchmarkReplicaOwner(b *testing.B) {
	owner, _ := replicaPair(b)
	benchmarkGET(b, owner.entry+"/small", "alpha."+testDomain)
}

// BenchmarkReplicaForwarded: see BenchmarkReplicaOwner.
func BenchmarkReplicaForwarded(b *testing.B) {
	_, other := replicaPair(b)
	benchmarkGET(b, other.entry+"/small", "alpha."+testDomain)
}

// replicaPair starts two replicas of one fleet and a client of tunnel alpha
// on the first.
func replicaPair(b *testing.B) (owner, other *testServer) {
	f, k := newFleet(), newKeys(b)
	owner, other = startReplica(b, f, k, "a"), startReplica(b, f, k, "b")
	owner.runClient(b, "alpha", owner.tunnel, 1, smallBackend(b).URL)
	owner.waitSessions(b, "alpha", 1)
	testutil.WaitFor(b, 5*time.Second, func() error {
		if len(other.registry.Holders("alpha")) == 0 {
			return errors.New("the other replica does not see the tunnel")
		}
		return nil
	})
	return owner, other
}

// BenchmarkPick is the session lookup every request makes.
func BenchmarkPick(b *testing.B) {
	s := startServer(b)
	s.runClient(b, "alpha", s.tunnel, 2, smallBackend(b).URL)
	s.waitSessions(b, "alpha", 2)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if s.members.pick("alpha", false, nil) == nil {
			b.Fatal("no session")
		}
	}
}

func smallBackend(b testing.TB) *httptestServer {
	b.Helper()
	body := strings.Repeat("x", 97)
	return newHTTPTestServer(b, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, body)
	}))
}

// benchmarkGET sends GETs from 16 goroutines per CPU and reports, besides
// the time per request, the latency's median and 99th percentile.
func benchmarkGET(b *testing.B, url, host string) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var mu sync.Mutex
	var latencies []time.Duration
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		defer func() {
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		}()
		for pb.Next() {
			start := time.Now()
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Host = host
			resp, err := hc.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
			mine = append(mine, time.Since(start))
		}
	})
	b.StopTimer()
	if len(latencies) > 0 {
		slices.Sort(latencies)
		b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds()), "p99-µs")
	}
}
