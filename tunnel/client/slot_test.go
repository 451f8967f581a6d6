package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	netpkg "github.com/fatedier/frp/pkg/util/net"
	"github.com/golang-jwt/jwt/v5"
	"github.com/hashicorp/yamux"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
)

// inBubble runs f in a synctest bubble. yamux keeps the timers of its
// write timeouts in a process-wide sync.Pool, and the runtime stops the
// process when a timer made inside a bubble is used outside it (the next
// test's bubble, or a test without one): when the bubble ends, two garbage
// collections empty every sync.Pool, also when the test failed.
func inBubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	t.Cleanup(func() {
		runtime.GC()
		runtime.GC()
	})
	synctest.Test(t, f)
}

// fakeServer plays a tether server for a client's slots over net.Pipe: it
// answers each session's frp login and route registration as frps does, and
// the test sends notices on a session and closes it from the server's side.
// It runs inside the test's synctest bubble, where time moves only when
// every goroutine waits.
type fakeServer struct {
	t        *testing.T
	tunnel   string
	key      []byte // frp's control encryption key
	sessions chan *fakeSession
	conns    sync.WaitGroup

	mu   sync.Mutex
	down error // what a dial fails with while the server is away
	// endAtLogin makes each session end right after its login is
	// accepted, as a slot's does when it leaves a replica another slot
	// holds.
	endAtLogin bool
	// refuse, when set, answers each login's token: a reason refuses it.
	refuse func(token string) string
	// logins are the tokens of the logins received, in order.
	logins []string
}

// fakeSession is one session the client opened, as the server sees it.
type fakeSession struct {
	mux       *yamux.Session
	runID     string // as the client sent it
	proxy     string // the route's name
	subdomain string
	token     string      // the token it logged in with
	withdrawn atomic.Bool // the client closed the route (frp CloseProxy)
}

func newFakeServer(t *testing.T, c *Client) *fakeServer {
	f := &fakeServer{t: t, tunnel: c.tunnel, key: c.frpAuth.EncryptionKey(), sessions: make(chan *fakeSession, 64)}
	c.dial = f.dial
	t.Cleanup(f.conns.Wait)
	return f
}

// setDown makes every dial fail with err; nil makes them succeed again.
func (f *fakeServer) setDown(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = err
}

func (f *fakeServer) dial(context.Context) (net.Conn, string, error) {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down != nil {
		return nil, "", down
	}
	cli, srv := net.Pipe()
	mux, err := yamux.Server(srv, tunnel.MuxConfig(15*time.Second, zap.NewNop()))
	if err != nil {
		return nil, "", err
	}
	f.conns.Go(func() { f.serve(mux) })
	return cli, "direct", nil
}

// serve answers the login and the route, then reads the control channel
// until the session ends.
func (f *fakeServer) serve(mux *yamux.Session) {
	defer mux.Close()
	stream, err := mux.AcceptStream()
	if err != nil {
		return
	}
	var login msg.Login
	if err := msg.ReadMsgInto(stream, &login); err != nil {
		return
	}
	token := login.Metas[auth.TokenMetaKey]
	f.mu.Lock()
	end, refuse := f.endAtLogin, f.refuse
	f.logins = append(f.logins, token)
	f.mu.Unlock()
	if refuse != nil {
		if reason := refuse(token); reason != "" {
			_ = msg.WriteMsg(stream, &msg.LoginResp{Version: "fake", Error: reason})
			return
		}
	}
	if err := msg.WriteMsg(stream, &msg.LoginResp{Version: "fake", RunID: f.tunnel + "." + login.RunID}); err != nil {
		return
	}
	if end {
		return
	}
	crw, err := netpkg.NewCryptoReadWriter(stream, f.key)
	if err != nil {
		f.t.Error(err)
		return
	}
	rw := msg.NewV1ReadWriter(crw)
	m, err := rw.ReadMsg()
	if err != nil {
		return
	}
	np, ok := m.(*msg.NewProxy)
	if !ok {
		f.t.Errorf("first control message %T, want a NewProxy", m)
		return
	}
	if err := rw.WriteMsg(&msg.NewProxyResp{ProxyName: np.ProxyName}); err != nil {
		return
	}
	fs := &fakeSession{mux: mux, runID: login.RunID, proxy: np.ProxyName, subdomain: np.SubDomain, token: token}
	f.sessions <- fs
	for {
		m, err := rw.ReadMsg()
		if err != nil {
			return
		}
		if cp, ok := m.(*msg.CloseProxy); ok && cp.ProxyName == fs.proxy {
			fs.withdrawn.Store(true)
		}
	}
}

// next returns the session that registered its route since the last call;
// it fails the test when there is none. Call it after synctest.Wait.
func (f *fakeServer) next() *fakeSession {
	f.t.Helper()
	select {
	case s := <-f.sessions:
		return s
	default:
		f.t.Fatal("no new session")
		return nil
	}
}

// nextWithin lets time pass, a tenth of a second at a time, until a session
// has registered its route, and returns it with the time it took; it fails
// the test when none has within limit.
func (f *fakeServer) nextWithin(limit time.Duration) (*fakeSession, time.Duration) {
	f.t.Helper()
	start := time.Now()
	for time.Since(start) <= limit {
		synctest.Wait()
		select {
		case s := <-f.sessions:
			return s, time.Since(start)
		default:
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.t.Fatalf("no new session within %v", limit)
	return nil, 0
}

// none fails the test when a session registered its route since the last
// call to next.
func (f *fakeServer) none() {
	f.t.Helper()
	select {
	case s := <-f.sessions:
		f.t.Fatalf("unexpected new session %s", s.runID)
	default:
	}
}

// notice sends n on the session, as the server does, and waits until the
// client has read it.
func (s *fakeSession) notice(t *testing.T, n tunnel.Notice) {
	t.Helper()
	stream, err := s.mux.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	// A client that leaves the session on reading the notice may close it
	// before yamux reports the write done, which then fails although the
	// client read it. What the client did with it is for the test to check.
	if err := tunnel.WriteNotice(stream, n); err != nil && !errors.Is(err, yamux.ErrSessionShutdown) {
		t.Fatal(err)
	}
	synctest.Wait()
}

// closed reports whether the session has ended.
func (s *fakeSession) closed() bool { return s.mux.IsClosed() }

func hello(replica, session string) tunnel.Notice {
	return tunnel.Notice{Kind: tunnel.NoticeHello, Replica: replica, Session: session}
}

func move(replica string) tunnel.Notice {
	return tunnel.Notice{Kind: tunnel.NoticeMove, Replica: replica}
}

// startFake starts a client of tunnel "acme" with n slots against a fake
// server, inside the caller's synctest bubble, and waits until each slot's
// first session is up. It returns them by slot.
func startFake(t *testing.T, n int) (*Client, *fakeServer, []*fakeSession) {
	t.Helper()
	c, err := New(Config{
		Server: "tunnels.example.com:443", TokenFile: unsignedToken(t, "acme"), Proxy: "direct", Connections: n,
		Routes: []proxy.Route{mustRoute(t, "/=http://app:8080")},
	}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeServer(t, c)
	serve(t, c, nil)
	synctest.Wait()
	first := make([]*fakeSession, n)
	for range n {
		s := f.next()
		first[slotOf(t, c, s)] = s
	}
	return c, f, first
}

// slotOf is the slot a session belongs to, by its run ID.
func slotOf(t *testing.T, c *Client, s *fakeSession) int {
	t.Helper()
	for _, sl := range c.slots {
		if slices.Contains(sl.runIDs[:], s.runID) {
			return sl.index
		}
	}
	t.Fatalf("run ID %q is no slot's", s.runID)
	return -1
}

// unsignedToken writes a JWT for tunnel that only a fake server accepts.
func unsignedToken(t *testing.T, tunnel string) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: tunnel}).SignedString([]byte("test"))
	if err != nil {
		t.Fatal(err)
	}
	return writeTestFile(t, "token", tok)
}

// sessionsOf returns the /status sessions as "slot:replica:state" strings.
func sessionsOf(c *Client) []string {
	var out []string
	for _, s := range c.status.snapshot().Sessions {
		out = append(out, fmt.Sprintf("%d:%s:%s", s.Slot, s.Replica, s.State))
	}
	return out
}

func wantSessions(t *testing.T, c *Client, want ...string) {
	t.Helper()
	if got := sessionsOf(c); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("sessions %q, want %q", got, want)
	}
}

// Each slot logs in as itself: one instance ID for the process, the slot's
// number after it, and a route of its own at the tunnel's subdomain.
func TestSlotIdentity(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, _, first := startFake(t, 3)
		if !regexp.MustCompile(`^[0-9a-f]{8}$`).MatchString(c.instance) {
			t.Errorf("instance ID %q, want 8 hex digits", c.instance)
		}
		for k, s := range first {
			if want := fmt.Sprintf("%s-%d", c.instance, k); s.runID != want {
				t.Errorf("slot %d logged in with run ID %q, want %q", k, s.runID, want)
			}
			if want := fmt.Sprintf("acme.%s-%d", c.instance, k); s.proxy != want || s.subdomain != "acme" {
				t.Errorf("slot %d registered proxy %q at subdomain %q, want %q at acme", k, s.proxy, s.subdomain, want)
			}
		}
		wantSessions(t, c, "0::ready", "1::ready", "2::ready")
		if ok, reason := c.status.readiness(); !ok {
			t.Errorf("not ready with three sessions: %s", reason)
		}
	})
}

// A slot whose session lands on a replica another slot holds reconnects at
// once, so that the sessions spread over the replicas behind the address.
func TestSlotLeavesAReplicaAnotherSlotHolds(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, f, first := startFake(t, 2)
		first[0].notice(t, hello("replica-a", "s0"))
		start := time.Now()
		first[1].notice(t, hello("replica-a", "s1"))
		if !first[1].closed() {
			t.Fatal("slot 1 kept its session on replica-a, which slot 0 holds")
		}
		if first[0].closed() {
			t.Fatal("slot 0 lost its session")
		}
		again := f.next()
		if slotOf(t, c, again) != 1 {
			t.Fatalf("session of slot %d reconnected, want slot 1", slotOf(t, c, again))
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("slot 1 reconnected after %v, want at once", waited)
		}
		again.notice(t, hello("replica-b", "s2"))
		time.Sleep(time.Minute)
		synctest.Wait()
		f.none()
		wantSessions(t, c, "0:replica-a:ready", "1:replica-b:ready")
		if r := c.status.snapshot().Reconnects; r != 0 {
			t.Errorf("reconnects %d after a move off a shared replica, want 0: it lost nothing", r)
		}
	})
}

// A server that says it is the only replica (its registry is in memory)
// spares the slots their tries: they stay side by side at once, and for
// good.
func TestSlotStaysOnTheOnlyReplica(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, f, first := startFake(t, 2)
		for i, s := range first {
			n := hello("only", fmt.Sprintf("s%d", i))
			n.Alone = true
			s.notice(t, n)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if first[0].closed() || first[1].closed() {
			t.Fatal("a slot left the server's only replica")
		}
		f.none()
		wantSessions(t, c, "0:only:ready", "1:only:ready")
		if e := c.status.snapshot().Sessions[1]; e.NextTry != nil {
			t.Errorf("/status plans a try at %v on the server's only replica", e.NextTry)
		}
	})
}

// A slot whose session lands on a replica another slot holds closes it and
// tries again at once, three times in a row; then it keeps the shared
// replica, and keeps trying to reach another with sessions opened beside
// the shared one (make-before-break), in rounds of three at once, each
// round after a longer wait than the last, up to 30 s. One that lands
// elsewhere takes the slot over once it serves, with the slot's other run
// ID (so that one landing beside the slot's own session replaces nothing),
// and the shared session withdraws its route and closes.
func TestSlotKeepsTryingToLeaveASharedReplica(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, f, first := startFake(t, 2)
		first[0].notice(t, hello("a", "s0"))
		s := first[1]
		for try := range maxRedials {
			s.notice(t, hello("a", "s1"))
			if !s.closed() {
				t.Fatalf("try %d: slot 1 kept a session on the replica slot 0 holds", try+1)
			}
			s = f.next()
		}
		shared := s
		shared.notice(t, hello("a", "s1"))
		if shared.closed() {
			t.Fatalf("slot 1 closed its session on the shared replica a %dth time", maxRedials+1)
		}
		wantSessions(t, c, "0:a:ready", "1:a:ready")
		e := c.status.snapshot().Sessions[1]
		if !slices.Equal(e.SharesReplicaWith, []int{0}) || e.NextTry == nil {
			t.Errorf("/status of slot 1: shares replica with %v, next try %v; want slot 0 and a time", e.SharesReplicaWith, e.NextTry)
		}

		// Rounds of tries that land on replica a, each beside the shared
		// session, which serves on.
		var gaps []time.Duration
		for round := range 8 {
			for try := range maxRedials {
				var next *fakeSession
				if try == 0 {
					var waited time.Duration
					next, waited = f.nextWithin(maxSpreadDelay + time.Second)
					gaps = append(gaps, waited)
				} else {
					next = f.next() // the round's tries come at once
				}
				if next.runID == shared.runID || slotOf(t, c, next) != 1 {
					t.Fatalf("round %d try %d: a session of slot %d with run ID %s; want slot 1's other run ID than %s", round, try, slotOf(t, c, next), next.runID, shared.runID)
				}
				wantSessions(t, c, "0:a:ready", "1:a:ready", "1::spreading")
				next.notice(t, hello("a", "try"))
				if !next.closed() || shared.closed() {
					t.Fatalf("round %d try %d: the try that landed on a shared replica is open %v, the shared session closed %v", round, try, !next.closed(), shared.closed())
				}
			}
		}
		t.Logf("waits before each round of tries: %v", gaps)
		if gaps[0] > minSpreadDelay || gaps[len(gaps)-1] < maxSpreadDelay/2 {
			t.Errorf("the first round came after %v, the last after %v; want at most %v, and at least %v once the waits have grown",
				gaps[0], gaps[len(gaps)-1], minSpreadDelay, maxSpreadDelay/2)
		}

		// A try lands on replica b: it takes the slot over, and the shared
		// session leaves.
		moved, _ := f.nextWithin(maxSpreadDelay + time.Second)
		moved.notice(t, hello("b", "s2"))
		time.Sleep(time.Second)
		synctest.Wait()
		if moved.closed() {
			t.Fatal("the session that reached replica b was closed")
		}
		if !shared.withdrawn.Load() || !shared.closed() {
			t.Errorf("the session on the shared replica: route withdrawn %v, closed %v; want both", shared.withdrawn.Load(), shared.closed())
		}
		wantSessions(t, c, "0:a:ready", "1:b:ready")
		if r := c.status.snapshot().Reconnects; r != 0 {
			t.Errorf("reconnects %d after leaving a shared replica, want 0: nothing was lost", r)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		f.none()

		// The slot's run ID is now the one of the session that took it
		// over: when that session is lost, its replacement replaces it.
		_ = moved.mux.Close()
		time.Sleep(time.Second)
		synctest.Wait()
		if again := f.next(); again.runID != moved.runID {
			t.Errorf("the slot reconnected as %s, want %s", again.runID, moved.runID)
		}
	})
}

// A session that leaves a shared replica waits for the requests it carries
// before it closes: its route is withdrawn at once, and an upstream
// connection that was under way still gets its bytes through.
func TestLeavingSessionFinishesItsRequests(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, f, first := startFake(t, 2)
		upstream := echoUpstream(t, c)
		first[0].notice(t, hello("a", "s0"))
		s := first[1]
		for range maxRedials {
			s.notice(t, hello("a", "s1"))
			s = f.next()
		}
		shared := s
		shared.notice(t, hello("a", "s1"))
		stream := openDial(t, shared, upstream)

		moved, _ := f.nextWithin(maxSpreadDelay + time.Second)
		moved.notice(t, hello("b", "s2"))
		time.Sleep(leaveGrace / 2)
		synctest.Wait()
		if !shared.withdrawn.Load() || shared.closed() {
			t.Fatalf("with a connection under way, the leaving session: route withdrawn %v, closed %v; want withdrawn and open", shared.withdrawn.Load(), shared.closed())
		}
		wantSessions(t, c, "0:a:ready", "1:a:leaving", "1:b:ready")
		if got := echo(t, stream, "still served"); got != "still served" {
			t.Errorf("the leaving session's connection echoed %q", got)
		}
		_ = stream.Close()
		time.Sleep(time.Second)
		synctest.Wait()
		if !shared.closed() {
			t.Error("the leaving session stayed open after its last connection ended")
		}
		wantSessions(t, c, "0:a:ready", "1:b:ready")
	})
}

// A move is make-before-break: the replacement session starts at once with
// the same identity, the old one keeps serving until the server closes it,
// and its end starts no reconnect.
func TestMoveReplacesBeforeTheOldSessionEnds(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, f, first := startFake(t, 1)
		upstream := echoUpstream(t, c)
		old := first[0]
		old.notice(t, hello("draining", "s0"))
		start := time.Now()
		old.notice(t, move("draining"))
		repl := f.next()
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the replacement started after %v, want at once", waited)
		}
		if repl.runID != old.runID || repl.proxy != old.proxy {
			t.Errorf("replacement logged in as %s with route %s, want the slot's %s and %s", repl.runID, repl.proxy, old.runID, old.proxy)
		}
		repl.notice(t, hello("fresh", "s1"))
		time.Sleep(time.Minute)
		synctest.Wait()
		if old.closed() {
			t.Fatal("the client closed the session that moves; the server closes it")
		}
		wantSessions(t, c, "0:draining:moving", "0:fresh:ready")
		if err := promtest.CollectAndCompare(c.metrics, strings.NewReader(`
# HELP tether_client_sessions Sessions by state, as /status lists them: a slot without a session of its own counts as connecting.
# TYPE tether_client_sessions gauge
tether_client_sessions{state="connecting"} 0
tether_client_sessions{state="leaving"} 0
tether_client_sessions{state="logged_in"} 0
tether_client_sessions{state="moving"} 1
tether_client_sessions{state="ready"} 1
tether_client_sessions{state="spreading"} 0
`), "tether_client_sessions"); err != nil {
			t.Error(err)
		}
		// The old session still serves its requests.
		if got := dialThrough(t, old, upstream, "still here"); got != "still here" {
			t.Errorf("the session that moves echoed %q, want %q", got, "still here")
		}

		_ = old.mux.Close()
		time.Sleep(time.Minute)
		synctest.Wait()
		f.none()
		wantSessions(t, c, "0:fresh:ready")
		if repl.closed() {
			t.Error("the replacement ended with the old session")
		}
		if r := c.status.snapshot().Reconnects; r != 1 {
			t.Errorf("reconnects %d after one move, want 1", r)
		}
	})
}

// A slot holds at most two sessions: a move told to its replacement while
// the earlier session still drains waits for that one to end.
func TestMovesAreBounded(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, f, first := startFake(t, 1)
		a := first[0]
		a.notice(t, move("r1"))
		b := f.next()
		b.notice(t, move("r2"))
		time.Sleep(time.Minute)
		synctest.Wait()
		f.none()
		wantSessions(t, c, "0::moving", "0::moving", "0::connecting")
		if ok, reason := c.status.readiness(); !ok {
			t.Errorf("not ready while two sessions still serve: %s", reason)
		}
		// A second move notice on a session changes nothing.
		b.notice(t, move("r2"))
		f.none()

		start := time.Now()
		_ = a.mux.Close()
		synctest.Wait()
		f.next()
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the replacement for the second move started %v after the first moved session ended, want at once", waited)
		}
		if b.closed() {
			t.Error("the client closed a session that moves")
		}
	})
}

// A notice the client does not know is ignored, and a stream that is no
// notice is closed: the session serves on.
func TestNoticesNotUnderstood(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, f, first := startFake(t, 1)
		s := first[0]
		s.notice(t, tunnel.Notice{Kind: "reboot", Replica: "r"})

		stream, err := s.mux.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Write([]byte{'N', 99, 0, 2, '{', '}'}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n, err := stream.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("an unreadable notice's stream read %d bytes, %v; want it closed", n, err)
		}
		_ = stream.Close()

		time.Sleep(time.Minute)
		synctest.Wait()
		f.none()
		if s.closed() {
			t.Fatal("a notice the client did not understand ended its session")
		}
		wantSessions(t, c, "0::ready")
	})
}

// /readyz answers 200 while any session serves, and otherwise says what
// each slot misses.
func TestReadyWhileAnySessionServes(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, f, first := startFake(t, 2)
		readyz := func() (int, string) {
			rec := httptest.NewRecorder()
			c.healthHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			return rec.Code, strings.TrimSpace(rec.Body.String())
		}
		// The server goes away: no session comes back.
		fail := errors.New("dial tcp 203.0.113.1:443: connect: connection refused")
		f.setDown(fail)
		_ = first[0].mux.Close()
		time.Sleep(time.Second)
		synctest.Wait()
		if code, body := readyz(); code != http.StatusOK {
			t.Errorf("/readyz %d %q with slot 1 serving, want 200", code, body)
		}
		_ = first[1].mux.Close()
		time.Sleep(time.Second)
		synctest.Wait()
		code, body := readyz()
		want := "not ready: slots 0, 1: not connected to the tunnel server: " + fail.Error()
		if code != http.StatusServiceUnavailable || body != want {
			t.Errorf("/readyz %d %q, want 503 %q", code, body, want)
		}
		f.setDown(nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		f.next()
		f.next()
		if code, body := readyz(); code != http.StatusOK {
			t.Errorf("/readyz %d %q after both slots reconnected, want 200", code, body)
		}
		if r := c.status.snapshot().Reconnects; r != 2 {
			t.Errorf("reconnects %d, want 2 (one per slot)", r)
		}
	})
}

// echoUpstream makes the client's route upstream an in-memory echo server
// and returns its address.
func echoUpstream(t *testing.T, c *Client) string {
	t.Helper()
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	c.upstreams.dial = func(_ context.Context, _, _ string) (net.Conn, error) {
		a, b := net.Pipe()
		wg.Go(func() {
			defer b.Close()
			_, _ = io.Copy(b, b)
		})
		return a, nil
	}
	return c.routes[0].DialAddr()
}

// dialThrough asks the client, on a new stream of s, for a connection to
// addr, and sends payload in the same write as the request: the client must
// not lose what it read ahead. It returns what came back.
func dialThrough(t *testing.T, s *fakeSession, addr, payload string) string {
	t.Helper()
	stream := openDial(t, s, addr, payload)
	defer stream.Close()
	return read(t, stream, len(payload))
}

// openDial asks the client, on a new stream of s, for a connection to addr,
// sends first in the same write as the request, and returns the stream
// once the client has connected.
func openDial(t *testing.T, s *fakeSession, addr string, first ...string) net.Conn {
	t.Helper()
	stream, err := s.mux.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	var req strings.Builder
	if err := tunnel.WriteDialRequest(&req, addr); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Write([]byte(req.String() + strings.Join(first, ""))); err != nil {
		t.Fatal(err)
	}
	code, reason, err := tunnel.ReadDialReply(stream)
	if err != nil || code != tunnel.DialOK {
		t.Fatalf("dial %s: code %d %q, %v", addr, code, reason, err)
	}
	return stream
}

// echo writes payload on a connection to an echo upstream and returns what
// came back.
func echo(t *testing.T, stream net.Conn, payload string) string {
	t.Helper()
	if _, err := io.WriteString(stream, payload); err != nil {
		t.Fatal(err)
	}
	return read(t, stream, len(payload))
}

func read(t *testing.T, stream net.Conn, n int) string {
	t.Helper()
	got := make([]byte, n)
	if _, err := io.ReadFull(stream, got); err != nil {
		t.Fatal(err)
	}
	return string(got)
}

// TestSessionsEndingAtLoginLeaveNothing: sessions that end as soon as their
// login is accepted leave no goroutine behind once the client stops. frp's
// control may end before it has added the slot's route, whose status loop
// then only the client can stop (goleak checks at the end of the package's
// tests). The race is frp's scheduling, so the test makes many such
// sessions.
func TestSessionsEndingAtLoginLeaveNothing(t *testing.T) {
	c, err := New(Config{
		Server: "tunnels.example.com:443", TokenFile: unsignedToken(t, "acme"), Proxy: "direct", Connections: MaxConnections,
		Routes: []proxy.Route{mustRoute(t, "/=http://app:8080")},
	}, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeServer(t, c)
	f.endAtLogin = true
	serve(t, c, nil)
	const sessions = 300
	testutil.WaitFor(t, 30*time.Second, func() error {
		if n := c.status.snapshot().Reconnects; n < sessions {
			return fmt.Errorf("%d sessions ended at login, want %d", n, sessions)
		}
		return nil
	})
}
