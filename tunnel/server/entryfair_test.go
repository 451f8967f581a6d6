package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
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
	if err := closedByServer(idle[0], 5*time.Second); err != nil {
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
	if err := closedByServer(dialEntry(t, s), 5*time.Second); err != nil {
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
	if err := closedByServer(dialEntryFrom(t, s, "127.0.0.2"), 5*time.Second); err != nil {
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
	if err := closedByServer(idle[0], 5*time.Second); err != nil {
		t.Errorf("the address's connection idle longest: %v; want it closed", err)
	}
	if got := s.refusedConns(entryCapLabels.evictedPerIP); got != 1 {
		t.Errorf("tether_connections_refused_total{reason=http_idle_evicted_per_ip} = %v, want 1", got)
	}
	if code, err := idle[1].get("alpha", "/"); err != nil || code != http.StatusOK {
		t.Errorf("the address's other idle connection: %d %v; want it kept", code, err)
	}
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
		if err := closedByServer(c, 5*time.Second); err != nil {
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
