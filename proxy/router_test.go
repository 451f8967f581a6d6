package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
)

func TestRouterLongestPrefix(t *testing.T) {
	root := echoUpstream(t, "root")
	argocd := echoUpstream(t, "argo-cd")
	api := echoUpstream(t, "argo-cd-api")
	wf := echoUpstream(t, "workflows")
	tr := newTestRouter(t, []Route{
		{Prefix: "/", Upstream: mustURL(t, root.URL)},
		{Prefix: "/argo-cd", Upstream: mustURL(t, argocd.URL)},
		{Prefix: "/argo-cd/api", Upstream: mustURL(t, api.URL)},
		{Prefix: "/workflows", Upstream: mustURL(t, wf.URL+"/")},
	}, nil, Options{})

	tests := []struct {
		path, upstream, uri string
	}{
		{"/", "root", "/"},
		{"/x/y", "root", "/x/y"},
		{"/argo-cd", "argo-cd", "/argo-cd"},
		{"/argo-cd/", "argo-cd", "/argo-cd/"},
		{"/argo-cd/applications", "argo-cd", "/argo-cd/applications"},
		{"/argo-cdx", "root", "/argo-cdx"},
		{"/argo-cd/api", "argo-cd-api", "/argo-cd/api"},
		{"/argo-cd/api/v1/applications?watch=true", "argo-cd-api", "/argo-cd/api/v1/applications?watch=true"},
		{"/argo-cd/apix", "argo-cd", "/argo-cd/apix"},
		{"/argo-cd%2Fapi", "root", "/argo-cd%2Fapi"},
		{"/workflows", "workflows", "/"},
		{"/workflows/api/v1/info?a=%2F&b=c+d", "workflows", "/api/v1/info?a=%2F&b=c+d"},
		{"/workflows/a%2Fb/c%20d", "workflows", "/a%2Fb/c%20d"},
		{"/workflowsx", "root", "/workflowsx"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			s := tr.getSeen(t, tc.path, nil)
			if s.Upstream != tc.upstream || s.RequestURI != tc.uri {
				t.Errorf("GET %s reached %s as %q, want %s as %q", tc.path, s.Upstream, s.RequestURI, tc.upstream, tc.uri)
			}
		})
	}
}

func TestRouterRejects(t *testing.T) {
	up := &countingListener{}
	ts := httptest.NewUnstartedServer(echoHandler("argo-cd"))
	up.Listener = ts.Listener
	ts.Listener = up
	ts.Start()
	t.Cleanup(ts.Close)
	tr := newTestRouter(t, []Route{{Prefix: "/argo-cd", Upstream: mustURL(t, ts.URL)}}, nil, Options{})
	addr := tr.front.Listener.Addr().String()

	tests := []struct {
		name    string
		request []string
		status  int
		code    string
		body    string
	}{
		{"no route", []string{"GET /x HTTP/1.1", "Host: t"}, 404, CodeNoRoute, `tether: no route for path "/x"`},
		{"prefix without boundary", []string{"GET /argo-cdx HTTP/1.1", "Host: t"}, 404, CodeNoRoute, `tether: no route for path "/argo-cdx"`},
		{"dot segments", []string{"GET /argo-cd/../x HTTP/1.1", "Host: t"}, 400, CodeBadRequest,
			`tether: bad request: path has a "." or ".." segment`},
		{"escaped dot segments", []string{"GET /argo-cd/%2e%2e/x HTTP/1.1", "Host: t"}, 400, CodeBadRequest,
			`tether: bad request: path has a "." or ".." segment`},
		{"asterisk", []string{"GET * HTTP/1.1", "Host: t"}, 400, CodeBadRequest,
			"tether: bad request: request target is not an absolute path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, body := rawRoundTrip(t, addr, tc.request...)
			if res.StatusCode != tc.status {
				t.Errorf("status %d, want %d", res.StatusCode, tc.status)
			}
			if got := res.Header.Get(ErrorHeader); got != tc.code {
				t.Errorf("%s = %q, want %q", ErrorHeader, got, tc.code)
			}
			if body != tc.body+"\n" {
				t.Errorf("body %q, want %q", body, tc.body+"\n")
			}
			if ct := res.Header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q, want text/plain; charset=utf-8", ct)
			}
		})
	}
	if n := up.accepted.Load(); n != 0 {
		t.Errorf("upstream accepted %d connections for rejected requests, want 0", n)
	}
}

func TestRouterForwardingHeaders(t *testing.T) {
	up := echoUpstream(t, "workflows")
	upHost := mustURL(t, up.URL).Host
	tr := newTestRouter(t, []Route{
		{Prefix: "/workflows", Upstream: mustURL(t, up.URL+"/")},
		{Prefix: "/argo-cd", Upstream: mustURL(t, up.URL)},
	}, nil, Options{})
	addr := tr.front.Listener.Addr().String()

	request := func(path string, extra ...string) seen {
		lines := append([]string{
			"GET " + path + " HTTP/1.1",
			"Host: t1.tunnels.example.com",
			"X-Forwarded-For: 203.0.113.7, 198.51.100.1",
			"X-Forwarded-Host: t1.tunnels.example.com",
			"X-Forwarded-Proto: https",
		}, extra...)
		res, body := rawRoundTrip(t, addr, lines...)
		return decodeSeen(t, res, body)
	}

	t.Run("hop-by-hop headers dropped", func(t *testing.T) {
		s := request("/workflows/api?x=1",
			"Connection: keep-alive, X-Hop",
			"X-Hop: secret",
			"Keep-Alive: timeout=5",
			"Proxy-Authorization: Basic c2VjcmV0",
			"Proxy-Connection: keep-alive",
			"Proxy-Tracking: 1",
			"Proxy: http://evil.internal:3128",
			"TE: gzip",
			"Trailer: X-Checksum",
			"Upgrade: h2c",
			"Forwarded: for=192.0.2.1",
			"X-Kept: yes",
		)
		for _, h := range []string{"X-Hop", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection",
			"Proxy-Tracking", "Proxy", "Te", "Trailer", "Upgrade", "Forwarded"} {
			if v, ok := s.Header[h]; ok {
				t.Errorf("upstream received %s: %q, want it dropped", h, v)
			}
		}
		if got := s.Header.Get("X-Kept"); got != "yes" {
			t.Errorf("upstream received X-Kept %q, want %q", got, "yes")
		}
		if s.RequestURI != "/api?x=1" {
			t.Errorf("upstream request URI %q, want %q", s.RequestURI, "/api?x=1")
		}
	})

	t.Run("non-websocket upgrade dropped", func(t *testing.T) {
		s := request("/argo-cd/x", "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA")
		for _, h := range []string{"Upgrade", "Http2-Settings"} {
			if v, ok := s.Header[h]; ok {
				t.Errorf("upstream received %s: %q, want it dropped", h, v)
			}
		}
		if c := s.Header.Get("Connection"); strings.Contains(strings.ToLower(c), "upgrade") {
			t.Errorf("upstream received Connection %q, want no upgrade", c)
		}
	})

	t.Run("forwarded headers trusted and passed unchanged", func(t *testing.T) {
		for _, path := range []string{"/workflows/x", "/argo-cd/x"} {
			s := request(path)
			want := map[string]string{
				"X-Forwarded-For":   "203.0.113.7, 198.51.100.1",
				"X-Forwarded-Host":  "t1.tunnels.example.com",
				"X-Forwarded-Proto": "https",
			}
			for h, v := range want {
				if got := strings.Join(s.Header[h], ","); got != v {
					t.Errorf("GET %s: upstream received %s %q, want %q", path, h, got, v)
				}
			}
			if s.Host != upHost {
				t.Errorf("GET %s: upstream received Host %q, want the upstream's %q", path, s.Host, upHost)
			}
		}
	})

	t.Run("X-Forwarded-Prefix when stripping", func(t *testing.T) {
		if got := request("/workflows/x").Header.Get("X-Forwarded-Prefix"); got != "/workflows" {
			t.Errorf("stripped route: X-Forwarded-Prefix %q, want %q", got, "/workflows")
		}
		if got := request("/workflows/x", "X-Forwarded-Prefix: /outer/").Header.Get("X-Forwarded-Prefix"); got != "/outer/workflows" {
			t.Errorf("stripped route behind a prefix: X-Forwarded-Prefix %q, want %q", got, "/outer/workflows")
		}
		if v, ok := request("/argo-cd/x").Header["X-Forwarded-Prefix"]; ok {
			t.Errorf("kept-prefix route: X-Forwarded-Prefix %q, want none", v)
		}
		if got := request("/argo-cd/x", "X-Forwarded-Prefix: /outer").Header.Get("X-Forwarded-Prefix"); got != "/outer" {
			t.Errorf("kept-prefix route: X-Forwarded-Prefix %q, want the tunnel's %q unchanged", got, "/outer")
		}
	})

	t.Run("absent forwarded headers are not invented", func(t *testing.T) {
		res, body := rawRoundTrip(t, addr, "GET /argo-cd/x HTTP/1.1", "Host: t1")
		s := decodeSeen(t, res, body)
		for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
			if v, ok := s.Header[h]; ok {
				t.Errorf("upstream received %s %q, want none (the stream's address is not the caller's)", h, v)
			}
		}
	})

	t.Run("TE trailers kept", func(t *testing.T) {
		// Go's ReverseProxy forwards "TE: trailers" (golang.org/issue/21096):
		// it tells the upstream the proxy passes trailers, which it does.
		if got := request("/argo-cd/x", "TE: trailers").Header.Get("Te"); got != "trailers" {
			t.Errorf("upstream received TE %q, want %q", got, "trailers")
		}
	})
}

func TestRouterResponseHopByHop(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "X-Internal")
		w.Header().Set("X-Internal", "secret")
		w.Header().Set("Keep-Alive", "timeout=1")
		w.Header().Set("Proxy-Authenticate", "Basic")
		w.Header().Set("X-Kept", "yes")
		w.Header().Set("Set-Cookie", "session=abc; Path=/argo-cd")
	}))
	t.Cleanup(up.Close)
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{})
	res, _ := tr.get(t, "/", nil)
	for _, h := range []string{"X-Internal", "Keep-Alive", "Proxy-Authenticate"} {
		if v, ok := res.Header[h]; ok {
			t.Errorf("caller received %s %q, want it dropped", h, v)
		}
	}
	if res.Header.Get("X-Kept") != "yes" || res.Header.Get("Set-Cookie") == "" {
		t.Errorf("caller received headers %v, want X-Kept and Set-Cookie", res.Header)
	}
	if res.Header.Get(ErrorHeader) != "" {
		t.Errorf("upstream response carries %s %q, want none", ErrorHeader, res.Header.Get(ErrorHeader))
	}
}

func TestDefaultRoutesRouting(t *testing.T) {
	// Each default route, pointed at a local upstream with its own path
	// rule, keeps or strips its prefix as its adapter documents.
	up := echoUpstream(t, "up")
	var routes []Route
	for _, r := range DefaultRoutes() {
		u := mustURL(t, up.URL)
		u.Path = r.Upstream.Path
		r.Upstream = u
		r.InsecureSkipVerify = false
		routes = append(routes, r)
	}
	tr := newTestRouter(t, routes, nil, Options{})
	tests := []struct{ path, uri string }{
		{"/api/x", "/api/x"}, // app-proxy: kept
		{"/argo-cd/api/v1/session", "/argo-cd/api/v1/session"}, // argo-cd: kept (--rootpath)
		{"/workflows/api/v1/info", "/api/v1/info"},             // argo-server: stripped
		{"/webhooks/github", "/github"},                        // event source: stripped
		{"/rollouts/api/v1/rollouts", "/rollouts/api/v1/rollouts"},
	}
	for _, tc := range tests {
		if s := tr.getSeen(t, tc.path, nil); s.RequestURI != tc.uri {
			t.Errorf("GET %s reached the upstream as %q, want %q", tc.path, s.RequestURI, tc.uri)
		}
	}
}

// Deliver leaves a request whose dial failed with ErrNotDelivered to its
// caller: it answers nothing, counts nothing and says so, and the caller
// serves the request elsewhere. Other errors are answered as always, and
// ServeHTTP answers every one. The caller's StatusWriter carries the
// request from one attempt to the next, as the server's entry does: the
// attempt that answers is counted once.
func TestRouterDeliver(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := NewRouter([]Route{{Prefix: "/", Upstream: mustURL(t, "http://upstream.test:80")}}, zaptest.NewLogger(t), Options{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			if strings.HasPrefix(fmt.Sprint(ctx.Value(rerouteKey{})), "session") {
				return nil, fmt.Errorf("%w: the session could not carry the dial", ErrNotDelivered)
			}
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		},
		Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rec := httptest.NewRecorder()
	sw := NewStatusWriter(rec)
	for _, tc := range []struct {
		cause         string
		wantDelivered bool
		wantStatus    int
	}{
		{"session", false, 0},                     // not delivered: nothing written
		{"upstream", true, http.StatusBadGateway}, // answered: 502 upstream_unreachable
	} {
		req := httptest.NewRequestWithContext(context.WithValue(t.Context(), rerouteKey{}, tc.cause), http.MethodGet, "/x", nil)
		if delivered := r.Deliver(sw, req); delivered != tc.wantDelivered {
			t.Errorf("%s failure: delivered %v, want %v", tc.cause, delivered, tc.wantDelivered)
		}
		if sw.Status() != tc.wantStatus {
			t.Errorf("%s failure: status %d, want %d (body %q)", tc.cause, sw.Status(), tc.wantStatus, rec.Body.String())
		}
	}
	requests := gather(t, reg, "tether_proxy_requests_total")
	var counted float64
	for _, s := range requests {
		counted += s.value
	}
	if got := requests["adapter=custom,class=5xx,route=/"].value; got != 1 || counted != 1 {
		t.Errorf("requests counted: 5xx %v, all %v; want the answered attempt once", got, counted)
	}

	// ServeHTTP has nowhere else to send it: it answers.
	rec = httptest.NewRecorder()
	req := httptest.NewRequestWithContext(context.WithValue(t.Context(), rerouteKey{}, "session"), http.MethodGet, "/x", nil)
	r.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadGateway {
		t.Errorf("ServeHTTP of a request not delivered: status %d, want %d", rec.Code, http.StatusBadGateway)
	}
}

type rerouteKey struct{}

// Options.Unreachable takes a request whose upstream could not be
// connected to, its body unread; when it answers, the router writes
// nothing more, and when it declines, the router answers 502
// upstream_unreachable. A tunnel session's failure (not delivered) and an
// upstream's own answer never reach it.
func TestRouterUnreachable(t *testing.T) {
	errSession := fmt.Errorf("%w: the session could not carry the dial", ErrNotDelivered)
	var bodies []string
	r, err := NewRouter([]Route{{Prefix: "/", Upstream: mustURL(t, "http://upstream.test:80")}}, zaptest.NewLogger(t), Options{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if ctx.Value(rerouteKey{}) == "session" {
				return nil, errSession
			}
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		},
		Unreachable: func(w http.ResponseWriter, req *http.Request) bool {
			b, _ := io.ReadAll(req.Body)
			bodies = append(bodies, string(b))
			if string(b) == "decline" {
				return false
			}
			w.WriteHeader(http.StatusAccepted)
			return true
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, tc := range []struct {
		cause, body string
		wantStatus  int
		wantCode    string
	}{
		{"upstream", "take", http.StatusAccepted, ""},
		{"upstream", "decline", http.StatusBadGateway, CodeUpstreamUnreachable},
		{"session", "not delivered", 0, ""},
	} {
		rec := httptest.NewRecorder()
		sw := NewStatusWriter(rec)
		req := httptest.NewRequestWithContext(context.WithValue(t.Context(), rerouteKey{}, tc.cause), http.MethodPost, "/x", strings.NewReader(tc.body))
		r.Deliver(sw, req)
		if sw.Status() != tc.wantStatus || rec.Header().Get(ErrorHeader) != tc.wantCode {
			t.Errorf("%s %s: status %d %q, want %d %q", tc.cause, tc.body, sw.Status(), rec.Header().Get(ErrorHeader), tc.wantStatus, tc.wantCode)
		}
	}
	if want := []string{"take", "decline"}; !slices.Equal(bodies, want) {
		t.Errorf("Unreachable read bodies %q, want %q whole", bodies, want)
	}
}
