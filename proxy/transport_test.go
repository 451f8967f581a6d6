package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
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
	for _, tp := range r.transports {
		if tp.MaxIdleConnsPerHost != maxIdleConnsPerHost || tp.IdleConnTimeout != idleConnTimeout ||
			tp.TLSHandshakeTimeout != tlsHandshakeTimeout || !tp.DisableCompression {
			t.Errorf("transport settings %+v, want the documented pool and timeouts", tp)
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

// fakeUpstream is a RoundTripper that plays an upstream in virtual time: it
// takes upload to write the request, then answers after wait, unless the
// request's context ends first.
type fakeUpstream struct {
	upload time.Duration // 0: no WroteRequest event at all
	wait   time.Duration
}

func (f fakeUpstream) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if f.upload > 0 {
		time.Sleep(f.upload)
		httptrace.ContextClientTrace(ctx).WroteRequest(httptrace.WroteRequestInfo{})
	}
	select {
	case <-time.After(f.wait):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &http.Response{StatusCode: http.StatusOK, Body: &ctxBody{ctx: ctx, r: strings.NewReader("body")}}, nil
}

// ctxBody fails reads once its request's context is done, as a real
// response body does.
type ctxBody struct {
	ctx context.Context
	r   io.Reader
}

func (b *ctxBody) Read(p []byte) (int, error) {
	if err := b.ctx.Err(); err != nil {
		return 0, err
	}
	return b.r.Read(p)
}

func (b *ctxBody) Close() error { return nil }

func TestHeaderTimeout(t *testing.T) {
	const timeout = time.Minute
	tests := []struct {
		name     string
		upstream fakeUpstream
		wantErr  error
		elapsed  time.Duration
	}{
		{"answer in time", fakeUpstream{upload: time.Second, wait: 59 * time.Second}, nil, time.Minute},
		{"slow upload is not cut short", fakeUpstream{upload: 10 * time.Minute, wait: 59 * time.Second}, nil, 10*time.Minute + 59*time.Second},
		{"no headers in time", fakeUpstream{upload: time.Second, wait: time.Hour}, errHeaderTimeout, time.Second + timeout},
		{"answer before the request was written", fakeUpstream{wait: 2 * time.Minute}, nil, 2 * time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &routeTransport{next: tc.upstream, timeout: timeout}
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://up/x", nil)
				start := time.Now()
				res, err := rt.RoundTrip(req)
				if elapsed := time.Since(start); elapsed != tc.elapsed {
					t.Errorf("RoundTrip took %s, want %s", elapsed, tc.elapsed)
				}
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("RoundTrip error %v, want %v", err, tc.wantErr)
				}
				if err != nil {
					return
				}
				// The timeout bounds the headers only: the body may take
				// as long as it takes.
				time.Sleep(time.Hour)
				b, err := io.ReadAll(res.Body)
				if err != nil || string(b) != "body" {
					t.Errorf("body read an hour later: %q, %v; want %q", b, err, "body")
				}
				res.Body.Close()
				if _, err := res.Body.Read(make([]byte, 1)); !errors.Is(err, context.Canceled) {
					t.Errorf("read after Close: %v, want the request's context canceled", err)
				}
			})
		})
	}
}

func TestHeaderTimeoutKeepsUpgradeBodyWritable(t *testing.T) {
	rwc := struct {
		io.Reader
		io.Writer
		io.Closer
	}{strings.NewReader(""), io.Discard, io.NopCloser(nil)}
	next := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusSwitchingProtocols, Body: rwc}, nil
	})
	rt := &routeTransport{next: next, timeout: time.Minute}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://up/ws", nil)
	res, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.Body.(io.ReadWriteCloser); !ok {
		t.Errorf("101 body is %T, want an io.ReadWriteCloser for the upgraded connection", res.Body)
	}
	res.Body.Close()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
