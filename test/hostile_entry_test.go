package test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// frpcProxyTo is frpcHTTPProxy for a service on any loopback port.
func frpcProxyTo(tunnel string, port int) string {
	return fmt.Sprintf("\n[[proxies]]\nname = %q\ntype = \"http\"\nsubdomain = %[1]q\nlocalIP = \"127.0.0.1\"\nlocalPort = %d\n", tunnel, port)
}

// waitServed waits until the entry forwards requests for tunnel (whatever
// its service answers).
func (s *server) waitServed(t testing.TB, tunnel string) {
	t.Helper()
	testutil.WaitFor(t, readyTimeout, func() error {
		r, err := doWith(quickc, s.request(t, http.MethodGet, tunnel, "/", nil))
		if err != nil {
			return err
		}
		if code := r.header.Get("X-Tether-Error"); code != "" {
			return fmt.Errorf("tunnel %s: %d %s", tunnel, r.code, code)
		}
		return nil
	})
}

// TestEntryRefusesConnect: all stock frpc tunnels reach frp's vhost inside
// the server, which answers CONNECT by joining the connection raw to the
// tenant's service. A tenant whose service then answers "200 OK" with an
// empty body and keeps the connection would leave it looking reusable; the
// next requests on it, any tenant's, would go to that service. The entry
// refuses CONNECT for every host with 405, counts and logs it, and another
// tenant's requests, credentials included, reach that tenant only.
func TestEntryRefusesConnect(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	evil := testutil.NewRawService(t)
	startFRPC(t, "frpc evil", frpcConfig(srv, k.issue(t, "evil", time.Hour), frpcProxyTo("evil", evil.Port())))
	// Go's ServeMux answers CONNECT with a 404 that keeps the connection.
	plain := httpTestServer(t, http.NewServeMux())
	startFRPC(t, "frpc plain", frpcConfig(srv, k.issue(t, "plain", time.Hour), frpcProxyTo("plain", plain)))
	victim := newBackend(t, "victim", nil)
	startFRPC(t, "frpc victim", frpcConfig(srv, k.issue(t, "victim", time.Hour), frpcHTTPProxy("victim", victim)))
	alpha := newBackend(t, "alpha", nil)
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + alpha.url()}})
	for _, name := range []string{"evil", "plain", "victim"} {
		srv.waitServed(t, name)
	}
	before := srv.metric(t, "tether_http_unrouted_requests_total", "reason", "connect")

	targets := []string{"evil." + domain + ":80", "plain." + domain + ":80", "victim." + domain + ":443", "alpha." + domain + ":80", "nosuch.example:443"}
	for _, target := range targets {
		r := rawRequest(t, srv.httpAddr, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
		if r.code != http.StatusMethodNotAllowed || r.header.Get("X-Tether-Error") != "method_not_allowed" || !strings.Contains(r.body, "CONNECT is not supported") {
			t.Errorf("CONNECT %s: got %d %q %q; want 405 method_not_allowed", target, r.code, r.header.Get("X-Tether-Error"), r.body)
		}
	}
	if got := srv.metric(t, "tether_http_unrouted_requests_total", "reason", "connect") - before; got != float64(len(targets)) {
		t.Errorf("tether_http_unrouted_requests_total{reason=connect} rose by %v, want %d", got, len(targets))
	}

	const secret = "Bearer victim-secret-0123456789abcdef"
	for i := range 50 {
		req := srv.request(t, http.MethodGet, "victim", fmt.Sprintf("/private/%d", i), nil)
		req.Header.Set("Authorization", secret)
		r, err := do(req)
		if err != nil {
			t.Fatalf("request %d for victim: %v", i, err)
		}
		if e := decodeEcho(t, r); e.Backend != "victim" || e.Header.Get("Authorization") != secret {
			t.Fatalf("request %d for victim answered by %q (Authorization %q); want victim's backend with the credentials", i, e.Backend, e.Header.Get("Authorization"))
		}
	}
	for _, r := range evil.Requests() {
		if r.Method == http.MethodConnect || r.Authorization != "" || strings.HasPrefix(r.Host, "victim.") {
			t.Errorf("evil's service got %+v", r)
		}
	}
	if n := victim.hits.Load(); n < 50 {
		t.Errorf("victim's backend got %d requests, want at least 50", n)
	}

	// Logged, and sampled: a flood of CONNECTs does not flood the log.
	for range 30 {
		rawRequest(t, srv.httpAddr, "CONNECT evil."+domain+":80 HTTP/1.1\r\nHost: evil."+domain+":80\r\n\r\n")
	}
	logged := 0
	for _, l := range srv.logLines() {
		if l["msg"] == "connect request refused" {
			logged++
		}
	}
	if logged < 1 || logged > 2 {
		t.Errorf("%d refused CONNECTs were logged %d times; want once, or twice across a 10s boundary", len(targets)+30, logged)
	}
}

// httpTestServer serves h on loopback and returns its port.
func httpTestServer(t testing.TB, h http.Handler) int {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// TestStockFRPCAnyMethod: frp's vhost once shared its port with frp's own
// port muxer, which handed requests it did not recognise as HTTP (WebDAV,
// custom methods, frp's websocket path) to listeners nobody accepts from:
// they hung and each left a socket and a goroutine behind. Through a stock
// frpc tunnel they now get the tenant's answer, and once the tunnel is gone
// the server's file descriptors and goroutines are back where they were.
func TestStockFRPCAnyMethod(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	dav := newBackend(t, "dav", nil)
	baseFDs, baseGoroutines := srv.settledResources(t)

	p := startFRPC(t, "frpc dav", frpcConfig(srv, k.issue(t, "dav", time.Hour), frpcHTTPProxy("dav", dav)))
	srv.waitServedBy(t, "dav", "dav", readyTimeout)

	calls := []struct{ method, path string }{
		{"PROPFIND", "/files/"}, {"MKCOL", "/files/new"}, {"REPORT", "/cal"}, {"LOCK", "/files/a"},
		{"FROBNICATE", "/x"}, {http.MethodGet, "/~!frp"},
	}
	const total, parallel = 200, 50
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: parallel}}
	defer client.CloseIdleConnections()
	var failed atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int)
	for range parallel {
		wg.Go(func() {
			for i := range work {
				if failed.Load() >= 3 {
					continue // enough said; do not wait out every timeout
				}
				c := calls[i%len(calls)]
				req, err := http.NewRequest(c.method, "http://"+srv.httpAddr+c.path, strings.NewReader("<propfind/>"))
				if err != nil {
					t.Error(err)
					return
				}
				req.Host = "dav." + domain
				if c.path == "/~!frp" {
					req.Body, req.ContentLength = nil, 0
					req.Header.Set("Connection", "Upgrade")
					req.Header.Set("Upgrade", "websocket")
					req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
					req.Header.Set("Sec-WebSocket-Version", "13")
				}
				r, err := doWith(client, req)
				if err == nil && r.code == http.StatusOK {
					e := decodeEcho(t, r)
					if e.Method == c.method && e.Path == c.path {
						continue
					}
					err = fmt.Errorf("backend saw %s %s", e.Method, e.Path)
				} else if err == nil {
					err = fmt.Errorf("status %d %s %q", r.code, r.header.Get("X-Tether-Error"), r.body)
				}
				failed.Add(1)
				t.Errorf("%s %s: %v; want the tenant's answer", c.method, c.path, err)
			}
		})
	}
	for i := range total {
		work <- i
	}
	close(work)
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}
	peakFDs := srv.openFDs(t)

	client.CloseIdleConnections()
	p.stop()
	// Beyond the baseline: frp's keep-alive connection to the in-process
	// auth plugin (both ends in the server), opened at the tenant's login
	// and reused by every later one. The wait is shorter than the pool's
	// idle timeout (60s): the session's end must close it.
	testutil.WaitFor(t, 30*time.Second, func() error {
		fds, goroutines := srv.openFDs(t), srv.goroutines(t)
		if fds > baseFDs+2 || goroutines > baseGoroutines+5 {
			return fmt.Errorf("server has %d file descriptors and %d goroutines; %d and %d before the tunnel and the burst",
				fds, goroutines, baseFDs, baseGoroutines)
		}
		return nil
	})
	t.Logf("server file descriptors: %d before, %d after %d requests (%d at a time), back to %d once the tunnel closed",
		baseFDs, peakFDs, total, parallel, srv.openFDs(t))
}

// openFDs counts the server process's open file descriptors.
func (s *server) openFDs(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("count the server's file descriptors: %v", err)
	}
	return len(entries)
}

// goroutines reads the server's goroutine count from its profile endpoint.
func (s *server) goroutines(t testing.TB) int {
	t.Helper()
	r, err := s.admin("/debug/pprof/goroutine?debug=1")
	if err != nil || r.code != http.StatusOK {
		t.Fatalf("GET /debug/pprof/goroutine: %d %v", r.code, err)
	}
	first, _, _ := strings.Cut(r.body, "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	if err != nil {
		t.Fatalf("goroutine profile starts with %q", first)
	}
	return n
}

// settledResources returns the server's file descriptors and goroutines
// once neither has changed for a while.
func (s *server) settledResources(t testing.TB) (fds, goroutines int) {
	t.Helper()
	still := 0
	lastFDs, lastG := -1, -1
	testutil.WaitFor(t, 20*time.Second, func() error {
		f, g := s.openFDs(t), s.goroutines(t)
		if f == lastFDs && g == lastG {
			still++
		} else {
			lastFDs, lastG, still = f, g, 0
		}
		if still < 10 {
			return errors.New("the server's file descriptors or goroutines are still changing")
		}
		return nil
	})
	return lastFDs, lastG
}

// TestStockFRPCServiceTimeout: a stock frpc tenant's service that never
// answers gets tether's 504 after 60s, with its error code, like a tether
// client's default route; not a hang, not frp's bare answer.
func TestStockFRPCServiceTimeout(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	silent := newBackend(t, "silent", map[string]http.HandlerFunc{
		"/never": func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(2 * time.Minute):
			}
		},
	})
	startFRPC(t, "frpc silent", frpcConfig(srv, k.issue(t, "silent", time.Hour), frpcHTTPProxy("silent", silent)))
	srv.waitServedBy(t, "silent", "silent", readyTimeout)
	start := time.Now()
	r, err := doWith(&http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 2 * time.Minute},
		srv.request(t, http.MethodGet, "silent", "/never", nil))
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if r.code != http.StatusGatewayTimeout || r.header.Get("X-Tether-Error") != "upstream_timeout" || !strings.Contains(r.body, "60s") {
		t.Errorf("got %d %q %q; want 504 upstream_timeout naming 60s", r.code, r.header.Get("X-Tether-Error"), r.body)
	}
	if took < 59*time.Second || took > 68*time.Second {
		t.Errorf("answered after %v; want just after 60s", took)
	}
}

// TestForwardedHeadersFromUntrustedCallers: no X-Forwarded-* header (nor
// Forwarded, X-Real-Ip) a caller outside --trusted-proxies sends reaches an
// upstream, through a tether client or a stock frpc; the router's own
// X-Forwarded-Prefix is not built on the caller's. A trusted proxy's values
// are kept.
func TestForwardedHeadersFromUntrustedCallers(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	untrusting := startServer(t, k, serverOpts{})
	trusting := startServer(t, k, serverOpts{args: []string{"--trusted-proxies", "127.0.0.1/32"}})
	for _, s := range []*server{untrusting, trusting} {
		b := newBackend(t, "client", nil)
		startClient(t, s, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + b.url(), "/app=" + b.url() + "/"}})
		startFRPC(t, "frpc gamma", frpcConfig(s, k.issue(t, "gamma", time.Hour), frpcHTTPProxy("gamma", newBackend(t, "frpc", nil))))
		s.waitServedBy(t, "gamma", "frpc", readyTimeout)
	}
	spoofed := map[string]string{
		"X-Forwarded-Prefix": "/evil", "X-Forwarded-Port": "8443", "X-Forwarded-Server": "evil.example",
		"X-Forwarded-Ssl": "on", "X-Forwarded-Scheme": "https", "X-Forwarded_Uri": "/evil/uri",
		"X-Forwarded-For": "1.2.3.4", "X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https",
		"Forwarded": "for=1.2.3.4", "X-Real-Ip": "1.2.3.4",
	}
	send := func(t *testing.T, s *server, tunnel, path string) echo {
		t.Helper()
		req := s.request(t, http.MethodGet, tunnel, path, nil)
		for k, v := range spoofed {
			req.Header[k] = []string{v}
		}
		r, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		return decodeEcho(t, r)
	}
	for _, tc := range []struct{ name, tunnel, path, xff, prefix string }{
		{"tether client", "alpha", "/who", "127.0.0.1", ""},
		{"tether client, stripped prefix", "alpha", "/app/who", "127.0.0.1", "/app"},
		{"stock frpc", "gamma", "/who", "127.0.0.1, 127.0.0.1", ""},
	} {
		t.Run("untrusted caller, "+tc.name, func(t *testing.T) {
			e := send(t, untrusting, tc.tunnel, tc.path)
			want := map[string]string{
				"X-Forwarded-For": tc.xff, "X-Forwarded-Host": tc.tunnel + "." + domain, "X-Forwarded-Proto": "http",
				"X-Forwarded-Prefix": tc.prefix,
			}
			for h := range e.Header {
				norm := http.CanonicalHeaderKey(strings.ReplaceAll(h, "_", "-"))
				if _, ours := want[norm]; !ours && (strings.HasPrefix(norm, "X-Forwarded-") || norm == "Forwarded" || norm == "X-Real-Ip") {
					t.Errorf("upstream got %s %q from an untrusted caller; want it dropped", h, e.Header[h])
				}
			}
			for h, v := range want {
				if got := strings.Join(e.Header.Values(h), ", "); got != v {
					t.Errorf("upstream got %s %q, want %q", h, got, v)
				}
			}
		})
	}
	t.Run("trusted proxy", func(t *testing.T) {
		for _, tunnel := range []string{"alpha", "gamma"} {
			e := send(t, trusting, tunnel, "/who")
			for _, h := range []string{"X-Forwarded-Port", "X-Forwarded-Server", "X-Forwarded-Ssl", "X-Real-Ip"} {
				if got := e.Header.Get(h); got != spoofed[h] {
					t.Errorf("%s: upstream got %s %q from a trusted proxy, want %q", tunnel, h, got, spoofed[h])
				}
			}
			if got := e.Header.Get("X-Forwarded-For"); !strings.HasPrefix(got, "1.2.3.4, 127.0.0.1") {
				t.Errorf("%s: upstream got X-Forwarded-For %q, want the proxy's value extended", tunnel, got)
			}
		}
		if got := send(t, trusting, "alpha", "/app/who").Header.Get("X-Forwarded-Prefix"); got != "/evil/app" {
			t.Errorf("upstream got X-Forwarded-Prefix %q behind a trusted proxy, want %q", got, "/evil/app")
		}
	})
}

// TestAbsoluteFormRefused: Go's server routes an absolute-form request by
// the URL's host and drops the Host header, so "GET http://b.<domain>/" with
// "Host: a.<domain>" went to b. The entry refuses absolute-form targets.
func TestAbsoluteFormRefused(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	a, b := newBackend(t, "a", nil), newBackend(t, "b", nil)
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "a", time.Hour)), routes: []string{"/=" + a.url()}})
	startFRPC(t, "frpc b", frpcConfig(srv, k.issue(t, "b", time.Hour), frpcHTTPProxy("b", b)))
	srv.waitServedBy(t, "b", "b", readyTimeout)
	aHits, bHits := a.hits.Load(), b.hits.Load()
	for _, tc := range []struct{ name, raw string }{
		{"URL names b, Host names a", "GET http://b." + domain + "/x HTTP/1.1\r\nHost: a." + domain + "\r\n\r\n"},
		{"URL names a, Host names b", "GET http://a." + domain + "/x HTTP/1.1\r\nHost: b." + domain + "\r\n\r\n"},
		{"URL and Host agree", "GET http://b." + domain + "/x HTTP/1.1\r\nHost: b." + domain + "\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawRequest(t, srv.httpAddr, tc.raw)
			if r.code != http.StatusBadRequest || r.header.Get("X-Tether-Error") != "bad_request" || !strings.Contains(r.body, "send origin-form") {
				t.Errorf("got %d %q %q; want 400 bad_request asking for origin-form", r.code, r.header.Get("X-Tether-Error"), r.body)
			}
		})
	}
	if da, db := a.hits.Load()-aHits, b.hits.Load()-bHits; da != 0 || db != 0 {
		t.Errorf("backends got requests (a %d, b %d); want none", da, db)
	}
	if got := srv.metric(t, "tether_http_unrouted_requests_total", "reason", "absolute_form"); got != 3 {
		t.Errorf("tether_http_unrouted_requests_total{reason=absolute_form} = %v, want 3", got)
	}
}

// TestMetricsNeedTheAdminToken: /metrics names every tunnel; with
// --admin-token-file it needs the token like /api/. The probes stay open.
func TestMetricsNeedTheAdminToken(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	const token = "metrics-test-admin-token-0123456789"
	srv := startServer(t, k, serverOpts{args: []string{"--admin-token-file", writeFile(t, t.TempDir(), "admin-token", token+"\n")}})
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + newBackend(t, "alpha", nil).url()}})
	for _, tc := range []struct {
		auth string
		want int
	}{{"", http.StatusUnauthorized}, {"Bearer wrong", http.StatusUnauthorized}, {"Bearer " + token, http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+srv.adminAddr+"/metrics", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		r, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		if r.code != tc.want || strings.Contains(r.body, `tunnel="alpha"`) != (tc.want == http.StatusOK) {
			t.Errorf("/metrics with Authorization %q: %d, names alpha: %v; want %d", tc.auth, r.code, strings.Contains(r.body, `tunnel="alpha"`), tc.want)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if r, err := srv.admin(path); err != nil || r.code != http.StatusOK {
			t.Errorf("%s: %d %v, want 200 without a token", path, r.code, err)
		}
	}
	assertNoSecret(t, "the admin token", token, srv.proc)
}

// TestEntryLimits: the public entry holds at most --max-http-connections
// connections; one more closes the one idle longest to make room, or, with
// none idle, is closed at once, counted and logged; a request head over
// 32 KiB or 256 lines gets 431; the connections it holds, and the tunnel,
// are not disturbed.
func TestEntryLimits(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{args: []string{"--max-http-connections", "3"}})
	alpha := newBackend(t, "alpha", nil)
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + alpha.url()}})
	srv.waitServed(t, "alpha")
	httpc.CloseIdleConnections()
	quickc.CloseIdleConnections()
	srv.waitHTTPConnections(t, 0)

	// Idle keep-alive connections, the first idle longest.
	var idle []*bufio.Reader
	var idleConns []net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", srv.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if r := keepAliveGet(t, c, br, "alpha"); r != http.StatusOK {
			t.Fatalf("request on kept-alive connection %d: %d", i, r)
		}
		idle, idleConns = append(idle, br), append(idleConns, c)
	}
	fourth, err := net.Dial("tcp", srv.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	if r := keepAliveGet(t, fourth, bufio.NewReader(fourth), "alpha"); r != http.StatusOK {
		t.Fatalf("a fourth connection with three idle ones: %d, want 200", r)
	}
	_ = fourth.Close()
	_ = idleConns[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := idle[0].ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the connection idle longest: %v; want it closed to make room", err)
	}
	if r := keepAliveGet(t, idleConns[1], idle[1], "alpha"); r != http.StatusOK {
		t.Errorf("another idle connection: %d, want it kept", r)
	}
	if n := srv.metric(t, "tether_connections_refused_total", "reason", "http_idle_evicted"); n != 1 {
		t.Errorf("tether_connections_refused_total{reason=http_idle_evicted} = %v, want 1", n)
	}
	for _, c := range idleConns {
		_ = c.Close()
	}
	srv.waitHTTPConnections(t, 0)

	// Connections sending a head: none idle.
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", srv.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\n"); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	srv.waitHTTPConnections(t, 3)
	if c, err := net.Dial("tcp", srv.httpAddr); err == nil { // a reset may come before the dial returns
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n > 0 || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("a fourth connection: read %d bytes, %v; want it closed at once", n, err)
		}
		_ = c.Close()
	}
	if n := srv.metric(t, "tether_connections_refused_total", "reason", "http_connections"); n != 1 {
		t.Errorf("tether_connections_refused_total{reason=http_connections} = %v, want 1", n)
	}
	logged := false
	for _, l := range srv.logLines() {
		logged = logged || l["msg"] == "public entry connection refused: --max-http-connections are open, none of them idle; raise it if callers need more"
	}
	if !logged {
		t.Error("the refused connection was not logged")
	}

	for _, c := range held {
		_ = c.Close()
	}
	srv.waitHTTPConnections(t, 0)
	head := "GET / HTTP/1.1\r\nHost: alpha." + domain + "\r\n"
	for name, fields := range map[string]string{
		"a 40 KiB head":        "X-Big: " + strings.Repeat("a", 40<<10) + "\r\n",
		"a head of 300 fields": strings.Repeat("X-Many: a\r\n", 300),
	} {
		if r := rawRequest(t, srv.httpAddr, head+fields+"\r\n"); r.code != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("%s: %d %q, want 431", name, r.code, r.body)
		}
	}
	r, err := do(srv.request(t, http.MethodGet, "alpha", "/after", nil))
	if err != nil || r.code != http.StatusOK {
		t.Errorf("alpha after the limits: %+v %v", r, err)
	}
}

// keepAliveGet sends GET / for tunnel on c, a connection kept alive, and
// reads the answer through br; 0 when that failed.
func keepAliveGet(t testing.TB, c net.Conn, br *bufio.Reader, tunnel string) int {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+tunnel+"."+domain+"\r\n\r\n"); err != nil {
		return 0
	}
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	return res.StatusCode
}

// waitHTTPConnections waits until the entry holds want connections.
func (s *server) waitHTTPConnections(t testing.TB, want float64) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := s.metric(t, "tether_http_connections"); n != want {
			return fmt.Errorf("tether_http_connections = %v, want %v", n, want)
		}
		return nil
	})
}
