package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server"
)

// testServer is a real tether server on loopback, serving tunnels at
// <name>.localhost.
type testServer struct {
	*server.Server
	signer *auth.Signer
	tunnel string // the tunnel listener, HOST:PORT
	entry  string // the public HTTP entry, HOST:PORT
}

func startServer(t *testing.T) *testServer {
	t.Helper()
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub.pem")
	if err := auth.GenerateKeyPair(auth.EdDSA, priv, pub); err != nil {
		t.Fatal(err)
	}
	signer, err := auth.LoadSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := auth.NewFileKeySource(pub)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewVerifier(auth.VerifierConfig{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{TunnelAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", Domain: "localhost"}
	srv, err := server.New(cfg, v, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	ls := server.Listeners{Tunnel: listen(t), HTTP: listen(t), Admin: listen(t)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ls) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server Serve: %v", err)
		}
	})
	return &testServer{Server: srv, signer: signer, tunnel: ls.Tunnel.Addr().String(), entry: ls.HTTP.Addr().String()}
}

func (s *testServer) tokenFile(t *testing.T, name string) string {
	t.Helper()
	tok, err := s.signer.Issue(auth.IssueRequest{Tunnel: name, TTL: time.Hour}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return writeTestFile(t, "token", tok)
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// A client serves its tunnel through a real server: requests reach its
// route's upstream, and when its context ends every goroutine it started
// ends too (TestMain checks that none is left).
func TestClientServesThroughServer(t *testing.T) {
	srv := startServer(t)
	backend := pathBackend(t)

	c, err := New(Config{
		Server: srv.tunnel, TokenFile: srv.tokenFile(t, "acme"), Proxy: "direct",
		TLSFingerprint: srv.Fingerprint(), Routes: []proxy.Route{mustRoute(t, "/=http://"+backend)},
	}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	serve(t, c, nil)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if ok, reason := c.status.readiness(); !ok {
			return errors.New(reason)
		}
		return nil
	})

	getThrough(t, srv.entry, "/a")
	getThrough(t, srv.entry, "/b/c")
}

// Two slots serve one tunnel through a real server, each as itself: both
// sessions become ready, requests succeed, and when one slot's connection
// dies the tunnel stays ready while that slot reconnects.
func TestSlotsServeThroughServer(t *testing.T) {
	srv := startServer(t)
	backend := pathBackend(t)

	c, err := New(Config{
		Server: srv.tunnel, TokenFile: srv.tokenFile(t, "acme"), Proxy: "direct", Connections: 2,
		TLSFingerprint: srv.Fingerprint(), Routes: []proxy.Route{mustRoute(t, "/=http://"+backend)},
	}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []*closeRecorder
	dial := c.dial
	c.dial = func(ctx context.Context) (net.Conn, string, error) {
		conn, via, err := dial(ctx)
		if err != nil {
			return conn, via, err
		}
		rc := &closeRecorder{Conn: conn}
		mu.Lock()
		conns = append(conns, rc)
		mu.Unlock()
		return rc, via, nil
	}
	serve(t, c, nil)
	bothReady := func() error {
		snap := c.status.snapshot()
		if got := sessionsOf(c); len(got) != 2 || snap.Sessions[0].State != StateReady || snap.Sessions[1].State != StateReady {
			return fmt.Errorf("sessions %q, want both slots ready", got)
		}
		return nil
	}
	testutil.WaitFor(t, 10*time.Second, bothReady)
	getThrough(t, srv.entry, "/a")

	// A live session's connection: the second slot may have closed some of
	// its own on the way, leaving the replica the first slot holds.
	mu.Lock()
	var killed net.Conn
	for _, rc := range conns {
		if !rc.closed.Load() {
			killed = rc.Conn
			break
		}
	}
	mu.Unlock()
	_ = killed.Close()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if ok, reason := c.status.readiness(); !ok {
			t.Fatalf("not ready while one slot reconnects: %s", reason)
		}
		if r := c.status.snapshot().Reconnects; r != 1 {
			return fmt.Errorf("reconnects %d, want 1", r)
		}
		return bothReady()
	})
	getThrough(t, srv.entry, "/b/c")
}

// serve runs c, with its health endpoints on health (nil: none), until the
// test ends, and fails the test if Serve returns an error.
func serve(t testing.TB, c *Client, health net.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Serve(ctx, health) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// closeRecorder is a connection that records whether the client closed it.
type closeRecorder struct {
	net.Conn
	closed atomic.Bool
}

func (c *closeRecorder) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// pathBackend starts an upstream that answers with the path it was asked
// for, as getThrough expects, and returns its address.
func pathBackend(t *testing.T) string {
	t.Helper()
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "backend saw %s", r.URL.Path)
	}), ReadHeaderTimeout: time.Second}
	ln := listen(t)
	go func() { _ = backend.Serve(ln) }()
	t.Cleanup(func() { _ = backend.Close() })
	return ln.Addr().String()
}

// getThrough asks the server's public entry for path on tunnel acme and checks the
// backend answered.
func getThrough(t *testing.T, entry, path string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+entry+path, nil)
	req.Host = "acme.localhost"
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "backend saw "+path {
		t.Errorf("GET %s through the tunnel: %s %q (%s: %s)", path, resp.Status, body, proxy.ErrorHeader, resp.Header.Get(proxy.ErrorHeader))
	}
}

// A login longer than the server reads is not sent: the client says which
// part makes it long and what to do, where it used to see only an EOF when
// the server closed the connection. tether's own signer refuses to make such
// a token; the platform's may not.
func TestOversizedLoginSaysWhy(t *testing.T) {
	srv := startServer(t)
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "acme", "account": strings.Repeat("a", 11000), "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString([]byte("a platform's own signer"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{
		Server: srv.tunnel, TokenFile: writeTestFile(t, "token", tok), Proxy: "direct",
		TLSFingerprint: srv.Fingerprint(), Routes: []proxy.Route{mustRoute(t, "/=http://"+pathBackend(t))},
	}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	status, logs := runUntilFailed(t, c, "login failed; retrying")
	want := fmt.Sprintf("the token (--token-file) is %d bytes: issue one with shorter claims", len(tok))
	for what, text := range map[string]string{"/status": status, "/debug/logs": logs} {
		if !strings.Contains(text, "the login is ") || !strings.Contains(text, want) {
			t.Errorf("%s after an oversized login: %s\nwant it to say %q", what, text, want)
		}
	}
}

// The hint names the larger of the token and the routes.
func TestCheckLoginSize(t *testing.T) {
	for _, tc := range []struct {
		size          int
		token, routes int
		want          string
	}{
		{tunnel.MaxLoginSize, 9000, 100, ""},
		{tunnel.MaxLoginSize + 1, 9000, 100, "the token (--token-file) is 9000 bytes"},
		{tunnel.MaxLoginSize + 1, 4000, 6000, "the routes (--route) take 6000 bytes"},
	} {
		err := checkLoginSize(tc.size, map[string]string{auth.TokenMetaKey: strings.Repeat("t", tc.token), tunnel.RoutesMetaKey: strings.Repeat("r", tc.routes)})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("a login of %d bytes: %v, want it sent", tc.size, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("a login of %d bytes (token %d, routes %d): %v, want %q", tc.size, tc.token, tc.routes, err, tc.want)
		}
	}
}
