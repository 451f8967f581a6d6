package test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// rawRequest sends raw HTTP/1.1 bytes to addr and reads one response.
func rawRequest(t testing.TB, addr, raw string) response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read response to %q: %v", strings.SplitN(raw, "\r\n", 2)[0], err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

// TestUpstreamErrors: failures behind the client come back through the
// whole path as short, labelled errors, never as hangs; and the client
// forwards only to its routes, whatever the request names.
func TestUpstreamErrors(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	main := newBackend(t, "main", nil)
	victim := newBackend(t, "victim", nil)
	slow := newBackend(t, "slow", map[string]http.HandlerFunc{
		"/": func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		},
	})
	closed := testutil.ClosedAddr(t)
	startClient(t, srv, clientOpts{
		tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)),
		routes: []string{
			"/=" + main.url(),
			"/closed=http://" + closed,
			"/slow=" + slow.url() + ";timeout=500ms",
		},
	})

	t.Run("upstream refuses connections", func(t *testing.T) {
		r := srv.mustGet(t, "alpha", "/closed/x")
		if r.code != http.StatusBadGateway || r.header.Get("X-Tether-Error") != "upstream_unreachable" {
			t.Errorf("got %d %q %q, want 502 upstream_unreachable", r.code, r.header.Get("X-Tether-Error"), r.body)
		}
	})

	t.Run("upstream sends no headers within the route timeout", func(t *testing.T) {
		start := time.Now()
		r := srv.mustGet(t, "alpha", "/slow/x")
		took := time.Since(start)
		if r.code != http.StatusGatewayTimeout || r.header.Get("X-Tether-Error") != "upstream_timeout" {
			t.Errorf("got %d %q %q, want 504 upstream_timeout", r.code, r.header.Get("X-Tether-Error"), r.body)
		}
		if took < 500*time.Millisecond || took > 5*time.Second {
			t.Errorf("answered after %v; want just after the route's 500ms timeout", took)
		}
	})

	t.Run("no route matches", func(t *testing.T) {
		// alpha has a "/" route; a client without one answers 404.
		b := newBackend(t, "only-api", nil)
		k2 := newKeys(t)
		srv2 := startServer(t, k2, serverOpts{})
		startClient(t, srv2, clientOpts{tokenFile: writeToken(t, k2.issue(t, "beta", time.Hour)), routes: []string{"/api=" + b.url()}})
		r := srv2.mustGet(t, "beta", "/other")
		if r.code != http.StatusNotFound || r.header.Get("X-Tether-Error") == "" {
			t.Errorf("got %d %q, want 404 from the client's router", r.code, r.header.Get("X-Tether-Error"))
		}
		if b.hits.Load() != 0 {
			t.Errorf("the /api backend got a request for /other")
		}
	})

	t.Run("requests never reach another host", func(t *testing.T) {
		victimAddr := victim.srv.Listener.Addr().String()
		host := "alpha." + domain
		mainBefore := main.hits.Load()
		for _, tc := range []struct {
			name, raw string
		}{
			{"absolute-form URI naming the victim", "GET http://" + victimAddr + "/secret HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"},
			{"absolute-form URI naming the tunnel, Host naming the victim", "GET http://" + host + "/secret HTTP/1.1\r\nHost: " + victimAddr + "\r\nConnection: close\r\n\r\n"},
			{"X-Forwarded-Host naming the victim", "GET /secret HTTP/1.1\r\nHost: " + host + "\r\nX-Forwarded-Host: " + victimAddr + "\r\nConnection: close\r\n\r\n"},
			{"X-Forwarded-Host and X-Forwarded-Proto", "GET /secret HTTP/1.1\r\nHost: " + host + "\r\nX-Forwarded-Host: " + victimAddr + "\r\nX-Forwarded-Proto: http\r\nForwarded: host=" + victimAddr + "\r\nConnection: close\r\n\r\n"},
			{"scheme-relative path", "GET //" + victimAddr + "/secret HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"},
			{"CONNECT to the victim", "CONNECT " + victimAddr + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
			{"CONNECT to the tunnel host", "CONNECT " + host + ":80 HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
			{"OPTIONS * with the tunnel host", "OPTIONS * HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := rawRequest(t, srv.httpAddr, tc.raw)
				if strings.Contains(r.body, `"backend":"victim"`) {
					t.Errorf("the victim answered: %d %s", r.code, r.body)
				}
				t.Logf("answer: %d %s %.80q", r.code, r.header.Get("X-Tether-Error"), r.body)
			})
		}
		if n := victim.hits.Load(); n != 0 {
			t.Errorf("the victim backend got %d requests; want none", n)
		}
		t.Logf("the route's own backend got %d of those requests", main.hits.Load()-mainBefore)
	})
}

// TestTunnelLost: a request in flight when the client dies gets 502
// tunnel_disconnected at once; later requests get 503 tunnel_down.
func TestTunnelLost(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	started := make(chan struct{}, 1)
	b := newBackend(t, "backend", map[string]http.HandlerFunc{
		"/hang": func(w http.ResponseWriter, r *http.Request) {
			started <- struct{}{}
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
		},
	})
	c := startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + b.url()}})
	done := srv.getAsync("alpha", "/hang")
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the request never reached the backend")
	}
	killed := time.Now()
	c.kill()
	res := <-done
	if res.err != nil || res.r.code != http.StatusBadGateway || res.r.header.Get("X-Tether-Error") != "tunnel_disconnected" {
		t.Errorf("request in flight: %d %q %v; want 502 tunnel_disconnected", res.r.code, res.r.header.Get("X-Tether-Error"), res.err)
	}
	if took := time.Since(killed); took > 5*time.Second {
		t.Errorf("answered %v after the client died; want at once", took)
	}
	r := srv.mustGet(t, "alpha", "/")
	if r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != "tunnel_down" {
		t.Errorf("after the client died: %d %q, want 503 tunnel_down", r.code, r.header.Get("X-Tether-Error"))
	}
}

// TestForwardedHeaders: the backend learns who called from X-Forwarded-*,
// which a caller cannot spoof unless it is a trusted proxy.
func TestForwardedHeaders(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	untrusting := startServer(t, k, serverOpts{})
	trusting := startServer(t, k, serverOpts{args: []string{"--trusted-proxies", "127.0.0.1/32"}})
	bu := newBackend(t, "untrusting", nil)
	bt := newBackend(t, "trusting", nil)
	bf := newBackend(t, "frpc", nil)
	startClient(t, untrusting, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + bu.url()}})
	startClient(t, trusting, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + bt.url()}})
	startFRPC(t, "frpc gamma", frpcConfig(untrusting, k.issue(t, "gamma", time.Hour), frpcHTTPProxy("gamma", bf)))
	untrusting.waitServedBy(t, "gamma", "frpc", readyTimeout)

	spoof := func(s *server, tunnel string) echo {
		t.Helper()
		req := s.request(t, http.MethodGet, tunnel, "/who", nil)
		req.Header.Set("X-Forwarded-For", "1.2.3.4")
		req.Header.Set("X-Forwarded-Host", "evil.example")
		req.Header.Set("X-Forwarded-Proto", "https")
		req.Header.Set("X-Real-IP", "1.2.3.4")
		req.Header.Set("Forwarded", "for=1.2.3.4;host=evil.example;proto=https")
		r, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		return decodeEcho(t, r)
	}
	check := func(t *testing.T, e echo, wantFor, wantHost, wantProto string) {
		t.Helper()
		if got := strings.Join(e.Header.Values("X-Forwarded-For"), ", "); got != wantFor {
			t.Errorf("backend got X-Forwarded-For %q, want %q", got, wantFor)
		}
		if got := strings.Join(e.Header.Values("X-Forwarded-Host"), ", "); got != wantHost {
			t.Errorf("backend got X-Forwarded-Host %q, want %q", got, wantHost)
		}
		if got := strings.Join(e.Header.Values("X-Forwarded-Proto"), ", "); got != wantProto {
			t.Errorf("backend got X-Forwarded-Proto %q, want %q", got, wantProto)
		}
	}

	t.Run("spoofed headers from an untrusted caller are replaced", func(t *testing.T) {
		e := spoof(untrusting, "alpha")
		check(t, e, "127.0.0.1", "alpha."+domain, "http")
		for _, h := range []string{"Forwarded", "X-Real-Ip"} {
			if v := e.Header.Values(h); len(v) != 0 {
				t.Errorf("backend got %s %q from an untrusted caller; want it removed", h, v)
			}
		}
	})
	t.Run("through a stock frpc too", func(t *testing.T) {
		// The spoofed value is gone. frp's own HTTP vhost, which serves stock
		// frpc tunnels inside the server, appends the address it was reached
		// from: the tether server itself, on loopback.
		check(t, spoof(untrusting, "gamma"), "127.0.0.1, 127.0.0.1", "gamma."+domain, "http")
	})
	t.Run("a trusted proxy's headers are kept and the caller appended", func(t *testing.T) {
		check(t, spoof(trusting, "alpha"), "1.2.3.4, 127.0.0.1", "evil.example", "https")
	})
	t.Run("without prior headers", func(t *testing.T) {
		r := untrusting.mustGet(t, "alpha", "/plain")
		check(t, decodeEcho(t, r), "127.0.0.1", "alpha."+domain, "http")
	})
}
