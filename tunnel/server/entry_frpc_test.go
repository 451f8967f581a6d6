//go:build !race

// The tests in this file reach stock frpc tunnels, through frp's HTTP vhost
// inside the server. frp's vhost counts a work connection's bytes in fields
// its reader, writer and closer share without synchronisation
// (pkg/util/net.StatsConn), so the race detector reports frp now and then,
// whatever the test does; these tests therefore run without it. `make test`
// (always -race) covers the same behaviour end to end, against the tether
// binary and a stock frpc, in test/hostile_entry_test.go.

package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// frpcOpts configure a stock frpc.
type frpcOpts struct {
	proxyProtocol string // the proxy's transport.proxyProtocolVersion ("" none)
}

// stockFRPC is frpc built from the pinned frp module, once per test run,
// into frpcDir. It runs as a process of its own: frp's client.Service,
// embedded, races with itself when stopped (its reconnect loop reads the
// control it sets).
var stockFRPC struct {
	once sync.Once
	path string
	err  error
}

func frpcBinary(t testing.TB) string {
	t.Helper()
	stockFRPC.once.Do(func() {
		if frpcDir, stockFRPC.err = os.MkdirTemp("", "tether-server-test-"); stockFRPC.err != nil {
			return
		}
		stockFRPC.path = filepath.Join(frpcDir, "frpc")
		out, err := exec.Command("go", "build", "-tags", "noweb", "-o", stockFRPC.path, "github.com/fatedier/frp/cmd/frpc").CombinedOutput()
		if err != nil {
			stockFRPC.err = fmt.Errorf("build frpc: %w\n%s", err, out)
		}
	})
	if stockFRPC.err != nil {
		t.Fatal(stockFRPC.err)
	}
	return stockFRPC.path
}

// startFRPC runs a stock frpc for tunnel name, forwarding to localPort,
// and waits until the entry serves the tunnel. The returned func stops it
// and waits until the server has seen the session end; cleanup calls it too.
func (s *testServer) startFRPC(t testing.TB, name string, localPort int, o frpcOpts) (stop func()) {
	t.Helper()
	_, port, _ := net.SplitHostPort(s.tunnel)
	cfg := fmt.Sprintf(`serverAddr = "127.0.0.1"
serverPort = %s
loginFailExit = false
log.to = "console"
log.level = "info"
log.disablePrintColor = true
metadatas.token = %q

[[proxies]]
name = %q
type = "http"
subdomain = %[3]q
localIP = "127.0.0.1"
localPort = %[4]d
transport.proxyProtocolVersion = %[5]q
`, port, s.keys.token(t, name, time.Hour), name, localPort, o.proxyProtocol)
	file := filepath.Join(t.TempDir(), "frpc.toml")
	writeFile(t, file, cfg)
	cmd := exec.Command(frpcBinary(t), "-c", file)
	var out strings.Builder
	var outMu sync.Mutex
	cmd.Stdout = writerFunc(func(p []byte) (int, error) { outMu.Lock(); defer outMu.Unlock(); return out.Write(p) })
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	output := func() string { outMu.Lock(); defer outMu.Unlock(); return out.String() }
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			<-exited
			testutil.WaitFor(t, 10*time.Second, func() error {
				if _, ok := s.members.lookup(name); ok {
					return fmt.Errorf("tunnel %s still has a session", name)
				}
				return nil
			})
			if t.Failed() {
				t.Logf("----- output of frpc %s -----\n%s----- end -----", name, output())
			}
		})
	}
	t.Cleanup(stop)
	testutil.WaitFor(t, 20*time.Second, func() error {
		select {
		case <-exited:
			t.Fatalf("frpc %s exited:\n%s", name, output())
		default:
		}
		code, body, h := s.get(t, name, "/")
		if h.Get("X-Tether-Error") != "" {
			return fmt.Errorf("tunnel %s: %d %s", name, code, body)
		}
		return nil
	})
	return stop
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// The attack the CONNECT refusal stops: tenant evil runs a stock frpc whose
// service answers anything with an empty 200 and keeps the connection. A
// CONNECT to evil's host, if it reached frp's vhost, would join a pooled
// connection raw to evil's service; the next requests on that connection,
// other tenants' included, would go to evil. Whatever the entry is sent,
// victim's requests reach victim's service and nothing else.
func TestConnectCannotDivertAnotherStockFRPCTunnel(t *testing.T) {
	s := startServer(t)
	evil := testutil.NewRawService(t)
	s.startFRPC(t, "evil", evil.Port(), frpcOpts{})
	// Go's ServeMux answers CONNECT with a keep-alive 404 that has a length.
	mux := newHTTPTestServer(t, http.NewServeMux())
	s.startFRPC(t, "plain", serverPort(mux), frpcOpts{})
	victim := headerEcho(t, "victim")
	s.startFRPC(t, "victim", serverPort(victim), frpcOpts{})

	for _, host := range []string{"evil", "plain"} {
		resp, _ := rawExchange(t, s.entry, fmt.Sprintf("CONNECT %s.%s:80 HTTP/1.1\r\nHost: %[1]s.%[2]s:80\r\n\r\n", host, testDomain))
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("CONNECT to %s: %d, want 405", host, resp.StatusCode)
		}
	}
	const secret = "Bearer victim-secret-0123456789"
	for i := range 50 {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/private/%d", s.entry, i), nil)
		req.Host = "victim." + testDomain
		req.Header.Set("Authorization", secret)
		code, body, _ := do(t, req)
		if code != http.StatusOK || !strings.Contains(body, `"backend":"victim"`) {
			t.Fatalf("request %d for victim: got %d %q, want victim's answer", i, code, body)
		}
	}
	for _, r := range evil.Requests() {
		if r.Authorization != "" || strings.HasPrefix(r.Host, "victim.") || strings.HasPrefix(r.Target, "/private/") {
			t.Errorf("evil's service got victim's request: %+v", r)
		}
	}
}

// No connection to frp's vhost ever carries two tunnels' requests: each
// stock frpc session has its own pool. frp tells a tenant's service, in a
// PROXY protocol header, the address its vhost was reached from, which is
// the entry's end of the pooled connection.
func TestStockFRPCTunnelsShareNoVhostConnection(t *testing.T) {
	s := startServer(t)
	a, b := newProxyProtoService(t, "a"), newProxyProtoService(t, "b")
	s.startFRPC(t, "a", a.port(), frpcOpts{proxyProtocol: "v1"})
	s.startFRPC(t, "b", b.port(), frpcOpts{proxyProtocol: "v1"})
	for i := range 20 {
		for _, name := range []string{"a", "b"} {
			if code, body, _ := s.get(t, name, fmt.Sprintf("/%d", i)); code != http.StatusOK || body != name {
				t.Fatalf("tunnel %s: got %d %q, want 200 %q", name, code, body, name)
			}
		}
	}
	pa, pb := a.sources(), b.sources()
	if len(pa) == 0 || len(pb) == 0 {
		t.Fatalf("the services saw no PROXY headers (a: %v, b: %v)", pa, pb)
	}
	for src := range pa {
		if pb[src] {
			t.Errorf("the entry's connection %s to frp's vhost carried requests of tunnels a and b", src)
		}
	}
}

// proxyProtoService is an HTTP service behind a stock frpc with
// proxyProtocolVersion v1: it records the source address of each PROXY
// header and answers every request with its name.
type proxyProtoService struct {
	ln  net.Listener
	mu  sync.Mutex
	src map[string]bool
}

func newProxyProtoService(t testing.TB, name string) *proxyProtoService {
	t.Helper()
	p := &proxyProtoService{ln: listen(t), src: map[string]bool{}}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, name) }),
		ReadHeaderTimeout: 10 * time.Second,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(&proxyProtoListener{Listener: p.ln, p: p})
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return p
}

func (p *proxyProtoService) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *proxyProtoService) sources() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]bool, len(p.src))
	for k := range p.src {
		m[k] = true
	}
	return m
}

type proxyProtoListener struct {
	net.Listener
	p *proxyProtoService
}

// Accept reads the PROXY v1 line ("PROXY TCP4 src dst sport dport") before
// handing the connection on.
func (l *proxyProtoListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := br.ReadString('\n')
	_ = c.SetReadDeadline(time.Time{})
	if f := strings.Fields(line); err == nil && len(f) == 6 && f[0] == "PROXY" {
		l.p.mu.Lock()
		l.p.src[net.JoinHostPort(f[2], f[4])] = true
		l.p.mu.Unlock()
	}
	return &proxyProtoConn{Conn: c, r: br}, nil
}

// proxyProtoConn reads the rest of the connection after the PROXY line.
type proxyProtoConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *proxyProtoConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Requests frp's port muxer did not recognise as HTTP used to hang and leak
// a socket and a goroutine each. WebDAV, custom methods and frp's own
// websocket path reach a stock frpc tenant's service and get its answer,
// and once the tunnel is gone nothing of the burst is left.
func TestStockFRPCServesAnyMethodWithoutLeaks(t *testing.T) {
	s := startServer(t)
	dav := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "dav %s %s upgrade=%s", r.Method, r.URL.Path, r.Header.Get("Upgrade"))
	}))
	baseline := s.settledGoroutines(t)
	stop := s.startFRPC(t, "dav", serverPort(dav), frpcOpts{})

	type call struct{ method, path, want string }
	calls := []call{
		{"PROPFIND", "/files/", "dav PROPFIND /files/ upgrade="},
		{"MKCOL", "/files/new", "dav MKCOL /files/new upgrade="},
		{"REPORT", "/cal", "dav REPORT /cal upgrade="},
		{"LOCK", "/files/a", "dav LOCK /files/a upgrade="},
		{"FROBNICATE", "/x", "dav FROBNICATE /x upgrade="},
		{http.MethodGet, "/~!frp", "dav GET /~!frp upgrade=websocket"},
	}
	const total, parallel = 200, 50
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: parallel}}
	defer client.CloseIdleConnections()
	var failed atomic.Int64
	var wg sync.WaitGroup
	work := make(chan call)
	for range parallel {
		wg.Go(func() {
			for c := range work {
				if failed.Load() >= 3 {
					continue // enough said; do not wait out every timeout
				}
				req, _ := http.NewRequest(c.method, s.entry+c.path, strings.NewReader("<propfind/>"))
				req.Host = "dav." + testDomain
				if c.path == "/~!frp" {
					req.Body, req.ContentLength = nil, 0
					req.Header.Set("Connection", "Upgrade")
					req.Header.Set("Upgrade", "websocket")
					req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
					req.Header.Set("Sec-WebSocket-Version", "13")
				}
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					t.Errorf("%s %s: %v", c.method, c.path, err)
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(body) != c.want {
					failed.Add(1)
					t.Errorf("%s %s: got %d %q, want 200 %q", c.method, c.path, resp.StatusCode, body, c.want)
				}
			}
		})
	}
	for i := range total {
		work <- calls[i%len(calls)]
	}
	close(work)
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}

	client.CloseIdleConnections()
	stop()
	// The session's pool to frp's vhost closed with it; frp's side of those
	// connections, the work connections and the frpc are gone too.
	testutil.WaitFor(t, 30*time.Second, func() error {
		http.DefaultTransport.(*http.Transport).CloseIdleConnections() // the test's own
		if n := runtime.NumGoroutine(); n > baseline+5 {
			return fmt.Errorf("%d goroutines, %d before the tunnel and the burst", n, baseline)
		}
		return nil
	})
}

// settledGoroutines returns the goroutine count once the server is ready
// and the count has held still for a while (the last test's connections
// winding down, the server's own goroutines starting).
func (s *testServer) settledGoroutines(t testing.TB) int {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		req, _ := http.NewRequest(http.MethodGet, s.admin+"/readyz", nil)
		if code, body, _ := do(t, req); code != http.StatusOK {
			return fmt.Errorf("/readyz: %d %s", code, body)
		}
		return nil
	})
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	last, still := -1, 0
	testutil.WaitFor(t, 10*time.Second, func() error {
		n := runtime.NumGoroutine()
		if n == last {
			still++
		} else {
			last, still = n, 0
		}
		if still < 20 {
			return fmt.Errorf("goroutines still changing (%d)", n)
		}
		return nil
	})
	return last
}

// TestForwardedHeaders, through a stock frpc: frp's vhost inside the server
// appends the hop it was reached from (the server itself) to
// X-Forwarded-For, and sets X-Forwarded-Host and -Proto as tether does.
func TestForwardedHeadersStockFRPC(t *testing.T) {
	for _, tc := range []struct {
		trusted []netip.Prefix
		cases   []forwardedCase
	}{
		{nil, []forwardedCase{
			fromUntrusted("untrusted caller", "gamma", "/who", "127.0.0.1, 127.0.0.1", "", true),
		}},
		{[]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, []forwardedCase{
			{name: "trusted proxy", tunnel: "gamma", path: "/who", spoof: true, headers: map[string]string{
				"X-Forwarded-For": "1.2.3.4, 127.0.0.1, 127.0.0.1", "X-Forwarded-Port": "8443", "X-Forwarded-Prefix": "/evil",
				"X-Real-Ip": "1.2.3.4",
			}},
		}},
	} {
		s := startServer(t, func(c *Config) { c.TrustedProxies = tc.trusted })
		s.startFRPC(t, "gamma", serverPort(headerEcho(t, "gamma")), frpcOpts{})
		for _, c := range tc.cases {
			t.Run(c.name, func(t *testing.T) { s.checkForwarded(t, c) })
		}
	}
}
