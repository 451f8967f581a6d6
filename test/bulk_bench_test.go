package test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// bulkSize is the body of one bulk transfer.
const bulkSize = 64 << 20

// BenchmarkBulkDownload measures a large response body through the tether
// binary's server and client, each its own process as in production; the
// upstream and the HTTP client run in the benchmark's process. Beside the
// body's throughput it reports the tunnel's CPU time (server and client,
// user and system) per GB: unlike the in-process benchmarks of
// tunnel/server, it counts what a hand-over between the processes costs
// (a thread woken, a context switch), which is most of what the tunnel
// spends per frame.
func BenchmarkBulkDownload(b *testing.B) { benchmarkBulk(b, http.MethodGet) }

// BenchmarkBulkUpload is BenchmarkBulkDownload for a large request body.
func BenchmarkBulkUpload(b *testing.B) { benchmarkBulk(b, http.MethodPost) }

func benchmarkBulk(b *testing.B, method string) {
	chunk := []byte(strings.Repeat("0123456789abcdef", 4<<10)) // 64 KiB
	upstream := newBackend(b, "bulk", map[string]http.HandlerFunc{
		"/large": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(bulkSize))
			for n := bulkSize; n > 0; n -= len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		},
		"/upload": func(w http.ResponseWriter, r *http.Request) {
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprint(w, n)
		},
	})
	k := newKeys(b)
	s := startServer(b, k, serverOpts{})
	c := startClient(b, s, clientOpts{
		tokenFile: writeToken(b, k.issue(b, "bulk", time.Hour)),
		routes:    []string{"/=" + upstream.url()},
	})
	b.SetBytes(bulkSize)
	cpu0 := procCPU(b, s.proc) + procCPU(b, c.proc)
	b.ResetTimer()
	for range b.N {
		req := testutil.BulkRequest(b, method, "http://"+s.httpAddr, "bulk."+domain, bulkSize)
		testutil.TransferBulk(b, streamc, req, bulkSize)
	}
	b.StopTimer()
	cpu := procCPU(b, s.proc) + procCPU(b, c.proc) - cpu0
	b.ReportMetric(cpu.Seconds()/(float64(b.N)*bulkSize/1e9), "tunnel-cpu-s/GB")
}

// procCPU is the CPU time (user and system) p has used, from /proc.
func procCPU(b *testing.B, p *proc) time.Duration {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		b.Fatalf("CPU time of %s: %v", p.name, err)
	}
	// The fields after the command (which may hold spaces) in parentheses;
	// utime and stime are the 14th and 15th, in clock ticks (USER_HZ,
	// 100 a second on Linux).
	_, rest, _ := strings.Cut(string(stat), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		b.Fatalf("CPU time of %s: unexpected /proc stat %q", p.name, stat)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("CPU time of %s: unexpected /proc stat %q", p.name, stat)
	}
	return time.Duration(utime+stime) * (time.Second / 100)
}
