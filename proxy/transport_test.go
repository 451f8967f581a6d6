package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// countedUpstream starts an upstream that counts accepted connections.
func countedUpstream(t *testing.T, h http.Handler) (*httptest.Server, *countingListener) {
	t.Helper()
	ts := httptest.NewUnstartedServer(h)
	cl := &countingListener{Listener: ts.Listener}
	ts.Listener = cl
	ts.Start()
	t.Cleanup(ts.Close)
	return ts, cl
}

func TestConnectionReuse(t *testing.T) {
	up, conns := countedUpstream(t, echoHandler("up"))
	tr := newTestRouter(t, []Route{
		{Prefix: "/a", Upstream: mustURL(t, up.URL)},
		{Prefix: "/b", Upstream: mustURL(t, up.URL+"/")}, // same host: same pool
		{Prefix: "/", Upstream: mustURL(t, up.URL), Timeout: time.Minute},
	}, nil, Options{})
	for i := range 30 {
		path := []string{"/a/x", "/b/x", "/x"}[i%3]
		tr.getSeen(t, path, nil)
	}
	if n := conns.accepted.Load(); n != 1 {
		t.Errorf("upstream accepted %d connections for 30 sequential requests, want 1", n)
	}
	if n := len(tr.transports); n != 1 {
		t.Errorf("router has %d transports for one upstream, want 1", n)
	}
}

// TestIdleConnectionsKept checks that a burst of concurrent requests leaves
// its connections idle for the next burst, which http.Transport's default
// of 2 idle connections per host would not.
func TestIdleConnectionsKept(t *testing.T) {
	const burst = 8
	arrived := make(chan struct{}, burst)
	gate := make(chan struct{})
	up, conns := countedUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}))
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{})

	for round := range 2 {
		var wg sync.WaitGroup
		for range burst {
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, tr.front.URL+"/", nil)
				res, err := tr.client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			})
		}
		// All requests are in the upstream at once, so each has its own
		// connection; then all are answered.
		for range burst {
			recvWithin(t, arrived, "request at the upstream")
		}
		for range burst {
			gate <- struct{}{}
		}
		wg.Wait()
		if n := conns.accepted.Load(); n != burst {
			t.Fatalf("after burst %d: upstream accepted %d connections, want %d", round+1, n, burst)
		}
	}
}

func TestTransportsByUpstream(t *testing.T) {
	routes := []Route{
		{Prefix: "/a", Upstream: mustURL(t, "http://h:1")},
		{Prefix: "/b", Upstream: mustURL(t, "http://h:1/b/"), Timeout: time.Second},
		{Prefix: "/c", Upstream: mustURL(t, "http://h:1"), InsecureSkipVerify: true}, // no TLS: same pool
		{Prefix: "/d", Upstream: mustURL(t, "https://h:1")},
		{Prefix: "/e", Upstream: mustURL(t, "https://h:1"), InsecureSkipVerify: true},
		{Prefix: "/f", Upstream: mustURL(t, "http://h:2")},
	}
	r, err := NewRouter(routes, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if n := len(r.transports); n != 4 {
		t.Errorf("%d transports, want 4 (http://h:1, https://h:1 verified and not, http://h:2)", n)
	}
	want := map[string]struct {
		tls, insecure bool
	}{}
	for _, tp := range r.transports {
		got := struct{ tls, insecure bool }{tp.tlsConfig != nil, tp.tlsConfig != nil && tp.tlsConfig.InsecureSkipVerify}
		if tp.tlsConfig != nil && tp.tlsConfig.ServerName != "h" {
			t.Errorf("transport for %s verifies server name %q, want %q", tp.addr, tp.tlsConfig.ServerName, "h")
		}
		want[tp.addr+fmt.Sprint(got)] = got
	}
	for _, k := range []string{"h:1{false false}", "h:1{true false}", "h:1{true true}", "h:2{false false}"} {
		if _, ok := want[k]; !ok {
			t.Errorf("no transport %s among %v", k, want)
		}
	}
}

// The router dials each route's DialAddr, whatever address http.Transport
// would derive, and routes with the same DialAddr share one pool.
func TestTransportDialsDialAddr(t *testing.T) {
	up := echoUpstream(t, "up")
	var mu sync.Mutex
	var dialed []string
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, up.Listener.Addr().String())
	}
	tr := newTestRouter(t, []Route{
		{Prefix: "/a", Upstream: mustURL(t, "http://svc.ns")},
		{Prefix: "/b", Upstream: mustURL(t, "http://svc.ns:80/")},
	}, nil, Options{DialContext: dial})
	if n := len(tr.transports); n != 1 {
		t.Errorf("%d transports for http://svc.ns and http://svc.ns:80, want 1", n)
	}
	for _, path := range []string{"/a/x", "/b/x"} {
		if got := tr.getSeen(t, path, nil); got.Upstream != "up" {
			t.Errorf("GET %s reached %q, want the upstream", path, got.Upstream)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dialed) == 0 {
		t.Fatal("the router dialed nothing")
	}
	for _, addr := range dialed {
		if addr != "svc.ns:80" {
			t.Errorf("the router dialed %q, want the routes' DialAddr svc.ns:80", addr)
		}
	}
}
