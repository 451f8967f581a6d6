package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// The server's fair shares, as tunnel/server sets them by default.
const (
	maxHTTPConnectionsPerIP = 1024
	maxRequestsPerCaller    = 256          // a quarter of --max-requests-per-tunnel
	entryConnMemory         = 96 << 10     // the most one entry connection may hold
	unknownAnonymous        = 1024 * 3 / 4 // anonymous slots addresses not known may hold
)

// raiseFDLimit raises this process's soft limit of open files to at least
// need (the server, started after, inherits it).
func raiseFDLimit(t testing.TB, need uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= need {
		return
	}
	if rl.Max < need {
		t.Fatalf("this test opens %d files; the hard limit is %d: raise it (ulimit -Hn)", need, rl.Max)
	}
	rl.Cur = need
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatalf("raise the open files limit to %d: %v", need, err)
	}
}

// watchNew watches tunnel with requests on new connections, as callers
// that come and go make them.
func (s *server) watchNew(tunnel string) *watcher { return s.watchWith(quickc, tunnel, tunnel) }

// waitServed waits until w has seen more requests answered, and fails the
// test if any failed.
func (w *watcher) waitServed(t testing.TB, more int64, during string) {
	t.Helper()
	want := w.ok.Load() + more
	testutil.WaitFor(t, time.Minute, func() error {
		if got := w.ok.Load(); got < want {
			return fmt.Errorf("%d requests answered %s, want %d; failed: %s", got, during, want, w.lastFailure())
		}
		return nil
	})
	w.check(t, during)
	w.mu.Lock()
	defer w.mu.Unlock()
	took := slices.Sorted(slices.Values(w.took))
	t.Logf("%d requests %s: median %v, 99th percentile %v, slowest %v", len(took), during,
		took[len(took)/2].Round(time.Microsecond), took[len(took)*99/100].Round(time.Microsecond), took[len(took)-1].Round(time.Microsecond))
}

func (w *watcher) lastFailure() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.fails) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d, the last %s", len(w.fails), w.fails[len(w.fails)-1])
}

// TestEntryIdleFloodFromOneAddress: one address opened all 8,192 of the
// entry's connections as idle keep-alives in under a second, and every
// other caller's new connection was reset. Now an address holds
// --max-http-connections-per-ip connections, recycling its own idle ones,
// and callers that come and go keep being answered; what the flood holds
// is bounded by the per-address cap.
func TestEntryIdleFloodFromOneAddress(t *testing.T) {
	const flood = 8192
	raiseFDLimit(t, 2*flood+1024)
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	be := newBackend(t, "alpha", nil)
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + be.url()}})
	srv.waitServed(t, "alpha")
	pid := srv.cmd.Process.Pid
	before := procMemory(t, pid, "VmRSS")

	callers := srv.watchNew("alpha")
	defer callers.stop()
	start := time.Now()
	conns, refused := idleFlood(t, srv.httpAddr, "127.0.0.2", flood)
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	t.Logf("%d idle keep-alive connections opened from one address in %v (%d refused)", flood, time.Since(start).Round(time.Millisecond), refused)
	callers.waitServed(t, 50, "on new connections while one address opened 8,192 idle keep-alive connections")

	held := srv.metric(t, "tether_http_connections")
	evicted := srv.metric(t, "tether_connections_refused_total", "reason", "http_idle_evicted_per_ip")
	grown := procMemory(t, pid, "VmHWM") - before
	t.Logf("the entry holds %v connections; %v of the flood's were closed to make room for its next; the server's RSS grew by %d MiB at most",
		held, evicted, grown>>20)
	if held > maxHTTPConnectionsPerIP+8 {
		t.Errorf("the entry holds %v connections, want about --max-http-connections-per-ip (%d)", held, maxHTTPConnectionsPerIP)
	}
	if evicted != flood-maxHTTPConnectionsPerIP {
		t.Errorf("tether_connections_refused_total{reason=http_idle_evicted_per_ip} = %v, want %d", evicted, flood-maxHTTPConnectionsPerIP)
	}
	if bound := int64(maxHTTPConnectionsPerIP)*entryConnMemory + 32<<20; grown > bound {
		t.Errorf("the server's RSS grew by %d MiB, want at most %d MiB", grown>>20, bound>>20)
	}
}

// idleFlood opens n connections from src to the entry at addr, each left
// idle after one request answered by the entry itself (a host that is no
// tunnel's), 64 at a time. A flood does not mind connections refused: it
// counts them.
func idleFlood(t testing.TB, addr, src string, n int) (conns []net.Conn, refused int64) {
	t.Helper()
	conns = make([]net.Conn, n)
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	for range 64 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				c, err := d.DialContext(t.Context(), "tcp", addr)
				if err == nil {
					conns[i] = c
					_ = c.SetDeadline(time.Now().Add(30 * time.Second))
					_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: nosuch.example\r\n\r\n")
				}
				if err == nil {
					var res *http.Response
					if res, err = http.ReadResponse(bufio.NewReader(c), nil); err == nil {
						_, _ = io.Copy(io.Discard, res.Body)
						_ = res.Body.Close()
						_ = c.SetDeadline(time.Time{})
					}
				}
				if err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return conns, failed.Load()
}

// TestTricklingBodiesToOneTunnel: one caller sent 1,024 POSTs to a tunnel,
// trickling a byte of body every 10 s, and the tunnel's other callers got
// 503 tunnel_busy for as long as it liked. Now the caller holds its share
// of the tunnel's requests, the rest of its POSTs are answered 429
// caller_busy at once, and the other callers keep being served.
func TestTricklingBodiesToOneTunnel(t *testing.T) {
	const bodies = 1024
	raiseFDLimit(t, 2*bodies+1024)
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	var uploading atomic.Int64
	be := newBackend(t, "alpha", map[string]http.HandlerFunc{
		"/upload": func(w http.ResponseWriter, r *http.Request) {
			uploading.Add(1)
			defer uploading.Add(-1)
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "got %d", n)
		},
	})
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + be.url()}})
	srv.waitServed(t, "alpha")
	pid := srv.cmd.Process.Pid
	before := procMemory(t, pid, "VmRSS")

	post := "POST /upload HTTP/1.1\r\nHost: alpha." + domain + "\r\nContent-Length: 1000000\r\n\r\nx"
	trickle := trickleBodies(t, srv.httpAddr, "127.0.0.2", post, bodies, 10*time.Second)
	defer trickle.stop()
	// Every POST is at the upstream or answered.
	testutil.WaitFor(t, time.Minute, func() error {
		if got, answered := uploading.Load(), trickle.answered(); got+int64(answered) != bodies {
			return fmt.Errorf("%d POSTs at the upstream and %d answered, want %d in all", got, answered, bodies)
		}
		return nil
	})
	callers := srv.watchNew("alpha")
	defer callers.stop()
	callers.waitServed(t, 50, "on new connections while one caller held the tunnel's requests with trickling bodies")
	grown := procMemory(t, pid, "VmHWM") - before
	codes := trickle.answers()
	t.Logf("answers to the trickling POSTs: %v; the server's RSS grew by %d MiB at most (%d KiB per request held)",
		codes, grown>>20, grown/maxRequestsPerCaller>>10)
	if codes[http.StatusTooManyRequests] != bodies-maxRequestsPerCaller || codes[0] != maxRequestsPerCaller {
		t.Errorf("answers to the trickling POSTs: %v, want %d held and %d answered 429", codes, maxRequestsPerCaller, bodies-maxRequestsPerCaller)
	}
	if got := srv.metric(t, "tether_http_unrouted_requests_total", "reason", "caller_busy"); got != bodies-maxRequestsPerCaller {
		t.Errorf("tether_http_unrouted_requests_total{reason=caller_busy} = %v, want %d", got, bodies-maxRequestsPerCaller)
	}
	if bound := int64(maxRequestsPerCaller)*requestMemory + 32<<20; grown > bound {
		t.Errorf("the server's RSS grew by %d MiB, want at most %d MiB", grown>>20, bound>>20)
	}
}

// requestMemory bounds what a request held in flight with its body
// unfinished holds on the server: its connection, its goroutines, its
// stream and their buffers.
const requestMemory = 256 << 10

// trickling is a set of requests whose bodies come a byte at a time.
type trickling struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	n      int
	mu     sync.Mutex
	codes  map[int]int // answers by status; 0: none yet
}

// trickleBodies sends head (and the body's first byte) n times from src on
// connections of their own, then one more byte of each body every period
// until stop.
func trickleBodies(t testing.TB, addr, src, head string, n int, period time.Duration) *trickling {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	tr := &trickling{cancel: cancel, n: n, codes: map[int]int{0: n}}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	var opened sync.WaitGroup
	for range n {
		opened.Add(1)
		tr.wg.Go(func() {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				_, err = io.WriteString(c, head)
			}
			opened.Done()
			if err != nil {
				t.Errorf("send a trickling request: %v", err)
				return
			}
			stop := context.AfterFunc(ctx, func() { _ = c.Close() })
			defer stop()
			defer c.Close()
			go tr.trickle(ctx, c, period)
			if res, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				_ = res.Body.Close()
				tr.mu.Lock()
				tr.codes[0]--
				tr.codes[res.StatusCode]++
				tr.mu.Unlock()
			}
		})
	}
	opened.Wait()
	return tr
}

// trickle writes a byte on c every period until ctx ends or the write
// fails.
func (tr *trickling) trickle(ctx context.Context, c net.Conn, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
		}
	}
}

// answered is the number of requests answered so far.
func (tr *trickling) answered() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.n - tr.codes[0]
}

func (tr *trickling) answers() map[int]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return maps.Clone(tr.codes)
}

func (tr *trickling) stop() {
	tr.cancel()
	tr.wg.Wait()
}

// TestAnonymousFloodWhileClientLogsIn: 16 addresses held all 1,024 of the
// tunnel port's slots for connections not logged in with about 100 idle
// TCP connects a second, and a client that logs in in 0.14 s logged in
// only once the flood stopped. Now a connection that sends nothing is
// closed after 5 s, and at the cap the one that has kept the server
// waiting longest makes room: the client logs in while the flood goes on.
func TestAnonymousFloodWhileClientLogsIn(t *testing.T) {
	raiseFDLimit(t, 4096)
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	siege := testutil.Siege{Addr: srv.tunnelAddr, Sources: sourceAddrs(1, 16), PerSource: maxAnonymousPerIP, RefusedPause: 100 * time.Millisecond}.Start(t.Context())
	defer siege.Stop()
	testutil.WaitFor(t, time.Minute, func() error {
		if n := srv.metric(t, "tether_anonymous_connections"); n < unknownAnonymous {
			return fmt.Errorf("tether_anonymous_connections = %v, want the flood to hold at least %d", n, unknownAnonymous)
		}
		return nil
	})
	// Everything the flood holds is fresh: let it go stale, as it does
	// when a flood holds the slots for longer.
	floodStart := time.Now()
	dials := siege.Dials()
	testutil.WaitFor(t, time.Minute, func() error {
		if d := time.Since(floodStart); d < 3*time.Second {
			return fmt.Errorf("the flood has held the slots for %v", d)
		}
		return nil
	})

	start := time.Now()
	be := newBackend(t, "alpha", nil)
	c := startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + be.url()}, noWait: true})
	c.waitReady(t, 20*time.Second)
	took := time.Since(start)
	if siege.Open() < unknownAnonymous/2 {
		t.Errorf("the flood has %d connections open, want it still holding the slots", siege.Open())
	}
	t.Logf("the client was ready %v after it started, during a flood from %d addresses (%d connections open, %.0f connects a second)",
		took.Round(time.Millisecond), len(sourceAddrs(1, 16)), siege.Open(), float64(siege.Dials()-dials)/time.Since(floodStart).Seconds())
	t.Logf("closed for want of a first byte: %v; evicted: %v", srv.metric(t, "tether_sessions_closed_by_limit_total", "limit", "first_byte"),
		srv.metric(t, "tether_sessions_closed_by_limit_total", "limit", "evicted"))
	srv.waitServedBy(t, "alpha", "alpha", 10*time.Second)
}

// TestReservedShareForKnownClients: addresses whose clients were logged in
// within the hour keep a quarter of the tunnel port's anonymous slots. A
// flood whose connections keep sending (one byte of a ClientHello every
// 500 ms, so none goes stale) holds the rest; a client that was connected
// comes back at once, as every client does after a network blip.
func TestReservedShareForKnownClients(t *testing.T) {
	raiseFDLimit(t, 4096)
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	be := newBackend(t, "alpha", nil)
	token := writeToken(t, k.issue(t, "alpha", time.Hour))
	first := startClient(t, srv, clientOpts{tokenFile: token, routes: []string{"/=" + be.url()}})
	first.stop()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if n := len(srv.sessions(t)); n != 0 {
			return fmt.Errorf("%d sessions left", n)
		}
		return nil
	})

	siege := testutil.Siege{Addr: srv.tunnelAddr, Sources: sourceAddrs(1, 16), PerSource: maxAnonymousPerIP,
		Trickle: 500 * time.Millisecond, RefusedPause: 200 * time.Millisecond}.Start(t.Context())
	defer siege.Stop()
	testutil.WaitFor(t, time.Minute, func() error {
		n := srv.metric(t, "tether_anonymous_connections")
		if n < unknownAnonymous {
			return fmt.Errorf("tether_anonymous_connections = %v, want the flood to hold at least %d", n, unknownAnonymous)
		}
		// Full: the flood's next connections are refused (or it holds
		// every slot).
		if r := srv.metric(t, "tether_connections_refused_total", "reason", "anonymous"); r == 0 && n < 1024 {
			return fmt.Errorf("tether_anonymous_connections = %v, and none refused at the cap yet", n)
		}
		return nil
	})

	start := time.Now()
	again := startClient(t, srv, clientOpts{tokenFile: token, routes: []string{"/=" + be.url()}, noWait: true})
	again.waitReady(t, 20*time.Second)
	t.Logf("the client that was connected came back %v after it started, during a flood of %d connections that keep sending (%v evicted)",
		time.Since(start).Round(time.Millisecond), siege.Open(), srv.metric(t, "tether_sessions_closed_by_limit_total", "limit", "evicted"))
	srv.waitServedBy(t, "alpha", "alpha", 10*time.Second)
}

// TestAmbiguousLengthClosesTheConnection: a request with both
// Content-Length and Transfer-Encoding was served by the chunks and its
// connection kept, where a proxy in front may have read the other header
// and hidden a second request in the body. It is answered 400 and its
// connection closed (RFC 9112, section 6.3), before any tunnel sees it.
func TestAmbiguousLengthClosesTheConnection(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	be := newBackend(t, "alpha", nil)
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + be.url()}})
	srv.waitServed(t, "alpha")
	hits := be.hits.Load()

	// A second request in the body, for whoever frames it by its length.
	body := "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: alpha." + domain + "\r\n\r\n"
	r, after := exchangeOnce(t, srv.httpAddr, fmt.Sprintf("POST /hook HTTP/1.1\r\nHost: alpha.%s\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%s",
		domain, len(body), body), 10*time.Second)
	if r.code != http.StatusBadRequest || r.header.Get("X-Tether-Error") != "bad_request" {
		t.Errorf("a request with both Content-Length and Transfer-Encoding: %d %s %q; want 400 bad_request", r.code, r.header.Get("X-Tether-Error"), r.body)
	}
	if after != nil {
		t.Errorf("after the answer: %v; want the connection closed", after)
	}
	if n := be.hits.Load() - hits; n != 0 {
		t.Errorf("the tunnel's upstream got %d requests, want none", n)
	}
	if got := srv.metric(t, "tether_http_unrouted_requests_total", "reason", "ambiguous_length"); got != 1 {
		t.Errorf("tether_http_unrouted_requests_total{reason=ambiguous_length} = %v, want 1", got)
	}
}

// TestBodyIdleTimeoutAgainstTheServer: a request body that sends nothing
// for --body-idle-timeout is answered 408 and its connection closed, and
// the tunnel's slot it held is free again.
func TestBodyIdleTimeoutAgainstTheServer(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{args: []string{"--body-idle-timeout", "1s", "--max-requests-per-tunnel", "1"}})
	be := newBackend(t, "alpha", map[string]http.HandlerFunc{
		"/upload": func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) },
	})
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + be.url()}})
	srv.waitServed(t, "alpha")

	r, after := exchangeOnce(t, srv.httpAddr, "POST /upload HTTP/1.1\r\nHost: alpha."+domain+"\r\nContent-Length: 100\r\n\r\nabc", 20*time.Second)
	if r.code != http.StatusRequestTimeout || r.header.Get("X-Tether-Error") != "body_timeout" || !strings.Contains(r.body, "--body-idle-timeout") {
		t.Errorf("a body that stalled: %d %s %q; want 408 body_timeout naming the flag", r.code, r.header.Get("X-Tether-Error"), r.body)
	}
	if after != nil {
		t.Errorf("after the answer: %v; want the connection closed", after)
	}
	// The tunnel's one slot is free again.
	srv.waitServedBy(t, "alpha", "alpha", 10*time.Second)
}

// exchangeOnce writes raw on a new connection to addr and reads the answer
// within timeout; after says what the connection gave next, nil when the
// server closed it.
func exchangeOnce(t testing.TB, addr, raw string, timeout time.Duration) (r response, after error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read the answer to %q: %v", strings.SplitN(raw, "\r\n", 2)[0], err)
	}
	b, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	r = response{code: res.StatusCode, header: res.Header, body: string(b)}
	switch next, err := br.ReadString('\n'); {
	case next != "":
		return r, fmt.Errorf("it sent %q", next)
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return r, nil
	default:
		return r, fmt.Errorf("reading on: %w", err)
	}
}
