package buffer

import (
	"bytes"
	"fmt"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
)

// benchKinds are the stores the benchmarks measure. Redis runs with AOF
// and appendfsync always, as an operator who wants no loss runs it, and
// without AOF (a write acknowledged from memory) for comparison.
func benchKinds() []kind {
	return append(kinds()[:1],
		kind{"redis-aof-always", func(t testing.TB, cfg Config) *Buffer {
			return redisBuffer(t, testutil.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always").URL(), "a", cfg)
		}},
		kind{"redis-no-aof", func(t testing.TB, cfg Config) *Buffer {
			return redisBuffer(t, testutil.StartRedis(t).URL(), "a", cfg)
		}},
	)
}

// benchWebhook is a GitHub-sized push event: 8 KiB of JSON and its
// headers.
func benchWebhook(tunnel string) *Request {
	return &Request{
		Entry: Entry{Tunnel: tunnel, Method: http.MethodPost},
		URI:   "/webhooks",
		Header: http.Header{
			"Content-Type":        {"application/json"},
			"X-Github-Event":      {"push"},
			"X-Github-Delivery":   {"72d3162e-cc78-11e3-81ab-4c9367dc0958"},
			"X-Hub-Signature-256": {"sha256=" + string(bytes.Repeat([]byte("ab"), 32))},
		},
		Body: bytes.Repeat([]byte(`{"ref":"refs/heads/main"},`), 8<<10/26),
	}
}

var unlimited = Config{MaxRequests: 1 << 30, MaxBytes: 1 << 50, MaxTotalBytes: 1 << 50}

// BenchmarkAppend measures accepting a webhook: one caller at a time (the
// latency a 202 waits for, ns/op) and 32 callers at once (throughput,
// appends/s), each on its own tunnel.
func BenchmarkAppend(b *testing.B) {
	for _, k := range benchKinds() {
		b.Run(k.name+"/serial", func(b *testing.B) {
			buf := k.newBuffer(b, unlimited)
			req := benchWebhook("acme")
			b.SetBytes(requestSize(req))
			for b.Loop() {
				if _, err := buf.Append(b.Context(), req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
		})
		b.Run(k.name+"/parallel32", func(b *testing.B) {
			buf := k.newBuffer(b, unlimited)
			var next atomic.Int64
			b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
			b.SetBytes(requestSize(benchWebhook("t")))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := benchWebhook(fmt.Sprintf("t%d", next.Add(1)))
				for pb.Next() {
					if _, err := buf.Append(b.Context(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
		})
	}
}

// BenchmarkDeliver measures a deliverer's store work per webhook: Next
// (with the body) and Ack, one tunnel at a time as delivery goes.
func BenchmarkDeliver(b *testing.B) {
	for _, k := range benchKinds() {
		b.Run(k.name, func(b *testing.B) {
			buf := k.newBuffer(b, unlimited)
			req := benchWebhook("acme")
			b.StopTimer()
			for range b.N {
				if _, err := buf.Append(b.Context(), req); err != nil {
					b.Fatal(err)
				}
			}
			l, err := buf.Acquire(b.Context(), "acme")
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(requestSize(req))
			b.StartTimer()
			for range b.N {
				r, err := l.Next(b.Context())
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Ack(b.Context(), r.ID); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "delivered/s")
		})
	}
}
