package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/client"
	"github.com/tether-dev/tether/tunnel/server/gate"
)

// runClient runs a tether client for tunnel name against server (a tunnel
// address, or a balancer's) with the given connections, whose "/" route
// goes to upstream. It returns a function that stops the client.
func (s *testServer) runClient(t testing.TB, name, server string, connections int, upstream string) (stop func()) {
	t.Helper()
	return s.runClientRoutes(t, name, server, connections, "/="+upstream)
}

// runClientRoutes is runClient with the given --route specs.
func (s *testServer) runClientRoutes(t testing.TB, name, server string, connections int, specs ...string) (stop func()) {
	t.Helper()
	tokenFile, routes := s.clientFiles(t, name, specs)
	c, err := client.New(client.Config{
		Server: server, TokenFile: tokenFile, Routes: routes, Connections: connections,
		TLSInsecureSkipVerify: true, Proxy: "direct",
	}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Serve(ctx, nil) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("client Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitHolders waits until the registry shows tunnel name held by n other
// replicas.
func (s *testServer) waitHolders(t testing.TB, name string, n int) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, func() error {
		if got := len(s.registry.Holders(name)); got != n {
			return fmt.Errorf("replica %s sees %d holders of %s, want %d", s.cfg.ReplicaID, got, name, n)
		}
		return nil
	})
}

// waitSessions waits until tunnel name has n sessions serving here.
func (s *testServer) waitSessions(t testing.TB, name string, n int) []*member {
	t.Helper()
	var serving []*member
	testutil.WaitFor(t, 10*time.Second, func() error {
		serving = nil
		for _, m := range s.members.list() {
			if _, ok := s.members.handler(m); ok && m.sess.Tunnel() == name {
				serving = append(serving, m)
			}
		}
		if len(serving) != n {
			return fmt.Errorf("tunnel %s has %d sessions serving, want %d", name, len(serving), n)
		}
		return nil
	})
	return serving
}

// relay is a TCP relay to target whose connections can all be frozen
// (nothing passes, nothing closes) or cut. It records what passes each
// way: what a machine on the network between the two sees.
type relay struct {
	ln     net.Listener
	target string
	frozen atomic.Bool

	mu       sync.Mutex
	conns    []net.Conn
	sent     bytes.Buffer // from the dialing side to target
	received bytes.Buffer // back
}

func newRelay(t testing.TB, target string) *relay {
	r := &relay{ln: listen(t), target: target}
	go r.accept()
	t.Cleanup(func() { _ = r.ln.Close(); r.cut() })
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) accept() {
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, in, out)
		r.mu.Unlock()
		go r.pump(in, out, &r.received)
		go r.pump(out, in, &r.sent)
	}
}

func (r *relay) pump(dst, src net.Conn, record *bytes.Buffer) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !r.frozen.Load() { // frozen: swallowed, the path is dark
			r.mu.Lock()
			record.Write(buf[:n])
			r.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// recorded returns copies of what passed each way so far.
func (r *relay) recorded() (sent, received []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.sent.Bytes()), bytes.Clone(r.received.Bytes())
}

// cut closes every relayed connection.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

// Requests are spread over the sessions of a tunnel; a client with two
// connections to a lone server keeps both there.
func TestRequestsSpreadOverSessions(t *testing.T) {
	s := startServer(t)
	s.runClient(t, "alpha", s.tunnel, 2, backend(t, "alpha").URL)
	sessions := s.waitSessions(t, "alpha", 2)
	for range 20 {
		if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
			t.Fatalf("got %d %s", code, body)
		}
	}
	for _, m := range sessions {
		if n := s.members.info(m).Requests; n < 5 {
			t.Errorf("session %s served %d of 20 requests, want them spread over both", m.sess.ID(), n)
		}
	}
	// The server told the client it is the only replica: its two
	// connections did not reconnect to look for another.
	if got := promtest.ToFloat64(s.metrics.loginsAccepted); got != 2 {
		t.Errorf("tether_logins_accepted_total = %v, want 2: one per connection", got)
	}
}

// twoSessionsOneRelayed gives tunnel name two sessions, both to upstream:
// the first through the returned relay, which a test can break, the second
// direct. It returns the relayed session too.
func (s *testServer) twoSessionsOneRelayed(t *testing.T, name, upstream string) (*relay, *member) {
	t.Helper()
	r := newRelay(t, s.tunnel)
	s.runClient(t, name, r.addr(), 1, upstream)
	relayed := s.waitSessions(t, name, 1)[0]
	s.runClient(t, name, s.tunnel, 1, upstream)
	s.waitSessions(t, name, 2)
	return r, relayed
}

// waitGone waits until sess is no longer listed among its tunnel's
// sessions. Its client may have connected again since: that is a new
// session.
func (s *testServer) waitGone(t *testing.T, m *member, what string) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if slices.Contains(s.members.sessionsOf(m.sess.Tunnel()), m.sess) {
			return fmt.Errorf("the %s session is still listed", what)
		}
		return nil
	})
}

// A session whose path went dark (nothing passes, nothing closes) costs a
// request a few seconds at most while another session serves the tunnel:
// a dial through it is given up after a ping goes unanswered, and a
// request written on one of its pooled streams is freed when the session
// closes for its silence.
func TestSilentSessionIsPassedOver(t *testing.T) {
	s := startServer(t)
	be := backend(t, "alpha")
	r, relayed := s.twoSessionsOneRelayed(t, "alpha", be.URL)
	for range 10 { // both sessions have pooled streams now
		if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
			t.Fatalf("got %d %s", code, body)
		}
	}

	r.frozen.Store(true)
	frozen := time.Now()
	var slowest time.Duration
	for i := range 20 {
		start := time.Now()
		if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
			t.Fatalf("request %d after the freeze: %d %s", i, code, body)
		}
		slowest = max(slowest, time.Since(start))
	}
	t.Logf("20 requests after the freeze, the slowest took %v", slowest.Round(time.Millisecond))
	if bound := gate.SilenceBound + gate.SilencePing + 2*time.Second; slowest > bound {
		t.Errorf("a request took %v, want at most %v: it waited on the silent session", slowest, bound)
	}
	s.waitGone(t, relayed, "silent")
	t.Logf("the silent session closed %v after the freeze", time.Since(frozen).Round(time.Millisecond))
	if got := promtest.ToFloat64(s.metrics.sessionsSilent); got != 1 {
		t.Errorf("tether_sessions_silent_total = %v, want 1", got)
	}
}

// A request whose session breaks before the request reached it goes
// through another session: a client killed under steady traffic costs no
// request.
func TestRequestsSurviveALostSession(t *testing.T) {
	s := startServer(t)
	be := backend(t, "alpha")
	r, relayed := s.twoSessionsOneRelayed(t, "alpha", be.URL)

	var failed, served atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, s.entry+"/", nil)
				req.Host = "alpha." + testDomain
				res, err := http.DefaultClient.Do(req)
				if err != nil || res.StatusCode != http.StatusOK {
					failed.Add(1)
				} else {
					served.Add(1)
				}
				if err == nil {
					_, _ = io.Copy(io.Discard, res.Body)
					_ = res.Body.Close()
				}
			}
		})
	}
	testutil.WaitFor(t, 10*time.Second, func() error { // traffic on both sessions before the cut
		if n := served.Load(); n < 100 {
			return fmt.Errorf("%d requests served", n)
		}
		return nil
	})
	r.cut()
	atCut := served.Load()
	s.waitGone(t, relayed, "lost")
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := served.Load() - atCut; n < 100 {
			return fmt.Errorf("%d requests served since the cut", n)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	t.Logf("%d requests served, %d failed", served.Load(), failed.Load())
	if n := failed.Load(); n != 0 {
		t.Errorf("%d requests failed around the lost session, want none", n)
	}
}

// startReplica starts a replica of fleet f named id, with a peer listener.
func startReplica(t testing.TB, f *fleet, k *keys, id string, mutate ...func(*Config)) *testServer {
	t.Helper()
	peer := listen(t)
	return startReplicaAt(t, f, k, id, peer, peer.Addr().String(), mutate...)
}

// startReplicaAt starts a replica of fleet f named id, listening for peers
// on peer and telling the other replicas to reach it at advertise.
func startReplicaAt(t testing.TB, f *fleet, k *keys, id string, peer net.Listener, advertise string, mutate ...func(*Config)) *testServer {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "peer-secret")
	writeFile(t, secret, peerSecretForTests)
	reg := f.replica(id, advertise)
	return startServerWith(t, serverSetup{keys: k, log: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), opts: []Option{WithRegistry(reg)}, peer: peer},
		append([]func(*Config){func(c *Config) { c.ReplicaID, c.PeerSecretFile = id, secret }}, mutate...)...)
}

const peerSecretForTests = "fleet-secret-0123456789"

// A replica forwards a request for a tunnel it does not serve to the one
// that does: the answer, the caller's address in X-Forwarded-For, and a
// streamed response pass as they do locally.
func TestForwardBetweenReplicas(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	b := startReplica(t, f, k, "b")
	release := make(chan struct{})
	be := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			<-release
			_, _ = io.WriteString(w, "data: second\n\n")
			return
		}
		fmt.Fprintf(w, "alpha %s xff=%s peer-miss=%q", r.URL.Path, r.Header.Get("X-Forwarded-For"), r.Header.Get(peerMissHeader))
	}))
	a.runClient(t, "alpha", a.tunnel, 1, be.URL)
	a.waitSessions(t, "alpha", 1)
	b.waitHolders(t, "alpha", 1)

	code, body, _ := b.get(t, "alpha", "/x")
	if code != http.StatusOK || body != `alpha /x xff=127.0.0.1 peer-miss=""` {
		t.Errorf("through replica b: %d %q, want alpha's answer, the caller's address and no peer miss mark", code, body)
	}
	if got := promtest.ToFloat64(b.metrics.forwarded.WithLabelValues("ok")); got != 1 {
		t.Errorf("b: tether_peer_forwarded_total{result=ok} = %v, want 1", got)
	}
	if got := promtest.ToFloat64(a.metrics.peerServed); got != 1 {
		t.Errorf("a: tether_peer_requests_total = %v, want 1", got)
	}

	// A streamed answer arrives as it is written, not when it ends.
	req, _ := http.NewRequest(http.MethodGet, b.entry+"/stream", nil)
	req.Host = "alpha." + testDomain
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || line != "data: first\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(rest), "data: second") {
		t.Errorf("the rest of the stream: %q", rest)
	}
}

// A holder that cannot be connected to (it died, and the registry has not
// noticed yet) is passed over for one that can.
func TestForwardSkipsADeadHolder(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	b := startReplica(t, f, k, "b")
	a.runClient(t, "alpha", a.tunnel, 1, backend(t, "alpha").URL)
	a.waitSessions(t, "alpha", 1)
	dead := f.replica("0-dead", testutil.ClosedAddr(t))
	dead.Hold("alpha")
	if got := len(b.registry.Holders("alpha")); got != 2 {
		t.Fatalf("b sees %d holders, want the dead one and a", got)
	}
	for i := range 4 {
		if code, body, _ := b.get(t, "alpha", "/"); code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	if got := promtest.ToFloat64(b.metrics.forwarded.WithLabelValues("unreachable")); got < 1 {
		t.Errorf("tether_peer_forwarded_total{result=unreachable} = %v, want the dead holder tried at least once", got)
	}
}

// A holder that answers it no longer serves the tunnel (a drain moved the
// client away, or the registry lags behind) is passed over like a dead one,
// and when it was the only one the request waits for the client to
// reconnect, as it does for a tunnel no replica holds, instead of answering
// 503 at once.
func TestForwardWaitsWhenTheHolderNoLongerServes(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	b := startReplica(t, f, k, "b")
	b.registry.Hold("alpha") // b is listed, with no session of alpha
	if got := a.registry.Holders("alpha"); len(got) != 1 || got[0].Replica != "b" {
		t.Fatalf("a sees holders %v, want b alone", got)
	}
	type result struct {
		code int
		body string
	}
	done := make(chan result, 1)
	go func() {
		code, body, _ := a.get(t, "alpha", "/")
		done <- result{code, body}
	}()
	// The request reached b, which missed it; it now waits at a.
	missed := a.metrics.forwarded.WithLabelValues("missed")
	testutil.WaitFor(t, 10*time.Second, func() error {
		select {
		case r := <-done:
			t.Fatalf("answered %d %q before the tunnel's client connected; want the request to wait for it", r.code, r.body)
		default:
		}
		if n := promtest.ToFloat64(missed); n < 1 {
			return fmt.Errorf("tether_peer_forwarded_total{result=missed} = %v", n)
		}
		return nil
	})
	a.runClient(t, "alpha", a.tunnel, 1, backend(t, "alpha").URL)
	r := <-done
	if r.code != http.StatusOK || !strings.HasPrefix(r.body, "alpha /") {
		t.Errorf("a request whose only holder no longer served the tunnel: %d %q, want alpha's answer once its client connected", r.code, r.body)
	}
}

// A request for a tunnel no replica serves waits a moment for one: a client
// that is reconnecting gets it; otherwise 503 tunnel_down, quickly.
func TestRequestWaitsForAReconnectingClient(t *testing.T) {
	s := startServer(t)
	start := time.Now()
	code, _, h := s.get(t, "alpha", "/")
	if took := time.Since(start); code != http.StatusServiceUnavailable || h.Get(proxy.ErrorHeader) != "tunnel_down" || took > tunnelWait+time.Second {
		t.Errorf("no client: %d %q after %v, want 503 tunnel_down within %v", code, h.Get(proxy.ErrorHeader), took, tunnelWait+time.Second)
	}

	type result struct {
		code int
		body string
	}
	done := make(chan result, 1)
	wrote := make(chan struct{})
	go func() {
		req, _ := http.NewRequest(http.MethodGet, s.entry+"/", nil)
		req.Host = "alpha." + testDomain
		req = req.WithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { close(wrote) },
		}))
		code, body, _ := do(t, req)
		done <- result{code, body}
	}()
	<-wrote // the request is at the entry, waiting, when the client comes
	s.runClient(t, "alpha", s.tunnel, 1, backend(t, "alpha").URL)
	r := <-done
	if r.code != http.StatusOK || !strings.HasPrefix(r.body, "alpha /") {
		t.Errorf("a request made while the client connected: %d %q, want alpha's answer", r.code, r.body)
	}
}

// balancer is a round-robin TCP balancer in front of the replicas' tunnel
// ports: each connection goes to the next target that accepts it, as an L4
// load balancer retries elsewhere.
type balancer struct {
	ln      net.Listener
	targets []string
	next    atomic.Uint32
}

func newBalancer(t testing.TB, targets ...string) *balancer {
	b := &balancer{ln: listen(t), targets: targets}
	var conns sync.WaitGroup
	go func() {
		for {
			in, err := b.ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() { b.serve(in) })
		}
	}()
	t.Cleanup(func() { _ = b.ln.Close(); conns.Wait() })
	return b
}

func (b *balancer) addr() string { return b.ln.Addr().String() }

func (b *balancer) serve(in net.Conn) {
	defer in.Close()
	start := int(b.next.Add(1))
	for i := range b.targets {
		out, err := net.DialTimeout("tcp", b.targets[(start+i)%len(b.targets)], time.Second)
		if err != nil {
			continue
		}
		defer out.Close()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
		go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
		<-done
		return
	}
}

// A replica that drains loses no request: its client moves to another
// replica (make-before-break), requests forwarded to it finish, and once the
// tunnel is served elsewhere no new request reaches it.
func TestDrainMovesClientsWithoutLosingRequests(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	shutdown := func(c *Config) { c.ShutdownTimeout = 10 * time.Second }
	a := startReplica(t, f, k, "a", shutdown)
	b := startReplica(t, f, k, "b", shutdown)
	lb := newBalancer(t, a.tunnel, b.tunnel)
	b.runClient(t, "alpha", lb.addr(), 1, backend(t, "alpha").URL)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if len(a.members.sessionsOf("alpha"))+len(b.members.sessionsOf("alpha")) != 1 {
			return errors.New("alpha has no session yet")
		}
		return nil
	})
	// Drain the replica that holds the session; requests go through the
	// other, which forwards them until the session has moved to it.
	holder, other := a, b
	if len(b.members.sessionsOf("alpha")) == 1 {
		holder, other = b, a
	}
	other.waitHolders(t, "alpha", 1)

	var failed, served atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, body := getQuietly(other.entry, "alpha")
				if code != http.StatusOK {
					failed.Add(1)
					t.Errorf("during the drain: %d %s", code, body)
					continue
				}
				served.Add(1)
			}
		})
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if served.Load() < 50 {
			return errors.New("warming up")
		}
		return nil
	})
	// The drain gives up moving clients at half its timeout; the client
	// must have moved well before that.
	drained := time.Now()
	stopped := make(chan struct{})
	go func() { holder.stop(); close(stopped) }()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if len(other.members.sessionsOf("alpha")) != 1 || len(holder.members.sessionsOf("alpha")) != 0 {
			return errors.New("the session has not moved to the other replica")
		}
		return nil
	})
	moved := time.Since(drained)
	<-stopped
	atDrained := served.Load()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if served.Load() < atDrained+50 {
			return errors.New("serving after the drain")
		}
		return nil
	})
	close(stop)
	wg.Wait()
	t.Logf("the client moved in %v; %d requests served, %d failed", moved.Round(time.Millisecond), served.Load(), failed.Load())
	if giveUp := 5 * time.Second; moved >= giveUp {
		t.Errorf("the client moved after %v, when the drain had given up moving clients (half its 10s timeout)", moved)
	}
}

// getQuietly sends GET / for tunnel name to entry and returns the status
// and body; a transport error is status 0.
func getQuietly(entry, name string) (int, string) {
	req, _ := http.NewRequest(http.MethodGet, entry+"/", nil)
	req.Host = name + "." + testDomain
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// Through a replica that forwards, a websocket upgrade and a large upload
// pass as they do locally.
func TestForwardedWebsocketAndLargeBody(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	b := startReplica(t, f, k, "b")
	be := upgradeEcho(t)
	a.runClient(t, "alpha", a.tunnel, 1, be.URL)
	a.waitSessions(t, "alpha", 1)
	b.waitHolders(t, "alpha", 1)

	const size = 16 << 20
	req, _ := http.NewRequest(http.MethodPost, b.entry+"/upload", io.LimitReader(zeroes{}, size))
	req.Host = "alpha." + testDomain
	req.ContentLength = size
	if code, body, _ := do(t, req); code != http.StatusOK || body != fmt.Sprintf("received %d bytes, <nil>", size) {
		t.Errorf("a 16 MiB upload through replica b: %d %q", code, body)
	}

	ws := upgrade(t, b.entry, "alpha")
	defer ws.Close()
	ws.echo(t, "ping one", "ping two")
}

// upgradeEcho is an upstream that switches a websocket upgrade to an echo
// of what the caller sends, and answers any other request with the size of
// its body.
func upgradeEcho(t testing.TB) *httptestServer {
	return newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			_ = brw.Flush()
			_, _ = io.Copy(conn, brw) // echo until the caller closes
			return
		}
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "received %d bytes, %v", n, err)
	}))
}

// upgraded is a websocket connection through the public entry.
type upgraded struct {
	net.Conn
	br *bufio.Reader
}

// upgrade opens a websocket to tunnel name through entry.
func upgrade(t testing.TB, entry, name string) *upgraded {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(entry, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: "+name+"."+testDomain+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		_ = conn.Close()
		t.Fatalf("websocket upgrade for %s through %s: %v %v", name, entry, res, err)
	}
	return &upgraded{Conn: conn, br: br}
}

// echo sends each message and checks that it comes back.
func (u *upgraded) echo(t testing.TB, msgs ...string) {
	t.Helper()
	for _, msg := range msgs {
		if _, err := io.WriteString(u, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(u.br, got); err != nil || string(got) != msg {
			t.Fatalf("echo of %q through the upgraded connection: %q, %v", msg, got, err)
		}
	}
}

// zeroes is an endless reader of zero bytes.
type zeroes struct{}

func (zeroes) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
