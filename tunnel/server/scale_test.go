package server

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// What an idle session costs the server, measured on the tether binary run
// as a server process, with the sessions opened by the load generator
// (loadgen_test.go) in this process: b.N sessions, two per tunnel (a tether
// client's default --connections), then the server's heap, stacks,
// goroutines and RSS per session, and its CPU while every session idles.
//
//	go test -run '^$' -bench '^BenchmarkIdleSessions$' -benchtime 1000x ./tunnel/server/
//	make scale   # 10,000 tunnels x 2 sessions
//
// ns/op is the time to open a session (TLS, login, route), with
// scale.parallel of them at once. The binary is $TETHER_BIN, or built
// from this module.
var (
	scaleIdle        = flag.Duration("scale.idle", 10*time.Second, "BenchmarkIdleSessions: how long to measure the idle server's CPU")
	scaleHeapProfile = flag.String("scale.heapprofile", "", "BenchmarkIdleSessions: write the server's heap profile with every session open to this file")
	scaleGoroutines  = flag.String("scale.goroutines", "", "BenchmarkIdleSessions: write the server's goroutines with every session open (pprof debug=1) to this file")
	scaleParallel    = flag.Int("scale.parallel", 32, "BenchmarkIdleSessions: sessions being opened at once")
	scaleServerArgs  = flag.String("scale.server-args", "", "BenchmarkIdleSessions: extra flags of `tether server`, space-separated")
	scaleCPUProfile  = flag.String("scale.cpuprofile", "", "BenchmarkIdleSessions: write the server's CPU profile over the idle time to this file")
	scaleServerEnv   = flag.String("scale.server-env", "", "BenchmarkIdleSessions: extra environment of `tether server`, space-separated KEY=VALUE")
	scaleHeartbeat   = flag.Duration("scale.client-heartbeat", 0, "BenchmarkIdleSessions: the sessions' heartbeat timeout (default: the client's)")
)

func BenchmarkIdleSessions(b *testing.B) {
	const perTunnel = 2
	tunnels := (b.N + perTunnel - 1) / perTunnel
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		b.Fatal(err)
	}
	// This process holds one end of every session, the server the other;
	// the server inherits the limit.
	plan := loadPlan{Tunnels: tunnels, PerTunnel: perTunnel, Sources: sources(16), Parallel: *scaleParallel, Heartbeat: *scaleHeartbeat}
	if err := plan.check(rl.Cur); err != nil {
		b.Fatal(err)
	}
	k := newKeys(b)
	srv := startServerProcess(b, tetherBinary(b), k, strings.Fields(*scaleServerArgs)...)
	plan.Addr = srv.tunnel

	before := srv.stats(b)
	b.ResetTimer()
	lg, err := openLoad(b.Context(), plan, k)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.Cleanup(lg.Close)
	n := lg.Len()
	// Every session logged in, registered its route and was told hello:
	// the server has done all it does for a new session.
	testutil.WaitFor(b, time.Minute, func() error {
		if got := lg.notices.Load(); got < int64(n) {
			return fmt.Errorf("%d of %d sessions have their hello; waiting: %v", got, n, lg.waiting(5))
		}
		return nil
	})
	after := srv.stats(b)
	if after.sessions != float64(n) {
		b.Fatalf("the server counts %v sessions, want %d", after.sessions, n)
	}
	if *scaleHeapProfile != "" {
		srv.save(b, "/debug/pprof/heap?gc=1", *scaleHeapProfile)
	}
	if *scaleGoroutines != "" {
		srv.save(b, "/debug/pprof/goroutine?debug=1", *scaleGoroutines)
	}
	cpuBefore := srv.cpu(b)
	idleStart := time.Now()
	if *scaleCPUProfile != "" {
		srv.save(b, fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(scaleIdle.Seconds())), *scaleCPUProfile)
	} else {
		idle := time.NewTimer(*scaleIdle)
		<-idle.C
	}
	cpu := srv.cpu(b) - cpuBefore
	idleFor := time.Since(idleStart)
	if closed := lg.closed(); closed > 0 {
		b.Fatalf("%d sessions ended while idle", closed)
	}

	per := func(a, b float64) float64 { return (a - b) / float64(n) }
	b.ReportMetric(per(after.heap, before.heap), "heap-B/session")
	b.ReportMetric(per(after.live, before.live), "live-B/session")
	b.ReportMetric(per(after.stack, before.stack), "stack-B/session")
	b.ReportMetric(per(after.goroutines, before.goroutines), "goroutines/session")
	b.ReportMetric(per(after.rss, before.rss), "rss-B/session")
	b.ReportMetric(float64(cpu.Milliseconds())*float64(10*time.Second)/float64(idleFor), "idle-cpu-ms/10s")
	b.Logf("%d tunnels x %d sessions: server RSS %.0f MiB (%.0f MiB before), heap in use %.0f MiB, stacks %.0f MiB, %v goroutines; idle CPU %v over %v",
		tunnels, perTunnel, after.rss/(1<<20), before.rss/(1<<20), after.heap/(1<<20), after.stack/(1<<20), after.goroutines,
		cpu, idleFor.Round(time.Second))
}

// serverProcess is the tether binary serving on loopback.
type serverProcess struct {
	cmd    *exec.Cmd
	tunnel string // tunnel listener address
	admin  string // http://host:port of the admin endpoints
}

// startServerProcess runs `tether server` with keys k on free loopback
// ports and waits until it is ready. It stops when the benchmark ends.
func startServerProcess(tb testing.TB, bin string, k *keys, extra ...string) *serverProcess {
	tb.Helper()
	ports := freePorts(tb, 3)
	logFile, err := os.Create(filepath.Join(tb.TempDir(), "server.log"))
	if err != nil {
		tb.Fatal(err)
	}
	args := append([]string{"server",
		"--tunnel-addr", ports[0], "--http-addr", ports[1], "--admin-addr", ports[2],
		"--domain", testDomain, "--jwt-public-key", k.pubPath,
		"--max-anonymous-per-ip", "1024", "--max-sessions-per-tunnel", "16",
		"--log-format", "json", "--log-level", "warn",
	}, extra...)
	cmd := exec.CommandContext(context.Background(), bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), strings.Fields(*scaleServerEnv)...)
	if *scaleHeapProfile != "" {
		// Every 4 KiB allocated is sampled rather than every 512 KiB: a
		// session's small allocations show in the profile.
		cmd.Env = append(cmd.Env, "GODEBUG=memprofilerate=4096")
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &serverProcess{cmd: cmd, tunnel: ports[0], admin: "http://" + ports[2]}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(30 * time.Second)
		defer t.Stop()
		select {
		case <-exited:
		case <-t.C:
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
		if tb.Failed() {
			out, _ := os.ReadFile(logFile.Name())
			tb.Logf("----- server log -----\n%s", out)
		}
	})
	testutil.WaitFor(tb, 30*time.Second, func() error {
		select {
		case <-exited:
			out, _ := os.ReadFile(logFile.Name())
			tb.Fatalf("tether server exited: %s", out)
		default:
		}
		resp, err := http.Get(p.admin + "/readyz") //nolint:noctx // bounded by the default client's dial to loopback
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
	return p
}

// freePorts returns n loopback addresses with ports free a moment ago.
func freePorts(tb testing.TB, n int) []string {
	tb.Helper()
	var addrs []string
	for range n {
		ln := listen(tb)
		addrs = append(addrs, ln.Addr().String())
		defer ln.Close()
	}
	return addrs
}

// processStats are a server process's figures from its /metrics.
type processStats struct {
	heap, live, stack, rss, goroutines, sessions float64
}

// stats reads the server's metrics after a few garbage collections, so
// that the heap is what is live and idle goroutines' stacks have shrunk to
// what they use, as they do on a server that idles for a few minutes (Go
// collects at least every 2 minutes, and halves a stack that uses less than
// a quarter of its size at each collection).
func (p *serverProcess) stats(tb testing.TB) processStats {
	tb.Helper()
	for range 4 {
		p.save(tb, "/debug/pprof/heap?gc=1", os.DevNull)
	}
	resp, err := http.Get(p.admin + "/metrics") //nolint:noctx // loopback, answered at once
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	values := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			values[name] = v
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	s := processStats{
		heap: values["go_memstats_heap_inuse_bytes"], live: values["go_memstats_heap_alloc_bytes"], stack: values["go_memstats_stack_inuse_bytes"],
		rss: values["process_resident_memory_bytes"], goroutines: values["go_goroutines"],
		sessions: values["tether_sessions_connected"],
	}
	if s.heap == 0 || s.rss == 0 || s.goroutines == 0 {
		tb.Fatalf("the server's /metrics lack the Go and process metrics: %v", values)
	}
	return s
}

// save writes what the admin endpoint path answers to file.
func (p *serverProcess) save(tb testing.TB, path, file string) {
	tb.Helper()
	resp, err := http.Get(p.admin + path) //nolint:noctx // loopback
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("GET %s: %s", path, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		tb.Fatal(err)
	}
}

// cpu is the CPU time (user and system) the server has used.
func (p *serverProcess) cpu(tb testing.TB) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		tb.Fatal(err)
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

// tetherBinary is $TETHER_BIN, or the tether binary built from this
// module once per test run.
var tetherBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func tetherBinary(tb testing.TB) string {
	tb.Helper()
	if bin := os.Getenv("TETHER_BIN"); bin != "" {
		return bin
	}
	tetherBuild.once.Do(func() {
		if tetherBuild.dir, tetherBuild.err = os.MkdirTemp("", "tether-scale-"); tetherBuild.err != nil {
			return
		}
		tetherBuild.path = filepath.Join(tetherBuild.dir, "tether")
		out, err := exec.Command("go", "build", "-o", tetherBuild.path, "github.com/tether-dev/tether/cmd/tether").CombinedOutput()
		if err != nil {
			tetherBuild.err = fmt.Errorf("build tether: %w\n%s", err, out)
		}
	})
	if tetherBuild.err != nil {
		tb.Fatal(tetherBuild.err)
	}
	return tetherBuild.path
}
