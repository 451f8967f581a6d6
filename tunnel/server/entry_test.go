package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tether-dev/tether/internal/testutil"
)

func TestTunnelName(t *testing.T) {
	tests := []struct {
		host, want string
		ok         bool
	}{
		{"acme.tunnels.test", "acme", true},
		{"acme.tunnels.test:8080", "acme", true},
		{"ACME.Tunnels.Test", "acme", true},
		{"acme.tunnels.test.", "acme", true},
		{"a-1.tunnels.test", "a-1", true},
		{"tunnels.test", "", false},
		{"x.acme.tunnels.test", "", false}, // one label only
		{"-acme.tunnels.test", "", false},
		{"acme.other.test", "", false},
		{"acmetunnels.test", "", false},
		{"[::1]:8080", "", false},
		{"", "", false},
		{strings.Repeat("a", 64) + ".tunnels.test", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			got, ok := tunnelName(tc.host, "tunnels.test")
			if got != tc.want || ok != tc.ok {
				t.Errorf("tunnelName(%q) = %q, %v; want %q, %v", tc.host, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestEntryAnswersForUnknownHostsAndDownTunnels(t *testing.T) {
	s := startServer(t)
	s.startClient(t, "alpha", backend(t, "alpha").URL)

	req, _ := http.NewRequest(http.MethodGet, s.entry+"/", nil)
	req.Host = "alpha.elsewhere.test"
	code, body, h := do(t, req)
	if code != http.StatusNotFound || h.Get("X-Tether-Error") != "unknown_host" || !strings.Contains(body, "alpha.elsewhere.test") {
		t.Errorf("unknown host: got %d %q (%s), want 404 unknown_host naming the host", code, body, h.Get("X-Tether-Error"))
	}
	code, body, h = s.get(t, "beta", "/")
	if code != http.StatusServiceUnavailable || h.Get("X-Tether-Error") != "tunnel_down" || !strings.Contains(body, `"beta"`) {
		t.Errorf("down tunnel: got %d %q (%s), want 503 tunnel_down naming the tunnel", code, body, h.Get("X-Tether-Error"))
	}
	if code, body, _ := s.get(t, "alpha", "/ok"); code != http.StatusOK || !strings.HasPrefix(body, "alpha /ok") {
		t.Errorf("alpha: got %d %q", code, body)
	}
}

// spoofedForwarding are forwarding headers a caller makes up: its address,
// host, scheme, port, path prefix.
var spoofedForwarding = map[string]string{
	"X-Forwarded-For":    "1.2.3.4",
	"X-Forwarded-Host":   "evil.example",
	"X-Forwarded-Proto":  "https",
	"X-Forwarded-Prefix": "/evil",
	"X-Forwarded-Port":   "8443",
	"X-Forwarded-Server": "evil.example",
	"X-Forwarded-Ssl":    "on",
	"X-Forwarded-Scheme": "https",
	"X-Forwarded_Uri":    "/evil/uri", // CGI-style servers read '_' as '-'
	"x_forwarded_user":   "admin",
	"Forwarded":          "for=1.2.3.4;host=evil.example;proto=https",
	"X-Real-Ip":          "1.2.3.4",
}

// forwardedCase is a request to the entry and the forwarding headers its
// upstream must see. The upstream is a headerEcho.
type forwardedCase struct {
	name, tunnel, path string
	spoof              bool              // send spoofedForwarding
	headers            map[string]string // exact values the upstream must see ("" = absent)
	onlyOurs           bool              // no forwarding header but those in headers may reach the upstream
}

// fromUntrusted is what the upstream of tunnel must see when an untrusted
// caller sends a request: tether's X-Forwarded-For (xff), -Host and -Proto,
// X-Forwarded-Prefix only when a stripped prefix sets it, nothing else.
func fromUntrusted(name, tunnel, path, xff, prefix string, spoof bool) forwardedCase {
	return forwardedCase{name: name, tunnel: tunnel, path: path, spoof: spoof, onlyOurs: true, headers: map[string]string{
		"X-Forwarded-For": xff, "X-Forwarded-Host": tunnel + "." + testDomain, "X-Forwarded-Proto": "http",
		"X-Forwarded-Prefix": prefix,
	}}
}

func (s *testServer) checkForwarded(t *testing.T, tc forwardedCase) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.entry+tc.path, nil)
	req.Host = tc.tunnel + "." + testDomain
	if tc.spoof {
		for k, v := range spoofedForwarding {
			req.Header[k] = []string{v}
		}
	}
	code, body, _ := do(t, req)
	var got struct{ Header http.Header }
	if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil {
		t.Fatalf("got %d %q, want the upstream's echo", code, body)
	}
	for h, v := range tc.headers {
		if g := strings.Join(got.Header.Values(h), ", "); g != v {
			t.Errorf("upstream got %s %q, want %q", h, g, v)
		}
	}
	if !tc.onlyOurs {
		return
	}
	for k, v := range got.Header {
		if _, ours := tc.headers[http.CanonicalHeaderKey(k)]; isForwardingHeader(k) && !ours {
			t.Errorf("upstream got %s %q from an untrusted caller; want it dropped", k, v)
		}
	}
}

// The upstream learns who called from X-Forwarded-For/-Host/-Proto, set by
// tether. Every forwarding header from a caller outside --trusted-proxies
// is dropped, so an upstream never reads a caller's claim about its address,
// host, port, scheme or path prefix; a trusted proxy's are kept. Stock frpc
// tunnels: TestForwardedHeadersStockFRPC.
func TestForwardedHeaders(t *testing.T) {
	for _, tc := range []struct {
		trusted []netip.Prefix
		cases   []forwardedCase
	}{
		{nil, []forwardedCase{
			fromUntrusted("untrusted caller", "alpha", "/who", "127.0.0.1", "", true),
			// The router sets X-Forwarded-Prefix for a stripped prefix: on
			// its own value, not on the caller's.
			fromUntrusted("untrusted caller, stripped prefix", "alpha", "/app/who", "127.0.0.1", "/app", true),
			fromUntrusted("no forwarding headers", "alpha", "/who", "127.0.0.1", "", false),
		}},
		{[]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, []forwardedCase{
			// As before: kept and extended; the router drops Forwarded, which
			// no hop vouches for.
			{name: "trusted proxy", tunnel: "alpha", path: "/who", spoof: true, headers: map[string]string{
				"X-Forwarded-For": "1.2.3.4, 127.0.0.1", "X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https",
				"X-Forwarded-Port": "8443", "X-Forwarded-Ssl": "on", "X-Real-Ip": "1.2.3.4", "Forwarded": "",
			}},
			{name: "trusted proxy, stripped prefix", tunnel: "alpha", path: "/app/who", spoof: true, headers: map[string]string{
				"X-Forwarded-Prefix": "/evil/app",
			}},
		}},
	} {
		s := startServer(t, func(c *Config) { c.TrustedProxies = tc.trusted })
		upstream := headerEcho(t, "alpha")
		s.startClientRoutes(t, "alpha", "/="+upstream.URL, "/app="+upstream.URL+"/")
		for _, c := range tc.cases {
			t.Run(c.name, func(t *testing.T) { s.checkForwarded(t, c) })
		}
	}
}

func TestIsForwardingHeader(t *testing.T) {
	for k, want := range map[string]bool{
		"X-Forwarded-For": true, "X-Forwarded-Prefix": true, "x-forwarded-port": true, "X-FORWARDED-SSL": true,
		"X_Forwarded_Host": true, "X-Forwarded_Uri": true, "Forwarded": true, "forwarded": true,
		"X-Real-Ip": true, "X_REAL_IP": true,
		"X-Forwarded": false, "X-Forwarded-": false, "X-Forwardedfor": false, "Forwarded-For": false,
		"X-Real-Ip-2": false, "Authorization": false, "": false,
	} {
		if got := isForwardingHeader(k); got != want {
			t.Errorf("isForwardingHeader(%q) = %v, want %v", k, got, want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	base := Config{TunnelAddr: ":7000", HTTPAddr: ":8080", AdminAddr: "127.0.0.1:7700", Domain: "tunnels.example.com"}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // substring of the error; "" = valid
	}{
		{"valid", func(*Config) {}, ""},
		{"no domain", func(c *Config) { c.Domain = "" }, "--domain"},
		{"bad domain", func(c *Config) { c.Domain = "under_score.com" }, "--domain"},
		{"address without port", func(c *Config) { c.HTTPAddr = "0.0.0.0" }, "--http-addr"},
		{"public admin without token", func(c *Config) { c.AdminAddr = "0.0.0.0:7700" }, "--admin-token-file"},
		{"cert without key", func(c *Config) { c.TLSCertFile = "tls.crt" }, "--tls-key"},
		{"negative request limit", func(c *Config) { c.MaxRequestsPerTunnel = -1 }, "--max-requests-per-tunnel"},
		{"negative connection limit", func(c *Config) { c.MaxHTTPConnections = -1 }, "--max-http-connections"},
		{"negative per-address connection limit", func(c *Config) { c.MaxHTTPConnectionsPerIP = -1 }, "--max-http-connections-per-ip"},
		{"negative caller share", func(c *Config) { c.MaxRequestsPerCaller = -1 }, "--max-requests-per-caller"},
		{"caller share over the tunnel's", func(c *Config) { c.MaxRequestsPerTunnel, c.MaxRequestsPerCaller = 8, 9 }, "--max-requests-per-caller 9 is more than --max-requests-per-tunnel 8"},
		{"caller share of a small tunnel", func(c *Config) { c.MaxRequestsPerTunnel = 3 }, ""},
		{"body timeout under a second", func(c *Config) { c.BodyIdleTimeout = time.Millisecond }, "--body-idle-timeout"},
		{"IPv6 peer address without brackets", func(c *Config) { c.PeerAdvertiseAddr = "fd00::a:7443" }, ""},
		{"IPv6 wildcard without brackets", func(c *Config) { c.PeerAdvertiseAddr = ":::7443" }, "wildcard"},
		{"IPv6 address without a port", func(c *Config) { c.PeerAdvertiseAddr = "fd00::a" }, "--peer-advertise-addr"},
		// The peer channel needs credentials: from the secret, or from all
		// three files, not both.
		{"replica with the peer secret", func(c *Config) { replicaOf(c); c.PeerSecretFile = "peer-secret" }, ""},
		{"replica with peer certificate files", func(c *Config) { replicaOf(c); peerFiles(c) }, ""},
		{"replica without peer credentials", replicaOf, "--peer-secret-file is required with --registry redis://redis:6379/0"},
		{"peer secret and files", func(c *Config) { replicaOf(c); peerFiles(c); c.PeerSecretFile = "peer-secret" }, "exclude each other"},
		{"peer files without a CA", func(c *Config) { replicaOf(c); peerFiles(c); c.PeerTLSCAFile = "" }, "go together"},
		{"a peer key alone", func(c *Config) { replicaOf(c); c.PeerSecretFile, c.PeerTLSKeyFile = "peer-secret", "tls.key" }, "go together"},
		{"a peer port without credentials", func(c *Config) { c.PeerAddr = "10.0.0.1:7443" }, "--peer-addr needs --peer-secret-file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.mutate(&cfg)
			cfg.setDefaults()
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// An IPv6 pod's $(POD_IP):7443 is fd00::a:7443: the other replicas dial
// [fd00::a]:7443.
func TestPeerAdvertiseAddrIPv6(t *testing.T) {
	for in, want := range map[string]string{
		"fd00::a:7443":    "[fd00::a]:7443",
		"[fd00::a]:7443":  "[fd00::a]:7443",
		"10.0.0.1:7443":   "10.0.0.1:7443",
		"pod.ns.svc:7443": "pod.ns.svc:7443",
		"fd00::a":         "fd00::a", // no port: refused by Validate
	} {
		if got := bracketIPv6(in); got != want {
			t.Errorf("bracketIPv6(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAdminAPI(t *testing.T) {
	tokenFile := t.TempDir() + "/admin-token"
	writeFile(t, tokenFile, "s3cret-admin")
	s := startServer(t, func(c *Config) { c.AdminTokenFile = tokenFile })
	s.startClient(t, "alpha", backend(t, "alpha").URL)

	req, _ := http.NewRequest(http.MethodGet, s.admin+"/api/tunnels", nil)
	if code, _, _ := do(t, req); code != http.StatusUnauthorized {
		t.Errorf("/api/tunnels without token: %d, want 401", code)
	}
	req.Header.Set("Authorization", "Bearer s3cret-admin")
	code, body, _ := do(t, req)
	if code != http.StatusOK || !strings.Contains(body, `"name": "alpha"`) || !strings.Contains(body, `"account": "acct-alpha"`) {
		t.Errorf("/api/tunnels: %d %s", code, body)
	}
	req, _ = http.NewRequest(http.MethodGet, s.admin+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer s3cret-admin")
	_, metrics, _ := do(t, req)
	for _, want := range []string{"tether_tunnels_connected 1", `tether_tunnel_bytes_total{direction="in",tunnel="alpha"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestTunnelBusy: a tunnel's requests in flight on a replica are bounded by
// MaxRequestsPerTunnel; beyond it the entry answers 503 tunnel_busy at once,
// counts it and logs it sampled, and other tunnels are not held back.
func TestTunnelBusy(t *testing.T) {
	const limit = 3
	core, logs := observer.New(zapcore.WarnLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), core))
	s := startServerLog(t, 0, log, func(c *Config) { c.MaxRequestsPerTunnel, c.MaxRequestsPerCaller = limit, limit })
	arrived := make(chan struct{}, limit)
	release := make(chan struct{})
	s.startClient(t, "alpha", newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			arrived <- struct{}{}
			<-release
		}
		fmt.Fprint(w, "alpha")
	})).URL)
	s.startClient(t, "beta", backend(t, "beta").URL)
	busy := s.metrics.unrouted.WithLabelValues("tunnel_busy")
	before := promtest.ToFloat64(busy)

	held := make(chan int, limit)
	hc := &http.Client{Timeout: time.Minute}
	defer hc.CloseIdleConnections()
	for range limit {
		go func() {
			req, _ := http.NewRequest(http.MethodGet, s.entry+"/hold", nil)
			req.Host = "alpha." + testDomain
			res, err := hc.Do(req)
			if err != nil {
				held <- 0
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			held <- res.StatusCode
		}()
	}
	for range limit {
		<-arrived
	}

	const flood = 20
	for range flood {
		code, body, h := s.get(t, "alpha", "/")
		if code != http.StatusServiceUnavailable || h.Get("X-Tether-Error") != "tunnel_busy" || h.Get("Retry-After") == "" ||
			!strings.Contains(body, `"alpha"`) || !strings.Contains(body, "--max-requests-per-tunnel") {
			t.Fatalf("request beyond the limit: %d %q (%s, Retry-After %q); want 503 tunnel_busy naming the tunnel and the flag",
				code, body, h.Get("X-Tether-Error"), h.Get("Retry-After"))
		}
	}
	if code, body, _ := s.get(t, "beta", "/"); code != http.StatusOK || !strings.HasPrefix(body, "beta") {
		t.Errorf("another tunnel while alpha is busy: %d %q, want 200", code, body)
	}
	if got := promtest.ToFloat64(busy) - before; got != flood {
		t.Errorf("tether_http_unrouted_requests_total{reason=tunnel_busy} rose by %v, want %d", got, flood)
	}
	// Five lines per 10s; the test may straddle one boundary.
	if n := logs.FilterMessage("request refused: the tunnel has too many requests in flight").Len(); n < 1 || n > 10 {
		t.Errorf("%d refusals were logged %d times; want 1 to 10 (sampled)", flood, n)
	}

	close(release)
	for range limit {
		if code := <-held; code != http.StatusOK {
			t.Errorf("held request: status %d, want 200", code)
		}
	}
	if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK || body != "alpha" {
		t.Errorf("after the held requests ended: %d %q, want 200", code, body)
	}
	s.inflight.mu.Lock()
	defer s.inflight.mu.Unlock()
	if len(s.inflight.tunnels) != 0 || len(s.inflight.callers) != 0 {
		t.Errorf("requests in flight after all ended: %v %v, want none", s.inflight.tunnels, s.inflight.callers)
	}
}

// A request that no session could take, none of which received any of it,
// is answered by whether the tunnel is still connected: 503 tunnel_down
// when the sessions it tried have all ended (it came as the client died,
// and is answered as one that came just after), 502 tunnel_disconnected
// while one of them is still connected.
func TestUnservedAnswerFollowsTheTriedSessions(t *testing.T) {
	s := startServer(t)
	s.runClient(t, "alpha", s.tunnel, 1, backend(t, "alpha").URL)
	connected := s.waitSessions(t, "alpha", 1)[0]
	stop := s.runClient(t, "beta", s.tunnel, 1, backend(t, "beta").URL)
	ended := s.waitSessions(t, "beta", 1)[0]
	stop()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if ended.sess.Alive() {
			return errors.New("the stopped client's session is still open")
		}
		return nil
	})
	for _, tc := range []struct {
		name   string
		tried  []*member
		status int
		code   string
	}{
		{"no session tried", nil, http.StatusServiceUnavailable, "tunnel_down"},
		{"its session ended under it", []*member{ended}, http.StatusServiceUnavailable, "tunnel_down"},
		{"a connected session failed under it", []*member{ended, connected}, http.StatusBadGateway, "tunnel_disconnected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "http://alpha."+testDomain+"/", nil)
			s.answerUnserved(rec, req, "alpha", tc.tried, origin{})
			if rec.Code != tc.status || rec.Header().Get("X-Tether-Error") != tc.code {
				t.Errorf("answer %d %q (%s), want %d %s", rec.Code, rec.Header().Get("X-Tether-Error"), rec.Body, tc.status, tc.code)
			}
		})
	}
}
