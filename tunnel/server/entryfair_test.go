package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/internal/testutil"
)

// keptConn is a connection to the public entry that the test sends
// requests on, one after another.
type keptConn struct {
	net.Conn
	br *bufio.Reader
}

func keepConn(t testing.TB, s *testServer, src string) *keptConn {
	t.Helper()
	c := dialEntryFrom(t, s, src)
	if c == nil {
		t.Fatalf("a connection from %s was refused", src)
	}
	return &keptConn{Conn: c, br: bufio.NewReader(c)}
}

// get sends GET path for tunnel name and reads the answer.
func (k *keptConn) get(name, path string) (int, error) {
	_ = k.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = k.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(k, "GET "+path+" HTTP/1.1\r\nHost: "+name+"."+testDomain+"\r\n\r\n"); err != nil {
		return 0, err
	}
	res, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	return res.StatusCode, err
}

// idleConns opens n keep-alive connections from src, each idle after one
// request, the first the longest.
func (s *testServer) idleConns(t testing.TB, n int, src string) []*keptConn {
	t.Helper()
	var conns []*keptConn
	for range n {
		waiting := s.entryConns.waitingCount()
		k := keepConn(t, s, src)
		if code, err := k.get("alpha", "/"); err != nil || code != http.StatusOK {
			t.Fatalf("a request on keep-alive connection %d: %d %v", len(conns), code, err)
		}
		conns = append(conns, k)
		// In order: each is idle before the next is opened.
		waitCount(t, "entry connections waiting for a request", s.entryConns.waitingCount, waiting+1)
	}
	return conns
}

// busyConn opens a connection from src that has sent part of a request
// head: it waits for nothing, and is not idle.
func (s *testServer) busyConn(t testing.TB, src string) net.Conn {
	t.Helper()
	c := dialEntryFrom(t, s, src)
	if c == nil {
		t.Fatalf("a connection from %s was refused", src)
	}
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// At --max-http-connections the connection idle longest is closed to make
// room for a new one, counted; with none idle, the new one is refused.
func TestEntryEvictsTheLongestIdle(t *testing.T) {
	const limit = 4
	s := startServer(t, func(c *Config) { c.MaxHTTPConnections = limit })
	s.startClient(t, "alpha", backend(t, "alpha").URL)
	http.DefaultClient.CloseIdleConnections()
	s.waitEntryConns(t, 0)

	idle := s.idleConns(t, limit, "127.0.0.1")
	newcomer := keepConn(t, s, "127.0.0.1")
	if code, err := newcomer.get("alpha", "/new"); err != nil || code != http.StatusOK {
		t.Fatalf("a connection beyond the cap: %d %v; want it served", code, err)
	}
	if err := testutil.ClosedByServer(idle[0], 5*time.Second); err != nil {
		t.Errorf("the connection idle longest: %v; want it closed", err)
	}
	for i, k := range idle[1:] {
		if code, err := k.get("alpha", "/again"); err != nil || code != http.StatusOK {
			t.Errorf("idle connection %d: %d %v; want it kept", i+1, code, err)
		}
	}
	if got := s.refusedConns(entryCapLabels.evicted); got != 1 {
		t.Errorf("tether_connections_refused_total{reason=http_idle_evicted} = %v, want 1", got)
	}

	for _, k := range append(idle[1:], newcomer) {
		_ = k.Close()
	}
	s.waitEntryConns(t, 0)
	for range limit {
		s.busyConn(t, "127.0.0.1")
	}
	s.waitEntryConns(t, limit)
	waitCount(t, "entry connections waiting for a request", s.entryConns.waitingCount, 0)
	if err := testutil.ClosedByServer(dialEntry(t, s), 5*time.Second); err != nil {
		t.Errorf("a connection beyond the cap, none idle: %v; want it closed at once", err)
	}
	if got := s.refusedConns(entryCapLabels.refused); got != 1 {
		t.Errorf("tether_connections_refused_total{reason=http_connections} = %v, want 1", got)
	}
}

// One address holds at most --max-http-connections-per-ip connections: at
// the cap its own connection idle longest makes room, and with none idle a
// new one is refused; other addresses, and trusted proxies' however many,
// are not held back.
func TestEntryPerAddressCap(t *testing.T) {
	const perIP = 2
	s := startServer(t, func(c *Config) {
		c.MaxHTTPConnectionsPerIP = perIP
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.4/32")}
	})
	s.startClient(t, "alpha", backend(t, "alpha").URL)
	http.DefaultClient.CloseIdleConnections()
	s.waitEntryConns(t, 0)

	var busy []net.Conn
	for range perIP {
		busy = append(busy, s.busyConn(t, "127.0.0.2"))
	}
	s.waitEntryConns(t, perIP)
	waitCount(t, "entry connections waiting for a request", s.entryConns.waitingCount, 0)
	if err := testutil.ClosedByServer(dialEntryFrom(t, s, "127.0.0.2"), 5*time.Second); err != nil {
		t.Errorf("a connection beyond the address's cap: %v; want it closed at once", err)
	}
	if got := s.refusedConns(entryCapLabels.refusedPerIP); got != 1 {
		t.Errorf("tether_connections_refused_total{reason=http_connections_per_ip} = %v, want 1", got)
	}
	if code, err := keepConn(t, s, "127.0.0.3").get("alpha", "/"); err != nil || code != http.StatusOK {
		t.Errorf("another address: %d %v; want it served", code, err)
	}
	for range 3 * perIP {
		s.busyConn(t, "127.0.0.4")
	}
	s.waitEntryConns(t, 4*perIP+1)

	for _, c := range busy {
		_ = c.Close()
	}
	s.waitEntryConns(t, 3*perIP+1)
	idle := s.idleConns(t, perIP, "127.0.0.2")
	if code, err := keepConn(t, s, "127.0.0.2").get("alpha", "/"); err != nil || code != http.StatusOK {
		t.Errorf("a connection beyond the address's cap, with one of its own idle: %d %v; want it served", code, err)
	}
	if err := testutil.ClosedByServer(idle[0], 5*time.Second); err != nil {
		t.Errorf("the address's connection idle longest: %v; want it closed", err)
	}
	if got := s.refusedConns(entryCapLabels.evictedPerIP); got != 1 {
		t.Errorf("tether_connections_refused_total{reason=http_idle_evicted_per_ip} = %v, want 1", got)
	}
	if code, err := idle[1].get("alpha", "/"); err != nil || code != http.StatusOK {
		t.Errorf("the address's other idle connection: %d %v; want it kept", code, err)
	}
}

// clientFrom is an HTTP client whose connections come from src, one per
// request.
func clientFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// holder is an upstream whose /hold requests wait until release, and
// whose other requests answer at once.
type holder struct {
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

func newHolder(t testing.TB) (*holder, *httptestServer) {
	h := &holder{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	t.Cleanup(h.releaseAll)
	return h, newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hold":
			h.arrived <- struct{}{}
			<-h.release
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			h.arrived <- struct{}{}
			<-h.release
			return
		}
		fmt.Fprint(w, "ok")
	}))
}

func (h *holder) releaseAll() { h.once.Do(func() { close(h.release) }) }

// hold sends req from c in the background, and waits until the upstream
// holds it.
func (h *holder) hold(t testing.TB, c *http.Client, req *http.Request) <-chan int {
	t.Helper()
	done := make(chan int, 1)
	go func() {
		res, err := c.Do(req)
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		done <- res.StatusCode
	}()
	select {
	case <-h.arrived:
	case code := <-done:
		t.Fatalf("%s %s: answered %d, want it held by the upstream", req.Method, req.URL.Path, code)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s %s: not at the upstream within 10s", req.Method, req.URL.Path)
	}
	return done
}

func (s *testServer) entryRequest(t testing.TB, path string, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.entry+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "alpha." + testDomain
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	return req
}

// doFrom sends req with c and returns the answer's status, code and body.
func doFrom(t testing.TB, c *http.Client, req *http.Request) (int, string, http.Header) {
	t.Helper()
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header
}

// A caller holds at most --max-requests-per-caller of a tunnel's requests:
// beyond, 429 caller_busy at once, with Retry-After, while other callers
// are served. Behind a trusted proxy the caller is the client address it
// gives; from anyone else, the address a request came from, whatever its
// X-Forwarded-For says.
func TestCallerShare(t *testing.T) {
	const perCaller = 2
	s := startServer(t, func(c *Config) {
		c.MaxRequestsPerTunnel, c.MaxRequestsPerCaller = 16, perCaller
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.4/32")}
	})
	h, up := newHolder(t)
	s.startClient(t, "alpha", up.URL)
	busy := s.metrics.unrouted.WithLabelValues(unroutedCallerBusy)

	a, proxy := clientFrom("127.0.0.2"), clientFrom("127.0.0.4")
	var held []<-chan int
	for range perCaller {
		held = append(held, h.hold(t, a, s.entryRequest(t, "/hold", "X-Forwarded-For", "192.0.2.1")))
	}
	code, body, hdr := doFrom(t, a, s.entryRequest(t, "/fast", "X-Forwarded-For", "192.0.2.2"))
	if code != http.StatusTooManyRequests || hdr.Get("X-Tether-Error") != unroutedCallerBusy || hdr.Get("Retry-After") == "" ||
		!strings.Contains(body, "--max-requests-per-caller") || !strings.Contains(body, `"alpha"`) {
		t.Errorf("a request beyond the caller's share (X-Forwarded-For not believed): %d %q (%s, Retry-After %q); want 429 caller_busy naming the tunnel and the flag",
			code, body, hdr.Get("X-Tether-Error"), hdr.Get("Retry-After"))
	}
	if code, body, _ := doFrom(t, clientFrom("127.0.0.3"), s.entryRequest(t, "/fast")); code != http.StatusOK {
		t.Errorf("another caller: %d %q, want 200", code, body)
	}
	// A body that comes a byte at a time does not delay the answer: Go's
	// server would read up to 256 KiB of it first.
	c := dialEntryFrom(t, s, "127.0.0.2")
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: alpha."+testDomain+"\r\nContent-Length: 1000000\r\n\r\nx"); err != nil {
		t.Fatal(err)
	}
	if res, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || res.StatusCode != http.StatusTooManyRequests || !res.Close {
		t.Errorf("a POST beyond the caller's share, its body unsent: %v %v; want 429 at once, and the connection closed", res, err)
	}

	for range perCaller {
		held = append(held, h.hold(t, proxy, s.entryRequest(t, "/hold", "X-Forwarded-For", "203.0.113.1")))
	}
	if code, _, _ := doFrom(t, proxy, s.entryRequest(t, "/fast", "X-Forwarded-For", "198.51.100.9, 203.0.113.1")); code != http.StatusTooManyRequests {
		t.Errorf("behind a trusted proxy, the same client again: %d, want 429", code)
	}
	if code, _, _ := doFrom(t, proxy, s.entryRequest(t, "/fast", "X-Forwarded-For", "203.0.113.2")); code != http.StatusOK {
		t.Errorf("behind a trusted proxy, another client: %d, want 200", code)
	}
	if got := promtest.ToFloat64(busy); got != 3 {
		t.Errorf("tether_http_unrouted_requests_total{reason=caller_busy} = %v, want 3", got)
	}

	h.releaseAll()
	for _, done := range held {
		if code := <-done; code != http.StatusOK {
			t.Errorf("a held request: %d, want 200", code)
		}
	}
	if code, _, _ := doFrom(t, a, s.entryRequest(t, "/fast")); code != http.StatusOK {
		t.Errorf("the first caller once its requests ended: %d, want 200", code)
	}
	s.inflight.mu.Lock()
	defer s.inflight.mu.Unlock()
	if len(s.inflight.tunnels) != 0 || len(s.inflight.callers) != 0 {
		t.Errorf("requests in flight after all ended: %v %v, want none", s.inflight.tunnels, s.inflight.callers)
	}
}

// Websockets and event streams hold at most half of a tunnel's request
// slots: beyond, 503 tunnel_busy, while ordinary requests still have the
// other half.
func TestLongLivedRequestsHoldHalf(t *testing.T) {
	const perTunnel = 4
	s := startServer(t, func(c *Config) { c.MaxRequestsPerTunnel, c.MaxRequestsPerCaller = perTunnel, perTunnel })
	h, up := newHolder(t)
	ws := upgradeEcho(t)
	s.startClientRoutes(t, "alpha", "/="+up.URL, "/ws="+ws.URL)

	first := upgrade(t, s.entry, "alpha")
	defer first.Close()
	stream := h.hold(t, streamClient(), s.entryRequest(t, "/events", "Accept", "text/event-stream"))
	for _, tc := range []struct {
		name   string
		header []string
	}{
		{"a websocket", []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}},
		{"an event stream", []string{"Accept", "text/event-stream"}},
	} {
		code, body, hdr := doFrom(t, clientFrom("127.0.0.1"), s.entryRequest(t, "/events", tc.header...))
		if code != http.StatusServiceUnavailable || hdr.Get("X-Tether-Error") != "tunnel_busy" || !strings.Contains(body, "websocket and event-stream") {
			t.Errorf("%s beyond half the tunnel's slots: %d %q; want 503 tunnel_busy naming websockets and event streams", tc.name, code, body)
		}
	}
	var held []<-chan int
	for range perTunnel / 2 {
		held = append(held, h.hold(t, clientFrom("127.0.0.1"), s.entryRequest(t, "/hold")))
	}
	if code, _, _ := doFrom(t, clientFrom("127.0.0.1"), s.entryRequest(t, "/fast")); code != http.StatusServiceUnavailable {
		t.Errorf("an ordinary request with every slot taken: %d, want 503", code)
	}
	h.releaseAll()
	for _, done := range append(held, stream) {
		if code := <-done; code != http.StatusOK {
			t.Errorf("a held request: %d, want 200", code)
		}
	}
	first.echo(t, "still here")
}

// streamClient is an HTTP client without a timeout, for a stream the test
// ends.
func streamClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
}

// A request body that sends nothing for --body-idle-timeout is answered 408
// body_timeout and its connection closed; its slot comes back. A body sent
// in pieces with shorter pauses is not.
func TestBodyIdleTimeout(t *testing.T) {
	const timeout = time.Second
	s := startServer(t, func(c *Config) { c.BodyIdleTimeout = timeout })
	s.startClient(t, "alpha", newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return
		}
		fmt.Fprintf(w, "got %d", n)
	})).URL)
	head := "POST /upload HTTP/1.1\r\nHost: alpha." + testDomain + "\r\n"

	for _, tc := range []struct{ name, head, body string }{
		{"a body of known length", head + "Content-Length: 10\r\n\r\n", "ab"},
		{"a chunked body", head + "Transfer-Encoding: chunked\r\n\r\n", "2\r\nab\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialEntry(t, s)
			_ = c.SetDeadline(time.Now().Add(timeout + 10*time.Second))
			if _, err := io.WriteString(c, tc.head+tc.body); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("read the answer: %v", err)
			}
			b, _ := io.ReadAll(res.Body)
			_ = res.Body.Close()
			if res.StatusCode != http.StatusRequestTimeout || res.Header.Get("X-Tether-Error") != unroutedBodyTimeout ||
				!strings.Contains(string(b), "--body-idle-timeout") || !res.Close {
				t.Errorf("a stalled body: %d %q (%s, close %v); want 408 body_timeout naming the flag, and the connection closed",
					res.StatusCode, b, res.Header.Get("X-Tether-Error"), res.Close)
			}
			if n, err := br.Read(make([]byte, 1)); n > 0 || err == nil {
				t.Errorf("after the 408: read %d bytes, %v; want the connection closed", n, err)
			}
		})
	}
	if got := promtest.ToFloat64(s.metrics.unrouted.WithLabelValues(unroutedBodyTimeout)); got != 2 {
		t.Errorf("tether_http_unrouted_requests_total{reason=body_timeout} = %v, want 2", got)
	}

	// Pauses of a fifth of the timeout.
	c := dialEntry(t, s)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, head+"Content-Length: 5\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(timeout / 5)
	defer tick.Stop()
	for range 5 {
		<-tick.C
		if _, err := io.WriteString(c, "x"); err != nil {
			t.Fatal(err)
		}
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK || string(b) != "got 5" {
		t.Errorf("a body sent with pauses shorter than the timeout: %d %q, want 200 got 5", res.StatusCode, b)
	}
	waitCount(t, "tunnels with requests in flight", func() int {
		s.inflight.mu.Lock()
		defer s.inflight.mu.Unlock()
		return len(s.inflight.tunnels)
	}, 0)
}

// A request with both Content-Length and Transfer-Encoding is answered 400
// and its connection closed (RFC 9112, section 6.3), before it reaches a
// tunnel; either header alone is served.
func TestAmbiguousLengthRefused(t *testing.T) {
	s := startServer(t)
	hits := make(chan string, 16)
	s.startClient(t, "alpha", newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			hits <- r.URL.Path
		}
		_, _ = io.Copy(io.Discard, r.Body)
	})).URL)
	start := "POST /upload HTTP/1.1\r\nHost: alpha." + testDomain + "\r\n"
	for _, tc := range []struct {
		name, head string
		want       int
	}{
		{"both", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", http.StatusBadRequest},
		{"both, other order and case", "transfer-ENCODING: chunked\r\nX-A: b\r\ncontent-length:5\r\n", http.StatusBadRequest},
		{"chunked only", "Transfer-Encoding: chunked\r\n", http.StatusOK},
		{"length only", "Content-Length: 5\r\n", http.StatusOK},
	} {
		body := "0\r\n\r\n"
		c := dialEntry(t, s)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, start+tc.head+"\r\n"+body); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: read the answer: %v", tc.name, err)
		}
		b, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.name, res.StatusCode, b, tc.want)
		}
		if tc.want != http.StatusBadRequest {
			continue
		}
		if res.Header.Get("X-Tether-Error") != "bad_request" || !strings.Contains(string(b), "Content-Length and Transfer-Encoding") {
			t.Errorf("%s: %q (%s); want bad_request naming both headers", tc.name, b, res.Header.Get("X-Tether-Error"))
		}
		if err := testutil.ClosedByServer(c, 5*time.Second); err != nil {
			t.Errorf("%s: after the 400: %v; want the connection closed", tc.name, err)
		}
	}
	if n := len(hits); n != 2 {
		t.Errorf("the upstream got %d requests, want 2 (those with one framing header)", n)
	}
	if got := promtest.ToFloat64(s.metrics.unrouted.WithLabelValues(unroutedAmbiguousLength)); got != 2 {
		t.Errorf("tether_http_unrouted_requests_total{reason=ambiguous_length} = %v, want 2", got)
	}
}

// The caller of a request is the rightmost address of X-Forwarded-For
// that is not a trusted proxy's (the entry has appended the address the
// request came from); an IPv6 caller counts by its /64.
func TestCallerOf(t *testing.T) {
	s := &Server{cfg: Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}
	for _, tc := range []struct {
		name   string
		xff    []string
		remote string
		want   string
	}{
		{"direct", []string{"198.51.100.7"}, "198.51.100.7:1", "198.51.100.7"},
		{"behind a proxy", []string{"203.0.113.5, 10.0.0.2"}, "10.0.0.2:1", "203.0.113.5"},
		{"spoofed on the left", []string{"1.2.3.4, 203.0.113.5, 10.0.0.2"}, "10.0.0.2:1", "203.0.113.5"},
		{"several header lines", []string{"1.2.3.4", "203.0.113.5,10.0.0.3", "10.0.0.2"}, "10.0.0.2:1", "203.0.113.5"},
		{"garbage left of the proxy", []string{"nonsense, 10.0.0.2"}, "10.0.0.2:1", "10.0.0.2"},
		{"only proxies", []string{"10.0.0.3, 10.0.0.2"}, "10.0.0.2:1", "10.0.0.3"},
		{"mapped IPv4", []string{"::ffff:192.0.2.1"}, "[::ffff:192.0.2.1]:1", "192.0.2.1"},
		{"IPv6 by its /64", []string{"2001:db8:1:2::77"}, "[2001:db8:1:2::77]:1", "2001:db8:1:2::"},
		{"no header", nil, "192.0.2.9:4", "192.0.2.9"},
	} {
		r := &http.Request{Header: http.Header{}, RemoteAddr: tc.remote}
		if tc.xff != nil {
			r.Header["X-Forwarded-For"] = tc.xff
		}
		if got := s.callerOf(r); got != netip.MustParseAddr(tc.want) {
			t.Errorf("%s: caller %v, want %s", tc.name, got, tc.want)
		}
	}
}

// A request is long-lived when it asks for a protocol switch or an event
// stream.
func TestLongLived(t *testing.T) {
	for _, tc := range []struct {
		header http.Header
		want   bool
	}{
		{http.Header{"Connection": {"keep-alive, Upgrade"}, "Upgrade": {"websocket"}}, true},
		{http.Header{"Upgrade": {"websocket"}}, false},
		{http.Header{"Accept": {"text/html, TEXT/Event-Stream;q=0.9"}}, true},
		{http.Header{"Accept": {"*/*"}}, false},
		{http.Header{}, false},
	} {
		if got := longLived(&http.Request{Header: tc.header}); got != tc.want {
			t.Errorf("%v: long-lived %v, want %v", tc.header, got, tc.want)
		}
	}
}

// BenchmarkRequestSlot is the fair-share work of every request: its
// caller, its kind, and its place among the tunnel's slots, taken and
// given back; and the entry connection's turn from waiting to busy and
// back. Compare with BenchmarkRequestPath for its share of a request.
func BenchmarkRequestSlot(b *testing.B) {
	s := &Server{cfg: Config{MaxRequestsPerTunnel: 1 << 20, MaxRequestsPerCaller: 1 << 20}}
	inflight := newRequestSlots(s.cfg.MaxRequestsPerTunnel, s.cfg.MaxRequestsPerCaller)
	slots := newConnSlots(1<<20, 1<<20, nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		conn, _, _ := slots.admit(testutil.ConnFrom("192.0.2.7"), maxEntryHeadLines)
		r := &http.Request{RemoteAddr: "192.0.2.7:4711", Header: http.Header{
			"X-Forwarded-For": {"192.0.2.7"}, "Accept": {"*/*"}, "User-Agent": {"bench"},
		}}
		for pb.Next() {
			slots.busy(conn)
			slot := requestSlot{tunnel: "alpha", caller: s.callerOf(r), long: longLived(r)}
			if inflight.acquire(slot) != slotGranted {
				b.Fatal("no slot")
			}
			inflight.release(slot)
			slots.wait(conn)
		}
	})
}
