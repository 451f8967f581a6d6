package gate

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/hashicorp/yamux"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// kcp-go (linked in by frp) starts its process-wide timer
		// scheduler, SystemTimedSched, when its package is initialised.
		goleak.IgnoreTopFunction("github.com/xtaci/kcp-go/v5.(*TimedSched).sched"),
		goleak.IgnoreTopFunction("github.com/xtaci/kcp-go/v5.(*TimedSched).prepend"),
	)
}

// fakeHost is the rest of the server as the gate sees it, with frp played
// by the host itself: a login is bound to the tunnel its token names (the
// token is the tunnel's name; "bad" is refused), under run ID
// "<tunnel>.<run ID>", and answered as frp would; a work connection is
// kept open until the session ends. It records what the gate told it.
type fakeHost struct {
	t     testing.TB
	probe ProbeAnswer
	// frpClosed makes HandOver refuse, as when frp takes no more streams.
	frpClosed bool

	mu       sync.Mutex
	logins   []*msg.Login // as frp read them
	works    []*msg.NewWorkConn
	silent   []*Session
	ended    map[*Session]int
	handlers sync.WaitGroup // the goroutines that play frp
}

func newFakeHost(t testing.TB) *fakeHost {
	return &fakeHost{t: t, ended: make(map[*Session]int)}
}

func (h *fakeHost) HandOver(sess *Session, conn net.Conn) bool {
	if h.frpClosed {
		return false
	}
	h.handlers.Go(func() { h.playFRP(sess, conn) })
	return true
}

// playFRP reads the stream's first message as frp would, and answers a
// login; then it holds the stream until the client or the session ends
// it, and closes it, as frp does.
func (h *fakeHost) playFRP(sess *Session, conn net.Conn) {
	defer conn.Close()
	m, err := msg.ReadMsg(conn)
	if err != nil {
		return
	}
	switch m := m.(type) {
	case *msg.Login:
		h.mu.Lock()
		h.logins = append(h.logins, m)
		h.mu.Unlock()
		name := m.Metas[auth.TokenMetaKey]
		if name == "bad" {
			_ = msg.WriteMsg(conn, &msg.LoginResp{Error: "token refused"})
			return
		}
		runID := name + "." + m.RunID
		if err := sess.Bind(&auth.Claims{Tunnel: name}, runID, m.Metas[tunnel.RoutesMetaKey] == ""); err != nil {
			_ = msg.WriteMsg(conn, &msg.LoginResp{Error: err.Error()})
			return
		}
		if err := msg.WriteMsg(conn, &msg.LoginResp{RunID: runID}); err != nil {
			return
		}
	case *msg.NewWorkConn:
		h.mu.Lock()
		h.works = append(h.works, m)
		h.mu.Unlock()
	}
	_, _ = conn.Read(make([]byte, 1)) // until the stream ends
}

func (h *fakeHost) WorkConn(stream Stream, _ bool) net.Conn { return stream }

func (h *fakeHost) Probe(*Session, *msg.Login) ProbeAnswer { return h.probe }

func (h *fakeHost) Silent(sess *Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.silent = append(h.silent, sess)
}

func (h *fakeHost) Ended(sess *Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended[sess]++
}

// fakeObserver counts what the gate reports, by kind and reason.
type fakeObserver struct {
	mu     sync.Mutex
	counts map[string]int
}

func (o *fakeObserver) count(kind, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counts == nil {
		o.counts = make(map[string]int)
	}
	o.counts[kind+" "+reason]++
}

func (o *fakeObserver) ConnectionRefused(reason string) { o.count("refused", reason) }
func (o *fakeObserver) SessionLimited(limit string)     { o.count("limited", limit) }
func (o *fakeObserver) StreamRefused(reason string)     { o.count("stream", reason) }

// get returns how many times the gate reported kind ("refused", "limited",
// "stream") for reason.
func (o *fakeObserver) get(kind, reason string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[kind+" "+reason]
}

// waitCount waits until count() is want.
func waitCount(t testing.TB, what string, count func() int, want int) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := count(); n != want {
			return fmt.Errorf("%s: %d, want %d", what, n, want)
		}
		return nil
	})
}

// testGate is a gate serving on loopback for the duration of a test.
type testGate struct {
	*Gate
	addr string
	host *fakeHost
	obs  *fakeObserver
}

// startGate serves a gate, configured as the server's defaults but for
// what mutate changes, until the test ends.
func startGate(t testing.TB, mutate ...func(*Config)) *testGate {
	t.Helper()
	host, obs := newFakeHost(t), &fakeObserver{}
	g := newTestGate(t, host, obs, mutate...)
	addr, stop := serveTestGate(t, g)
	t.Cleanup(func() {
		stop()
		host.handlers.Wait()
	})
	return &testGate{Gate: g, addr: addr, host: host, obs: obs}
}

// newTestGate makes a gate with host and obs, configured as the server's
// defaults but for what mutate changes (a nil mutate changes nothing).
func newTestGate(t testing.TB, host Host, obs Observer, mutate ...func(*Config)) *Gate {
	t.Helper()
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	cfg := Config{
		TLS: testTLS(t), HeartbeatTimeout: time.Minute, LoginTimeout: 30 * time.Second,
		MaxAnonymous: DefaultMaxAnonymous, MaxAnonymousPerIP: DefaultMaxAnonymousPerIP, Log: log, FloodLog: log,
	}
	for _, m := range mutate {
		if m != nil {
			m(&cfg)
		}
	}
	g, err := New(cfg, host, obs)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// serveTestGate serves g on loopback, and returns its address and stop,
// which ends serving, closes every session and waits for the gate: once
// it returns, the host has heard all it will. stop runs once, at the end
// of the test if not before.
func serveTestGate(t testing.TB, g *Gate) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Serve(ctx, ln) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
			g.CloseAll("test ended")
			g.Wait()
		})
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// testTLS is a TLS configuration with a self-signed certificate.
func testTLS(t testing.TB) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}
}

// dialTCPFrom connects from src; the connection closes when the test ends.
func dialTCPFrom(t testing.TB, addr, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	conn, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// dialTLSFrom connects from src and completes TLS.
func dialTLSFrom(t testing.TB, addr, src string) *tls.Conn {
	t.Helper()
	conn := tls.Client(dialTCPFrom(t, addr, src), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a test's self-signed certificate
	if err := conn.HandshakeContext(t.Context()); err != nil {
		t.Fatalf("TLS handshake from %s: %v", src, err)
	}
	return conn
}

// rawClient speaks frp's protocol over the gate: TLS, yamux, hand-made
// messages.
type rawClient struct {
	t   testing.TB
	mux *yamux.Session
}

func dialRawFrom(t testing.TB, addr, src string) *rawClient {
	t.Helper()
	mux, err := yamux.Client(dialTLSFrom(t, addr, src), tunnel.MuxConfig(15*time.Second, zap.NewNop()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mux.Close() })
	return &rawClient{t: t, mux: mux}
}

// login logs in on a stream of its own for the tunnel token names (see
// fakeHost), and returns the answer and the control stream.
func (c *rawClient) login(token, runID string) (*msg.LoginResp, net.Conn) {
	c.t.Helper()
	return c.send(&msg.Login{Version: "0.71.0", RunID: runID, Metas: map[string]string{auth.TokenMetaKey: token}})
}

// send writes m on a stream of its own and reads the answer.
func (c *rawClient) send(m msg.Message) (*msg.LoginResp, net.Conn) {
	c.t.Helper()
	stream, err := c.mux.OpenStream()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := msg.WriteMsg(stream, m); err != nil {
		c.t.Fatal(err)
	}
	_ = stream.SetReadDeadline(time.Now().Add(10 * time.Second))
	var resp msg.LoginResp
	if err := msg.ReadMsgInto(stream, &resp); err != nil {
		c.t.Fatalf("read the answer to %T: %v", m, err)
	}
	_ = stream.SetReadDeadline(time.Time{})
	return &resp, stream
}

// pipeSession is a session over a net.Pipe, as the gate makes it, of a
// gate with a fake host, and the client's end of its yamux session. Both
// close when the test ends.
func pipeSession(t *testing.T) (*Session, *yamux.Session) {
	t.Helper()
	g, err := New(Config{
		TLS: &tls.Config{MinVersion: tls.VersionTLS12}, HeartbeatTimeout: time.Minute, LoginTimeout: 30 * time.Second,
		MaxAnonymous: 1, MaxAnonymousPerIP: 1, Log: zap.NewNop(), FloodLog: zap.NewNop(),
	}, newFakeHost(t), &fakeObserver{})
	if err != nil {
		t.Fatal(err)
	}
	serverEnd, clientEnd := net.Pipe()
	conf := tunnel.MuxConfig(15*time.Second, zap.NewNop())
	mux, err := yamux.Server(serverEnd, conf)
	if err != nil {
		t.Fatal(err)
	}
	far, err := yamux.Client(clientEnd, conf)
	if err != nil {
		t.Fatal(err)
	}
	sess := newSession(g, newSessionID(), &countingConn{Conn: serverEnd}, mux, "tls")
	sess.limits = newConnLimits(LoginBudget)
	t.Cleanup(func() {
		sess.Close("test ended")
		_ = far.Close()
		g.Wait()
	})
	return sess, far
}

// serverMemory is the heap in use and the goroutine stacks, after a GC.
func serverMemory() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}
