package test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRouting: each tunnel's host reaches only its own client's backends,
// and within a tunnel the client routes by path prefix, keeping the prefix
// when the upstream URL has no path and replacing it when it has one. A
// stock frpc tunnel is routed by host the same way. The client pins the
// server's self-signed certificate by the fingerprint the server logged.
func TestRouting(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{selfSigned: true})

	alphaRoot := newBackend(t, "alpha-root", nil)
	alphaAPI := newBackend(t, "alpha-api", nil)
	beta := newBackend(t, "beta", nil)
	gamma := newBackend(t, "gamma-frpc", nil)
	omega := newBackend(t, "omega-frpc-v2", nil)

	alpha := startClient(t, srv, clientOpts{
		tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour, "--account", "acme", "--runtime", "prod")),
		routes:    []string{"/=" + alphaRoot.url(), "/api=" + alphaAPI.url() + "/v2"},
	})
	startClient(t, srv, clientOpts{
		tokenFile: writeToken(t, k.issue(t, "beta", time.Hour, "--account", "other")),
		routes:    []string{"/=" + beta.url()},
	})
	startFRPC(t, "frpc gamma", frpcConfig(srv, k.issue(t, "gamma", time.Hour), frpcHTTPProxy("gamma", gamma)))
	srv.waitServedBy(t, "gamma", "gamma-frpc", readyTimeout)
	// frp's framed wire protocol v2 passes tether's session layer too.
	startFRPC(t, "frpc omega (wire v2)", frpcConfig(srv, k.issue(t, "omega", time.Hour),
		`transport.wireProtocol = "v2"`+"\n"+frpcHTTPProxy("omega", omega)))
	srv.waitServedBy(t, "omega", "omega-frpc-v2", readyTimeout)

	cases := []struct {
		name, tunnel, path    string
		wantBackend, wantPath string
		wantQuery             string
	}{
		{name: "alpha root keeps the path", tunnel: "alpha", path: "/some/page?x=1",
			wantBackend: "alpha-root", wantPath: "/some/page", wantQuery: "x=1"},
		{name: "alpha prefix replaced by upstream path", tunnel: "alpha", path: "/api/items?q=a%20b",
			wantBackend: "alpha-api", wantPath: "/v2/items", wantQuery: "q=a%20b"},
		{name: "alpha prefix alone", tunnel: "alpha", path: "/api",
			wantBackend: "alpha-api", wantPath: "/v2"},
		{name: "prefix matches whole segments only", tunnel: "alpha", path: "/apix",
			wantBackend: "alpha-root", wantPath: "/apix"},
		{name: "beta has no /api route", tunnel: "beta", path: "/api/items",
			wantBackend: "beta", wantPath: "/api/items"},
		{name: "beta root", tunnel: "beta", path: "/",
			wantBackend: "beta", wantPath: "/"},
		{name: "stock frpc tunnel", tunnel: "gamma", path: "/g/h?z=9",
			wantBackend: "gamma-frpc", wantPath: "/g/h", wantQuery: "z=9"},
		{name: "stock frpc on wire protocol v2", tunnel: "omega", path: "/d",
			wantBackend: "omega-frpc-v2", wantPath: "/d"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := decodeEcho(t, srv.mustGet(t, tc.tunnel, tc.path))
			if e.Backend != tc.wantBackend {
				t.Errorf("answered by backend %q, want %q", e.Backend, tc.wantBackend)
			}
			if e.Path != tc.wantPath {
				t.Errorf("backend got path %q, want %q", e.Path, tc.wantPath)
			}
			if e.RawQuery != tc.wantQuery {
				t.Errorf("backend got query %q, want %q", e.RawQuery, tc.wantQuery)
			}
			if got, want := e.Header.Get("X-Forwarded-Host"), tc.tunnel+"."+domain; got != want {
				t.Errorf("backend got X-Forwarded-Host %q, want %q", got, want)
			}
		})
	}

	t.Run("host names are case-insensitive and may carry a port", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+srv.httpAddr+"/x", nil)
		req.Host = "BETA." + strings.ToUpper(domain) + ":8080"
		r, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		if e := decodeEcho(t, r); e.Backend != "beta" {
			t.Errorf("answered by backend %q, want beta", e.Backend)
		}
	})

	t.Run("unknown host", func(t *testing.T) {
		for _, host := range []string{"example.com", domain, "a.b." + domain, srv.httpAddr} {
			req, _ := http.NewRequest(http.MethodGet, "http://"+srv.httpAddr+"/", nil)
			req.Host = host
			r, err := do(req)
			if err != nil {
				t.Fatal(err)
			}
			if r.code != http.StatusNotFound || r.header.Get("X-Tether-Error") != "unknown_host" {
				t.Errorf("host %q: got %d %q, want 404 unknown_host", host, r.code, r.header.Get("X-Tether-Error"))
			}
		}
	})

	t.Run("tunnel not connected", func(t *testing.T) {
		r := srv.mustGet(t, "delta", "/")
		if r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != "tunnel_down" {
			t.Errorf("got %d %q, want 503 tunnel_down", r.code, r.header.Get("X-Tether-Error"))
		}
	})

	t.Run("admin API lists the tunnels", func(t *testing.T) {
		list := srv.tunnels(t)
		if len(list) != 4 {
			t.Errorf("got %d tunnels, want 4: %v", len(list), list)
		}
		a, ok := list["alpha"]
		if !ok {
			t.Fatalf("alpha not listed: %v", list)
		}
		if a.Account != "acme" || a.Runtime != "prod" {
			t.Errorf("alpha: account %q runtime %q, want acme, prod", a.Account, a.Runtime)
		}
		if a.Transport != "tls" || !strings.HasPrefix(a.Route, "alpha.") || a.ClientVersion == "" ||
			!strings.HasPrefix(a.ClientAddress, "127.0.0.1:") || a.ConnectedSince.IsZero() || a.TokenExpires.IsZero() {
			t.Errorf("alpha entry incomplete: %+v", a)
		}
		if a.Requests == 0 || a.BytesIn == 0 || a.BytesOut == 0 {
			t.Errorf("alpha: requests %d, bytes in %d, out %d; want counts above 0", a.Requests, a.BytesIn, a.BytesOut)
		}
		if b := list["beta"]; b.Account != "other" {
			t.Errorf("beta: account %q, want other", b.Account)
		}
		if g := list["gamma"]; !strings.Contains(g.ClientVersion, "frpc") {
			t.Errorf("gamma: client_version %q, want the stock frpc's", g.ClientVersion)
		}
		if got := srv.metric(t, "tether_tunnels_connected"); got != 4 {
			t.Errorf("tether_tunnels_connected = %v, want 4", got)
		}
		if got := srv.metric(t, "tether_tunnel_requests_total", "tunnel", "alpha", "code_class", "2xx"); got < 4 {
			t.Errorf("tether_tunnel_requests_total{tunnel=alpha,code_class=2xx} = %v, want >= 4", got)
		}
	})
	t.Run("health endpoints", func(t *testing.T) {
		for _, u := range []string{
			"http://" + srv.adminAddr + "/healthz", "http://" + srv.adminAddr + "/readyz",
			"http://" + alpha.healthAddr + "/healthz", "http://" + alpha.healthAddr + "/readyz",
		} {
			r, err := httpc.Get(u)
			if err != nil {
				t.Fatal(err)
			}
			r.Body.Close()
			if r.StatusCode != http.StatusOK {
				t.Errorf("GET %s: %d, want 200", u, r.StatusCode)
			}
		}
		st, err := alpha.status()
		if err != nil {
			t.Fatal(err)
		}
		if st.Tunnel != "alpha" || !st.Ready || !st.Connected || len(st.Routes) != 2 {
			t.Errorf("client /status = %+v; want tunnel alpha, ready, connected, 2 routes", st)
		}
		r, err := httpc.Get("http://" + alpha.healthAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if got := metricValue(t, string(b), "tether_client_ready"); got != 1 {
			t.Errorf("client tether_client_ready = %v, want 1", got)
		}
		if got := srv.metric(t, "tether_tunnel_bytes_total", "tunnel", "alpha", "direction", "in"); got <= 0 {
			t.Errorf("tether_tunnel_bytes_total{tunnel=alpha,direction=in} = %v, want > 0", got)
		}
		if got := srv.metric(t, "tether_http_request_duration_seconds_count", "code_class", "2xx"); got <= 0 {
			t.Errorf("tether_http_request_duration_seconds_count{code_class=2xx} = %v, want > 0", got)
		}
	})
}
