package diagnose

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/client"
	"github.com/tether-dev/tether/tunnel/server"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// startClient runs a real client with a health listener and waits until
// its tunnel is ready. It returns the health address.
func startClient(t *testing.T, cfg client.Config) string {
	t.Helper()
	c, err := client.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	health := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Serve(ctx, health) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("client Serve: %v", err)
		}
	})
	addr := health.Addr().String()
	testutil.WaitFor(t, 10*time.Second, func() error {
		snap, err := clientStatus(addr)
		if err != nil {
			return err
		}
		if !snap.Ready {
			return fmt.Errorf("client not ready: %s", snap.State)
		}
		return nil
	})
	return addr
}

func clientStatus(addr string) (client.Snapshot, error) {
	var snap client.Snapshot
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		return snap, err
	}
	defer func() { _ = resp.Body.Close() }()
	return snap, json.NewDecoder(resp.Body).Decode(&snap)
}

// A healthy tunnel passes every check, and diagnosing it does not disturb
// it: its requests keep succeeding during and after, and it never
// reconnects.
func TestHealthyTunnelPassesAndIsUntouched(t *testing.T) {
	srv := startServer(t)
	upstream := backend(t)
	tokenFile := srv.keys.tokenFile(t, "acme", time.Now(), 2*time.Hour)
	cfg := srv.clientConfig(tokenFile, upstream, t)
	health := startClient(t, cfg)

	// Requests through the public entry all along.
	var ok, failed atomic.Int64
	var lastErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		hc := &http.Client{Timeout: 5 * time.Second}
		for {
			select {
			case <-stop:
				return
			default:
			}
			req, _ := http.NewRequest(http.MethodGet, "http://"+srv.entry+"/", nil)
			req.Host = "acme." + testDomain
			resp, err := hc.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %s", resp.Status)
				}
			}
			if err != nil {
				failed.Add(1)
				lastErr.Store(err.Error())
				continue
			}
			ok.Add(1)
		}
	})

	report := diagnoseWith(t, Options{Client: cfg, URL: "http://acme." + testDomain + ":" + port(srv.entry) + "/", Resolver: loopbackResolver(t)})
	for _, c := range report.Checks {
		if c.Status == Fail || c.Status == Warn {
			t.Errorf("check %s: %s: %s (hint: %s)", c.Name, c.Status, c.Detail, c.Hint)
		}
	}
	if !report.OK {
		t.Errorf("report not OK")
	}
	wantCheck(t, report, "login", Pass, `accepts the token for tunnel "acme"`, "")
	wantCheck(t, report, "login", Pass, "a client serves this tunnel from 127.0.0.1:", "")
	wantCheck(t, report, "end-to-end", Pass, "3 requests to http://acme.localhost:", "")
	wantCheck(t, report, "upstream /", Pass, "200 OK", "")

	// A few more requests after the diagnosis, then stop.
	after := ok.Load()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if ok.Load() < after+5 {
			return errors.New("requests after the diagnosis have not succeeded yet")
		}
		return nil
	})
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d requests through the running tunnel failed during the diagnosis; last: %v", n, lastErr.Load())
	}
	snap, err := clientStatus(health)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Reconnects != 0 || !snap.Ready {
		t.Errorf("the running client was disturbed: reconnects %d, ready %v, last error %q", snap.Reconnects, snap.Ready, snap.LastError)
	}
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// loopbackResolver answers every lookup with 127.0.0.1, from a DNS server
// on loopback... which would be a test of its own; instead the resolver's
// Dial is pointed at a closed port so a stray lookup fails fast. Names in
// these tests are IP literals or *.localhost-style hosts dialled directly.
func loopbackResolver(t *testing.T) *net.Resolver {
	t.Helper()
	closed := testutil.ClosedAddr(t)
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, closed)
	}}
}

func TestFailureModes(t *testing.T) {
	srv := startServer(t)
	upstream := backend(t)
	good := srv.keys.tokenFile(t, "acme", time.Now(), 2*time.Hour)

	tests := []struct {
		name   string
		mutate func(t *testing.T, o *Options)
		check  string
		detail string
		hint   string
	}{
		{
			name:   "nothing listening",
			mutate: func(t *testing.T, o *Options) { o.Client.Server = testutil.ClosedAddr(t) },
			check:  "tcp", detail: "connection refused", hint: "nothing listens on port",
		},
		{
			name:   "a name that does not resolve",
			mutate: func(_ *testing.T, o *Options) { o.Client.Server = "no-such-server.invalid:443"; o.Resolver = nil },
			check:  "dns", detail: "lookup no-such-server.invalid failed", hint: "",
		},
		{
			name: "an expired token",
			mutate: func(t *testing.T, o *Options) {
				o.Client.TokenFile = srv.keys.tokenFile(t, "acme", time.Now().Add(-2*time.Hour), time.Hour)
			},
			check: "token", detail: "the token has expired", hint: "issue a new token (tether token issue --tunnel acme",
		},
		{
			name: "an expired token is refused by the server in its words",
			mutate: func(t *testing.T, o *Options) {
				o.Client.TokenFile = srv.keys.tokenFile(t, "acme", time.Now().Add(-2*time.Hour), time.Hour)
			},
			check: "login", detail: "the server refused the login: expired: ", hint: "issue a new token",
		},
		{
			name: "a token from another key",
			mutate: func(t *testing.T, o *Options) {
				o.Client.TokenFile = newKeys(t).tokenFile(t, "acme", time.Now(), 2*time.Hour)
			},
			check: "login", detail: "the server refused the login: ", hint: "signed with a key the server does not trust",
		},
		{
			name:   "a missing token file",
			mutate: func(_ *testing.T, o *Options) { o.Client.TokenFile = "/nonexistent/token" },
			check:  "token", detail: "--token-file /nonexistent/token does not exist", hint: "mount the tunnel's token Secret",
		},
		{
			name:   "a token file that is not a JWT",
			mutate: func(t *testing.T, o *Options) { o.Client.TokenFile = writeFile(t, "token", "Bearer abc") },
			check:  "token", detail: "does not hold a JWT", hint: "no quotes",
		},
		{
			name:   "an upstream that refuses",
			mutate: func(t *testing.T, o *Options) { o.Client.Routes = routes(t, "/argo-cd=http://"+testutil.ClosedAddr(t)) },
			check:  "upstream /argo-cd", detail: "connection refused", hint: "nothing listens on",
		},
		{
			name: "an upstream name that does not resolve in the client's pod",
			mutate: func(t *testing.T, o *Options) {
				o.Client.Routes = routes(t, "/=http://app-proxy.invalid:8080")
				o.Client.Getenv = inPod
			},
			check: "upstream /", detail: "app-proxy.invalid", hint: "does not resolve: check the service name",
		},
		{
			name:   "the wrong fingerprint",
			mutate: func(_ *testing.T, o *Options) { o.Client.TLSFingerprint = strings.Repeat("AB", 32) },
			check:  "tls", detail: "does not match --tls-fingerprint", hint: "compare the fingerprint above",
		},
		{
			name:   "the self-signed certificate without a pin",
			mutate: func(_ *testing.T, o *Options) { o.Client.TLSFingerprint = "" },
			check:  "tls", detail: "self-signed", hint: "pin it with --tls-fingerprint " + srv.Fingerprint(),
		},
		{
			name:   "a proxy that does not answer",
			mutate: func(t *testing.T, o *Options) { o.Client.Proxy = "http://" + testutil.ClosedAddr(t) },
			check:  "proxy", detail: "does not answer", hint: "NO_PROXY",
		},
		{
			name:   "a proxy that refuses CONNECT",
			mutate: func(t *testing.T, o *Options) { o.Client.Proxy = refusingProxy(t) },
			check:  "tcp", detail: "refused CONNECT", hint: "ask its administrators to allow CONNECT",
		},
		{
			name: "a bad setting names its source",
			mutate: func(_ *testing.T, o *Options) {
				o.Client.Transport = "quic"
				o.Settings = []Setting{{Key: "transport", Value: "quic", Source: "env TETHER_TRANSPORT"}}
			},
			check: "config", detail: "transport from env TETHER_TRANSPORT", hint: "fix the settings",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Client: srv.clientConfig(good, upstream, t), Resolver: loopbackResolver(t)}
			tc.mutate(t, &o)
			report := diagnoseWith(t, o)
			if report.OK {
				t.Errorf("report OK, want a failure")
			}
			wantCheck(t, report, tc.check, Fail, tc.detail, tc.hint)
			for _, c := range report.Checks {
				if (c.Status == Fail || c.Status == Warn) && c.Hint == "" {
					t.Errorf("check %s is %s without a hint", c.Name, c.Status)
				}
			}
		})
	}
}

// inPod is the environment of a Kubernetes pod, as far as diagnose looks.
func inPod(name string) string {
	if name == "KUBERNETES_SERVICE_HOST" {
		return "10.96.0.1"
	}
	return ""
}

// Outside a cluster, a route's service name cannot resolve, and that says
// nothing about the tunnel: a warning that says where to run diagnose.
func TestUpstreamNameOutsideACluster(t *testing.T) {
	srv := startServer(t)
	cfg := srv.clientConfig(srv.keys.tokenFile(t, "acme", time.Now(), 2*time.Hour), backend(t), t)
	cfg.Routes = routes(t, "/=http://app-proxy.invalid:8080")
	cfg.Getenv = func(string) string { return "" }
	report := diagnoseWith(t, Options{Client: cfg, Resolver: loopbackResolver(t)})
	wantCheck(t, report, "upstream /", Warn, "app-proxy.invalid", "run diagnose in the client's pod")
}

// The end-to-end check fails only for what breaks the tunnel: a tether error
// or an answer that is not HTTP. A public URL that diagnose cannot reach from
// where it runs is a warning, and before a client serves the tunnel (a
// pre-flight check) there is nothing to test: either way the report is OK.
func TestEndToEnd(t *testing.T) {
	srv := startServer(t)
	upstream := backendFunc(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/broken" {
			http.Error(w, "the app is broken", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	cfg := srv.clientConfig(srv.keys.tokenFile(t, "acme", time.Now(), 2*time.Hour), upstream, t)
	startClient(t, cfg)
	entry := port(srv.entry)
	public := "http://acme." + testDomain + ":" + entry

	tests := []struct {
		name   string
		mutate func(t *testing.T, o *Options)
		status Status
		detail string
		hint   string
	}{
		{
			name:   "the server's public URL",
			mutate: func(*testing.T, *Options) {},
			status: Pass, detail: "3 requests to " + public + " → 200 OK",
		},
		{
			name: "before the client serves: a pre-flight check",
			mutate: func(t *testing.T, o *Options) {
				o.Client.TokenFile = srv.keys.tokenFile(t, "beta", time.Now(), 2*time.Hour)
				o.URL = "http://beta." + testDomain + ":" + entry + "/"
			},
			status: Skip, detail: "no client serves this tunnel yet", hint: "run tether diagnose again once `tether client` serves the tunnel",
		},
		{
			name:   "a public name that does not resolve here",
			mutate: func(_ *testing.T, o *Options) { o.URL = "http://acme.tunnels.invalid:" + entry + "/" },
			status: Warn, detail: "no such host", hint: "Here acme.tunnels.invalid does not resolve",
		},
		{
			name: "a public URL where nothing listens here",
			mutate: func(t *testing.T, o *Options) {
				o.URL = "http://acme." + testDomain + ":" + port(testutil.ClosedAddr(t)) + "/"
			},
			status: Warn, detail: "connection refused", hint: "cannot be reached from where diagnose runs",
		},
		{
			name: "an egress proxy that does not answer",
			mutate: func(t *testing.T, o *Options) {
				proxyURL, _ := url.Parse("http://alice:s3cret-Pw@" + testutil.ClosedAddr(t))
				o.EndToEndProxy = http.ProxyURL(proxyURL)
			},
			status: Warn, detail: "through the egress proxy http://[redacted]@127.0.0.1:", hint: "the egress proxy (HTTPS_PROXY/HTTP_PROXY) failed",
		},
		{
			name: "no HTTP answer in time",
			mutate: func(t *testing.T, o *Options) {
				o.URL = "http://acme." + testDomain + ":" + port(silentListener(t)) + "/"
				o.Timeout = 500 * time.Millisecond
			},
			status: Warn, detail: "deadline exceeded", hint: "no HTTP answer came within --timeout",
		},
		{
			name:   "a tether error",
			mutate: func(_ *testing.T, o *Options) { o.URL = "http://nobody." + testDomain + ":" + entry + "/" },
			status: Fail, detail: "X-Tether-Error: tunnel_down", hint: "no client serves this tunnel",
		},
		{
			name:   "a host the server does not serve",
			mutate: func(_ *testing.T, o *Options) { o.URL = "http://127.0.0.1:" + entry + "/" },
			status: Fail, detail: "X-Tether-Error: unknown_host", hint: "the URL's host must be <tunnel>.<domain>",
		},
		{
			name:   "an answer that is not HTTPS",
			mutate: func(_ *testing.T, o *Options) { o.URL = "https://acme." + testDomain + ":" + entry + "/" },
			status: Fail, detail: "server gave HTTP response to HTTPS client", hint: "does not speak its scheme",
		},
		{
			name:   "the app behind the route fails",
			mutate: func(_ *testing.T, o *Options) { o.URL = public + "/broken" },
			status: Warn, detail: "500 Internal Server Error", hint: "the app behind the route",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Client: cfg, Resolver: loopbackResolver(t)}
			tc.mutate(t, &o)
			report := diagnoseWith(t, o)
			wantCheck(t, report, "end-to-end", tc.status, tc.detail, tc.hint)
			if want := tc.status != Fail; report.OK != want {
				t.Errorf("report OK = %v, want %v", report.OK, want)
			}
			for _, c := range report.Checks {
				if c.Name != "end-to-end" && c.Name != "login" && c.Status != Pass {
					t.Errorf("check %s = %s, want pass: %s", c.Name, c.Status, c.Detail)
				}
			}
			if strings.Contains(fmt.Sprint(report), "s3cret-Pw") {
				t.Errorf("the report shows the proxy password: %+v", report)
			}
		})
	}
}

// silentListener accepts connections and never answers.
func silentListener(t *testing.T) string {
	t.Helper()
	ln := listen(t)
	var conns []net.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// refusingProxy is an HTTP proxy that refuses every CONNECT.
func refusingProxy(t *testing.T) string {
	t.Helper()
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "CONNECT to "+r.Host+" is not allowed by policy", http.StatusForbidden)
	}))
	t.Cleanup(p.Close)
	return p.URL
}

func TestCertificateProblems(t *testing.T) {
	t.Run("a certificate from an unknown CA is called out as likely TLS inspection", func(t *testing.T) {
		c := newCerts(t, "Corp Inspection CA", "tunnels.test")
		srv := startServer(t, func(cfg *server.Config) { cfg.TLSCertFile, cfg.TLSKeyFile = c.certFile, c.keyFile })
		o := Options{Client: srv.clientConfig(srv.keys.tokenFile(t, "acme", time.Now(), 2*time.Hour), backend(t), t), Resolver: loopbackResolver(t)}
		o.Client.TLSFingerprint, o.Client.TLSServerName = "", "tunnels.test"
		report := diagnoseWith(t, o)
		wantCheck(t, report, "tls", Fail, `issued by "CN=Corp Inspection CA"`, "TLS-inspecting proxy, trust its CA with --tls-ca")
		wantCheck(t, report, "tls", Fail, "chain: CN=tunnels.test, issued by CN=Corp Inspection CA", "")

		// Trusting that CA fixes it.
		o.Client.TLSCAFile = c.caFile
		wantCheck(t, diagnoseWith(t, o), "tls", Pass, "verified for tunnels.test", "")
	})
	t.Run("a certificate for another name", func(t *testing.T) {
		c := newCerts(t, "Platform CA", "other.test")
		srv := startServer(t, func(cfg *server.Config) { cfg.TLSCertFile, cfg.TLSKeyFile = c.certFile, c.keyFile })
		o := Options{Client: srv.clientConfig(srv.keys.tokenFile(t, "acme", time.Now(), 2*time.Hour), backend(t), t), Resolver: loopbackResolver(t)}
		o.Client.TLSFingerprint, o.Client.TLSServerName, o.Client.TLSCAFile = "", "tunnels.test", c.caFile
		report := diagnoseWith(t, o)
		wantCheck(t, report, "tls", Fail, "the certificate is for other.test, not tunnels.test", "--tls-server-name")
	})
}

// clockServer is a TLS server whose Date header is off by skew, standing in
// for a tunnel server with a wrong clock.
func clockServer(t *testing.T, skew time.Duration) *httptest.Server {
	t.Helper()
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Date", time.Now().Add(skew).UTC().Format(http.TimeFormat))
		http.NotFound(w, nil)
	}))
	// The login probe that follows speaks no HTTP: hang up on it soon.
	s.Config.ReadHeaderTimeout = 200 * time.Millisecond
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func TestClockSkew(t *testing.T) {
	k := newKeys(t)
	tests := []struct {
		skew   time.Duration
		status Status
		detail string
	}{
		{0, Pass, "agree"},
		{-2 * time.Minute, Warn, "ahead of the server's"},
		{10 * time.Minute, Fail, "this clock is 10m0s behind the server's"},
	}
	for _, tc := range tests {
		t.Run(tc.skew.String(), func(t *testing.T) {
			s := clockServer(t, tc.skew)
			o := Options{Client: client.Config{
				Server: s.Listener.Addr().String(), TokenFile: k.tokenFile(t, "acme", time.Now(), 30*time.Minute),
				TLSInsecureSkipVerify: true, Proxy: "direct", Routes: routes(t, "/="+backend(t)),
			}, Resolver: loopbackResolver(t)}
			report := diagnoseWith(t, o)
			wantCheck(t, report, "clock", tc.status, tc.detail, "")
			if tc.status != Pass {
				wantCheck(t, report, "clock", tc.status, "", "sync this machine's clock")
			}
		})
	}
	t.Run("the token is judged by the server's clock", func(t *testing.T) {
		s := clockServer(t, 3*time.Hour)
		o := Options{Client: client.Config{
			Server: s.Listener.Addr().String(), TokenFile: k.tokenFile(t, "acme", time.Now(), 2*time.Hour),
			TLSInsecureSkipVerify: true, Proxy: "direct", Routes: routes(t, "/="+backend(t)),
		}, Resolver: loopbackResolver(t)}
		wantCheck(t, diagnoseWith(t, o), "token", Fail, "by the server's clock", "issue a new token")
	})
}

// A check that takes long says so while it waits.
func TestTextShowsWaiting(t *testing.T) {
	var mu sync.Mutex
	var buf strings.Builder
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
	text := NewText(w)
	text.waitingAfter = 10 * time.Millisecond
	text.Started("tcp")
	testutil.WaitFor(t, 5*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !strings.Contains(buf.String(), "tcp") || !strings.Contains(buf.String(), "still waiting") {
			return fmt.Errorf("output %q has no waiting line", buf.String())
		}
		return nil
	})
	text.Finished(Check{Name: "tcp", Status: Fail, Detail: "127.0.0.1:1: refused\nsecond line", Hint: "do this"})
	text.Close()
	mu.Lock()
	defer mu.Unlock()
	sc := bufio.NewScanner(strings.NewReader(buf.String()))
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	last := lines[len(lines)-3:]
	if !strings.HasPrefix(strings.TrimSpace(last[0]), "FAIL tcp") || strings.TrimSpace(last[1]) != "second line" || strings.TrimSpace(last[2]) != "hint: do this" {
		t.Errorf("check printed as %q", last)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
