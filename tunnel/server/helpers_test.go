package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	frputil "github.com/fatedier/frp/pkg/util/util"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/client"
)

const testDomain = "tunnels.test"

// keys signs test tokens with a fresh Ed25519 key.
type keys struct {
	signer  *auth.Signer
	pubPath string
}

func newKeys(t testing.TB) *keys {
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
	return &keys{signer: signer, pubPath: pub}
}

func (k *keys) token(t testing.TB, tunnelName string, ttl time.Duration) string {
	t.Helper()
	tok, err := k.signer.Issue(auth.IssueRequest{Tunnel: tunnelName, Account: "acct-" + tunnelName, TTL: ttl}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// verifier trusts the keys with the given clock-skew leeway (0: the default).
func (k *keys) verifier(t testing.TB, leeway time.Duration) *auth.Verifier {
	t.Helper()
	ks, err := auth.NewFileKeySource(k.pubPath)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewVerifier(auth.VerifierConfig{Keys: ks, Leeway: leeway})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// testServer is a Server serving on loopback for the duration of a test.
type testServer struct {
	*Server
	*replica
	keys   *keys
	tunnel string // tunnel listener address
	entry  string // http://host:port of the public entry
	admin  string // http://host:port of the admin endpoints
	stop   func() // cancels Serve and waits for it: the server drains
}

func startServer(t testing.TB, mutate ...func(*Config)) *testServer {
	t.Helper()
	return startServerLeeway(t, 0, mutate...)
}

// startServerLeeway starts a server whose token verifier allows leeway of
// clock skew (negative: none).
func startServerLeeway(t testing.TB, leeway time.Duration, mutate ...func(*Config)) *testServer {
	t.Helper()
	return startServerLog(t, leeway, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), mutate...)
}

// startServerLog starts a server that logs to log.
func startServerLog(t testing.TB, leeway time.Duration, log *zap.Logger, mutate ...func(*Config)) *testServer {
	t.Helper()
	return startServerWith(t, serverSetup{keys: newKeys(t), leeway: leeway, log: log}, mutate...)
}

// serverSetup is what startServerWith needs beside the Config.
type serverSetup struct {
	keys   *keys
	leeway time.Duration
	log    *zap.Logger
	opts   []Option
	peer   net.Listener // the peer listener, or nil for none
}

// startServerWith starts a server as setup says.
func startServerWith(t testing.TB, setup serverSetup, mutate ...func(*Config)) *testServer {
	t.Helper()
	k := setup.keys
	cfg := Config{TunnelAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", Domain: testDomain}
	ls := Listeners{Tunnel: listen(t), HTTP: listen(t), Admin: listen(t), Peer: setup.peer}
	if ls.Peer != nil {
		cfg.PeerAddr = ls.Peer.Addr().String()
	}
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := New(cfg, k.verifier(t, setup.leeway), setup.log, setup.opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sv, err := srv.start(ctx, ls)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sv.run(ctx) }()
	ts := &testServer{
		Server: srv, replica: sv, keys: k,
		tunnel: ls.Tunnel.Addr().String(),
		entry:  "http://" + ls.HTTP.Addr().String(),
		admin:  "http://" + ls.Admin.Addr().String(),
	}
	var once sync.Once
	ts.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(ts.stop)
	return ts
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// get sends GET path for tunnel name to the public entry.
func (s *testServer) get(t testing.TB, name, path string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.entry+path, nil)
	req.Host = name + "." + testDomain
	return do(t, req)
}

func do(t testing.TB, req *http.Request) (int, string, http.Header) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body of %s %s: %v", req.Method, req.URL, err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// backend is an upstream that answers with its name.
func backend(t testing.TB, name string) *httptestServer {
	t.Helper()
	return newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s xff=%s", name, r.URL.Path, r.Header.Get("X-Forwarded-For"))
	}))
}

type httptestServer = httptest.Server

func newHTTPTestServer(t testing.TB, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// startClient runs a tether client for tunnel name whose "/" route goes to
// upstream, and waits until it is ready.
func (s *testServer) startClient(t testing.TB, name, upstream string) {
	t.Helper()
	s.startClientRoutes(t, name, "/="+upstream)
}

// clientFiles writes a token for tunnel name and parses the --route
// specs of a test client.
func (s *testServer) clientFiles(t testing.TB, name string, specs []string) (tokenFile string, routes []proxy.Route) {
	t.Helper()
	tokenFile = filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, s.keys.token(t, name, time.Hour))
	for _, spec := range specs {
		route, err := proxy.ParseRoute(spec)
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, route)
	}
	return tokenFile, routes
}

// startClientRoutes runs a tether client for tunnel name with the given
// --route specs, one of them for "/", and waits until it is ready.
func (s *testServer) startClientRoutes(t testing.TB, name string, specs ...string) {
	t.Helper()
	tokenFile, routes := s.clientFiles(t, name, specs)
	c, err := client.New(client.Config{
		Server: s.tunnel, TokenFile: tokenFile, Routes: routes,
		TLSFingerprint: s.Fingerprint(), Proxy: "direct",
	}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Serve(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("client Serve: %v", err)
		}
	})
	testutil.WaitFor(t, 10*time.Second, func() error {
		if code, body, _ := s.get(t, name, "/"); code != http.StatusOK {
			return fmt.Errorf("tunnel %s: %d %s", name, code, body)
		}
		return nil
	})
}

// rawClient speaks frp's protocol directly over tether's session layer, the
// way a hostile client would: TLS, yamux, hand-made messages.
type rawClient struct {
	t   testing.TB
	mux *yamux.Session
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	return dialRawFrom(t, addr, "127.0.0.1")
}

// dialRawFrom is dialRaw from the local address src (any 127.0.0.x).
func dialRawFrom(t testing.TB, addr, src string) *rawClient {
	t.Helper()
	conn := testutil.DialTLSFrom(t, addr, src)
	mux, err := yamux.Client(conn, tunnel.MuxConfig(15*time.Second, zap.NewNop()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mux.Close() })
	return &rawClient{t: t, mux: mux}
}

// login sends a Login and returns the server's answer and the control stream.
func (c *rawClient) login(token, runID string) (*msg.LoginResp, net.Conn) {
	c.t.Helper()
	return c.loginMetas(map[string]string{auth.TokenMetaKey: token}, runID)
}

// loginMetas sends a Login with metas and returns the server's answer and
// the control stream.
func (c *rawClient) loginMetas(metas map[string]string, runID string) (*msg.LoginResp, net.Conn) {
	c.t.Helper()
	stream, err := c.mux.OpenStream()
	if err != nil {
		c.t.Fatal(err)
	}
	now := time.Now().Unix()
	login := &msg.Login{
		Version: "0.71.0", RunID: runID, Timestamp: now,
		PrivilegeKey: frputil.GetAuthKey("", now), // frp's shared-token check, with frp's empty token
		Metas:        metas,
	}
	if err := msg.WriteMsg(stream, login); err != nil {
		c.t.Fatal(err)
	}
	_ = stream.SetReadDeadline(time.Now().Add(10 * time.Second))
	var resp msg.LoginResp
	if err := msg.ReadMsgInto(stream, &resp); err != nil {
		c.t.Fatalf("read login answer: %v", err)
	}
	_ = stream.SetReadDeadline(time.Time{})
	return &resp, stream
}

// refused opens a stream, writes m and reports whether the server closed
// the stream (and with it the connection) without a word. frp itself would
// answer or keep the stream.
func (c *rawClient) refused(m msg.Message) bool {
	c.t.Helper()
	stream, err := c.mux.OpenStream()
	if err != nil {
		c.t.Fatal(err)
	}
	defer stream.Close()
	// The write may already see the connection closed, which is a refusal
	// too: the read below then ends at once.
	_ = msg.WriteMsg(stream, m)
	_ = stream.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := msg.ReadMsg(stream)
	if err == nil {
		c.t.Logf("server answered %T %+v", got, got)
	}
	return errors.Is(err, io.EOF)
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}
