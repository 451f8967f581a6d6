package server

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/internal/testutil"
)

// bulkSize is the body of one bulk transfer: large enough that a stream's
// window, TLS records and copy buffers reach their steady state.
const bulkSize = 64 << 20

// BenchmarkBulkDownload measures one large response body through the
// whole request path in one process: public entry and router, tunnel
// session (TLS, yamux), client, upstream. MB/s is the body's throughput;
// compare with BenchmarkBulkDirect for the cost of the tunnel.
func BenchmarkBulkDownload(b *testing.B) {
	s := startServerLog(b, 0, zap.NewNop())
	s.startClient(b, "alpha", bulkBackend(b).URL)
	benchmarkBulk(b, s.entry, "alpha."+testDomain, http.MethodGet)
}

// BenchmarkBulkUpload is BenchmarkBulkDownload for a large request body.
func BenchmarkBulkUpload(b *testing.B) {
	s := startServerLog(b, 0, zap.NewNop())
	s.startClient(b, "alpha", bulkBackend(b).URL)
	benchmarkBulk(b, s.entry, "alpha."+testDomain, http.MethodPost)
}

// BenchmarkBulkDirect is the download straight from the upstream.
func BenchmarkBulkDirect(b *testing.B) {
	benchmarkBulk(b, bulkBackend(b).URL, "", http.MethodGet)
}

// bulkBackend answers GET /large?bytes=N with N bytes and a
// Content-Length, and a POST with the number of body bytes it read.
func bulkBackend(b testing.TB) *httptestServer {
	b.Helper()
	chunk := []byte(strings.Repeat("0123456789abcdef", 4<<10)) // 64 KiB
	return newHTTPTestServer(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fmt.Fprint(w, n)
			return
		}
		n, err := strconv.Atoi(r.URL.Query().Get("bytes"))
		if err != nil {
			_, _ = io.WriteString(w, "ok") // the client's readiness probe
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		for n > 0 {
			k, err := w.Write(chunk[:min(n, len(chunk))])
			if err != nil {
				return
			}
			n -= k
		}
	}))
}

// benchmarkBulk moves bulkSize bytes per iteration, one transfer at a
// time: down (GET) or up (POST), and checks every byte arrived.
func benchmarkBulk(b *testing.B, base, host, method string) {
	hc := &http.Client{}
	b.Cleanup(hc.CloseIdleConnections)
	b.SetBytes(bulkSize)
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for range b.N {
		testutil.TransferBulk(b, hc, testutil.BulkRequest(b, method, base, host, bulkSize), bulkSize)
	}
	b.StopTimer()
	gb := float64(b.N) * bulkSize / 1e9
	b.ReportMetric((cpuTime(b)-cpu0).Seconds()/gb, "cpu-s/GB")
}

// cpuTime is the CPU time (user and system) the process has used: the
// benchmark's upstream and HTTP client as well as the server and client,
// whose share is what changes between runs of one benchmark.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
