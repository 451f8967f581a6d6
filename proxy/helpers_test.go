package proxy

import (
	"bufio"
	"context"
	"encoding/json"
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

	"github.com/hashicorp/yamux"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// seen is what an echo upstream reports about the request it received.
type seen struct {
	Method     string      `json:"method"`
	Host       string      `json:"host"`
	RequestURI string      `json:"request_uri"`
	Path       string      `json:"path"`
	RawPath    string      `json:"raw_path"`
	Header     http.Header `json:"header"`
	Upstream   string      `json:"upstream"`
}

// echoUpstream starts an upstream that answers every request with a JSON
// description of it, tagged with name.
func echoUpstream(t *testing.T, name string) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(echoHandler(name))
	t.Cleanup(ts.Close)
	return ts
}

func echoHandler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(seen{
			Method:     r.Method,
			Host:       r.Host,
			RequestURI: r.RequestURI,
			Path:       r.URL.Path,
			RawPath:    r.URL.RawPath,
			Header:     r.Header,
			Upstream:   name,
		})
	})
}

// mustURL parses s or fails the test.
func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return u
}

// testRouter is a Router served by an httptest server, as the tunnel client
// serves it on the tunnel's streams.
type testRouter struct {
	*Router
	front  *httptest.Server
	client *http.Client
}

// newTestRouter builds a router over routes and serves it. Cleanup closes
// the front server, waits for every handler, then closes the router.
func newTestRouter(t testing.TB, routes []Route, log *zap.Logger, opts Options) *testRouter {
	t.Helper()
	if log == nil {
		log = zaptest.NewLogger(t)
	}
	r, err := NewRouter(routes, log, opts)
	if err != nil {
		t.Fatalf("NewRouter: %v", err)
	}
	t.Cleanup(r.Close)
	front := serveFront(t, r)
	return &testRouter{Router: r, front: front, client: front.Client()}
}

// serveFront serves h, as the tunnel server's entry serves a router. Cleanup
// closes it and waits for every ServeHTTP: httptest.Server.Close does not
// wait for hijacked connections (websockets), and none may log after the
// test.
func serveFront(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	var inflight sync.WaitGroup
	t.Cleanup(inflight.Wait)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		inflight.Add(1)
		defer inflight.Done()
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(front.Close)
	return front
}

// get sends a GET for path through the router and returns the response with
// its body read.
func (tr *testRouter) get(t testing.TB, path string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, tr.front.URL+path, nil)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	return tr.do(t, req)
}

func (tr *testRouter) do(t testing.TB, req *http.Request) (*http.Response, string) {
	t.Helper()
	res, err := tr.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read body of %s %s: %v", req.Method, req.URL, err)
	}
	return res, string(body)
}

// getSeen sends a GET through the router to an echo upstream and decodes
// what the upstream saw.
func (tr *testRouter) getSeen(t testing.TB, path string, header http.Header) seen {
	t.Helper()
	res, body := tr.get(t, path, header)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d, want 200; body %q", path, res.StatusCode, body)
	}
	var s seen
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("GET %s: decode upstream echo %q: %v", path, body, err)
	}
	return s
}

// countingListener counts the connections accepted on it.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// rawRoundTrip writes raw, a request exactly as given (lines joined with
// CRLF), to addr and reads one response.
func rawRoundTrip(t testing.TB, addr string, lines ...string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	// A safety net against a hung router, not a synchronisation.
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, strings.Join(lines, "\r\n")+"\r\n\r\n"); err != nil {
		t.Fatalf("write request: %v", err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read response body: %v", err)
	}
	return res, string(body)
}

// decodeSeen decodes an echo upstream's answer.
func decodeSeen(t testing.TB, res *http.Response, body string) seen {
	t.Helper()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200; body %q", res.StatusCode, body)
	}
	var s seen
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("decode upstream echo %q: %v", body, err)
	}
	return s
}

// dialers are the two kinds of upstream connection the router meets: TCP,
// and tunnel streams (ReadyWaiters, whose responses are read through a
// smaller reader and wait in the stream).
var dialers = []struct {
	name string
	dial func(testing.TB) DialFunc // nil: a net.Dialer
}{
	{"tcp", func(testing.TB) DialFunc { return nil }},
	{"tunnel stream", streamDial},
}

// waitingStream is a yamux stream as the tunnel server dials it: a
// ReadyWaiter.
type waitingStream struct{ *yamux.Stream }

func (s waitingStream) WaitReady() { _, _ = s.Read(nil) }

// streamDial returns a DialFunc that dials through a yamux session over
// loopback TCP, as the tunnel server dials through a tether client: each
// dial opens a stream, and the session's far end connects it to the
// address and copies bytes both ways.
func streamDial(t testing.TB) DialFunc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	near, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	far, err := ln.Accept()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	conf := yamux.DefaultConfig()
	conf.EnableKeepAlive = false
	conf.LogOutput = io.Discard
	client, err := yamux.Client(near, conf)
	if err != nil {
		t.Fatal(err)
	}
	server, err := yamux.Server(far, conf)
	if err != nil {
		t.Fatal(err)
	}
	var relays sync.WaitGroup
	t.Cleanup(func() {
		client.Close()
		server.Close()
		relays.Wait()
	})
	relays.Go(func() {
		for {
			stream, err := server.AcceptStream()
			if err != nil {
				return
			}
			relays.Go(func() { relayStream(stream) })
		}
	})
	return func(_ context.Context, _, addr string) (net.Conn, error) {
		stream, err := client.OpenStream()
		if err != nil {
			return nil, err
		}
		if _, err := io.WriteString(stream, addr+"\n"); err != nil {
			stream.Close()
			return nil, err
		}
		return waitingStream{stream}, nil
	}
}

// relayStream reads the address a stream names in its first line, connects
// to it and copies bytes both ways until either side ends.
func relayStream(stream *yamux.Stream) {
	defer stream.Close()
	var addr []byte
	for b := make([]byte, 1); ; {
		if _, err := io.ReadFull(stream, b); err != nil {
			return
		}
		if b[0] == '\n' {
			break
		}
		addr = append(addr, b[0])
	}
	up, err := net.Dial("tcp", string(addr))
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, up); done <- struct{}{} }()
	<-done
	up.Close()
	stream.Close()
	<-done
}
