package server

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

// rawExchange writes a hand-made request to the public entry on a new
// connection and reads the answer.
func rawExchange(t testing.TB, entry, request string) (*http.Response, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(entry, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read the answer to %q: %v", strings.SplitN(request, "\r\n", 2)[0], err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp, string(body)
}

// headerEcho is an upstream that answers with its name and the request's
// headers, as JSON.
func headerEcho(t testing.TB, name string) *httptestServer {
	t.Helper()
	return newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"backend": name, "method": r.Method, "path": r.URL.Path, "header": r.Header})
	}))
}

func serverPort(srv *httptestServer) int { return srv.Listener.Addr().(*net.TCPAddr).Port }

// CONNECT is refused with 405 for every host, before any routing (a
// tunnel that is down or a host that is no tunnel's would answer 503 or 404
// otherwise), and counted; the log gets a sampled line, not one per
// request. Stock frpc tunnels, where CONNECT did harm, are in
// TestConnectCannotDivertAnotherStockFRPCTunnel.
func TestConnectRefusedBeforeRouting(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), core))
	s := startServerLog(t, 0, log)
	s.startClient(t, "alpha", backend(t, "alpha").URL)
	connects := s.metrics.unrouted.WithLabelValues("connect")
	before := promtest.ToFloat64(connects)

	hosts := []string{"alpha." + testDomain + ":80", "down." + testDomain + ":443", "nosuch.example:443", "127.0.0.1:22"}
	for _, host := range hosts {
		t.Run(host, func(t *testing.T) {
			resp, body := rawExchange(t, s.entry, "CONNECT "+host+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("X-Tether-Error") != "method_not_allowed" ||
				!strings.Contains(body, "tunnels serve HTTP requests at <tunnel>."+testDomain) {
				t.Errorf("got %d %q %q; want the entry's 405 method_not_allowed", resp.StatusCode, resp.Header.Get("X-Tether-Error"), body)
			}
			if !resp.Close {
				t.Error("the entry keeps the connection after refusing CONNECT; want it closed: what follows is no request")
			}
		})
	}
	if got := promtest.ToFloat64(connects) - before; got != float64(len(hosts)) {
		t.Errorf("tether_http_unrouted_requests_total{reason=connect} rose by %v, want %d", got, len(hosts))
	}

	// A flood is counted in full and logged a little.
	const flood = 40
	before = promtest.ToFloat64(connects)
	for range flood {
		rawExchange(t, s.entry, "CONNECT alpha."+testDomain+":80 HTTP/1.1\r\nHost: alpha."+testDomain+":80\r\n\r\n")
	}
	if got := promtest.ToFloat64(connects) - before; got != flood {
		t.Errorf("tether_http_unrouted_requests_total{reason=connect} rose by %v, want %d", got, flood)
	}
	// One line per 10s; the whole test may straddle one boundary.
	if n := logs.FilterMessage("connect request refused").Len(); n < 1 || n > 2 {
		t.Errorf("%d refused CONNECTs were logged %d times; want once or twice (sampled)", len(hosts)+flood, n)
	}
}

// An absolute-form target names a host of its own, and Go's server routes
// on it instead of the Host header: the entry refuses the form.
func TestAbsoluteFormRefused(t *testing.T) {
	s := startServer(t)
	var alphaHits, betaHits atomic.Int64
	s.startClient(t, "alpha", newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		alphaHits.Add(1)
		_, _ = io.WriteString(w, "alpha")
	})).URL)
	s.startClient(t, "beta", newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		betaHits.Add(1)
		_, _ = io.WriteString(w, "beta")
	})).URL)
	alphaHits.Store(0)
	betaHits.Store(0)
	before := promtest.ToFloat64(s.metrics.unrouted.WithLabelValues("absolute_form"))

	for _, tc := range []struct{ name, request string }{
		{"host header names another tunnel", "GET http://beta." + testDomain + "/x HTTP/1.1\r\nHost: alpha." + testDomain + "\r\n\r\n"},
		{"host header names the same tunnel", "GET http://alpha." + testDomain + "/x HTTP/1.1\r\nHost: alpha." + testDomain + "\r\n\r\n"},
		{"https scheme", "POST https://beta." + testDomain + "/x HTTP/1.1\r\nHost: alpha." + testDomain + "\r\nContent-Length: 0\r\n\r\n"},
		{"HTTP/1.0 without a Host header", "GET http://beta." + testDomain + "/x HTTP/1.0\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawExchange(t, s.entry, tc.request)
			if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("X-Tether-Error") != "bad_request" ||
				!strings.Contains(body, "send origin-form") || !strings.Contains(body, "Host header") {
				t.Errorf("got %d %q %q; want 400 bad_request asking for origin-form with a Host header", resp.StatusCode, resp.Header.Get("X-Tether-Error"), body)
			}
		})
	}
	if a, b := alphaHits.Load(), betaHits.Load(); a != 0 || b != 0 {
		t.Errorf("backends got requests (alpha %d, beta %d); want none", a, b)
	}
	if got := promtest.ToFloat64(s.metrics.unrouted.WithLabelValues("absolute_form")) - before; got != 4 {
		t.Errorf("tether_http_unrouted_requests_total{reason=absolute_form} rose by %v, want 4", got)
	}
	// Origin-form with the same Host still works.
	resp, body := rawExchange(t, s.entry, "GET /x HTTP/1.1\r\nHost: alpha."+testDomain+"\r\n\r\n")
	if resp.StatusCode != http.StatusOK || body != "alpha" {
		t.Errorf("origin-form: got %d %q, want 200 from alpha", resp.StatusCode, body)
	}
}

// /metrics names every tunnel and its traffic: with an admin token it needs
// the token like /api/; the probes stay open.
func TestMetricsNeedTheAdminToken(t *testing.T) {
	tokenFile := t.TempDir() + "/admin-token"
	writeFile(t, tokenFile, "s3cret-admin")
	for _, tc := range []struct {
		name      string
		tokenFile string
		auth      string
		want      int
	}{
		{"token configured, none sent", tokenFile, "", http.StatusUnauthorized},
		{"token configured, wrong one sent", tokenFile, "Bearer s3cret-admiN", http.StatusUnauthorized},
		{"token configured, not as a bearer", tokenFile, "s3cret-admin", http.StatusUnauthorized},
		{"token configured and sent", tokenFile, "Bearer s3cret-admin", http.StatusOK},
		{"no token configured", "", "", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, func(c *Config) { c.AdminTokenFile = tc.tokenFile })
			s.startClient(t, "alpha", backend(t, "alpha").URL)
			req, _ := http.NewRequest(http.MethodGet, s.admin+"/metrics", nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			code, body, _ := do(t, req)
			if code != tc.want {
				t.Fatalf("/metrics: %d, want %d", code, tc.want)
			}
			if leaks := strings.Contains(body, `tunnel="alpha"`); leaks != (code == http.StatusOK) {
				t.Errorf("/metrics answered %d and names tunnel alpha: %v", code, leaks)
			}
			for _, path := range []string{"/healthz", "/readyz"} {
				req, _ := http.NewRequest(http.MethodGet, s.admin+path, nil)
				if code, _, _ := do(t, req); code != http.StatusOK {
					t.Errorf("%s: %d, want 200 without a token", path, code)
				}
			}
		})
	}
}
