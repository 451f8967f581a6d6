package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
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
)

// runClient runs a tether client for tunnel name against server (a tunnel
// address, or a balancer's) with the given connections, whose "/" route
// goes to upstream. It returns a function that stops the client.
func (s *testServer) runClient(t testing.TB, name, server string, connections int, upstream string) (stop func()) {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, s.keys.token(t, name, time.Hour))
	route, err := proxy.ParseRoute("/=" + upstream)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Config{
		Server: server, TokenFile: tokenFile, Routes: []proxy.Route{route}, Connections: connections,
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

// waitSessions waits until tunnel name has n sessions serving here.
func (s *testServer) waitSessions(t testing.TB, name string, n int) []*Session {
	t.Helper()
	var serving []*Session
	testutil.WaitFor(t, 10*time.Second, func() error {
		serving = nil
		for _, sess := range s.sessions.sessionsOf(name) {
			if _, ok := sess.serving(); ok {
				serving = append(serving, sess)
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
// (nothing passes, nothing closes) or cut.
type relay struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
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
		go r.pump(in, out)
		go r.pump(out, in)
	}
}

func (r *relay) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !r.frozen.Load() { // frozen: swallowed, the path is dark

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

// cut closes every relayed connection.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

// Requests are spread over the sessions of a tunnel.
func TestRequestsSpreadOverSessions(t *testing.T) {
	s := startServer(t)
	s.runClient(t, "alpha", s.tunnel, 2, backend(t, "alpha").URL)
	sessions := s.waitSessions(t, "alpha", 2)
	for range 20 {
		if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
			t.Fatalf("got %d %s", code, body)
		}
	}
	for _, sess := range sessions {
		if n := sess.Info().Requests; n < 5 {
			t.Errorf("session %s served %d of 20 requests, want them spread over both", sess.id, n)
		}
	}
}

// A session whose path went dark (nothing passes, nothing closes) costs a
// request a few seconds at most while another session serves the tunnel:
// a dial through it is given up after a ping goes unanswered, and a
// request written on one of its pooled streams is freed when the session
// closes for its silence.
func TestSilentSessionIsPassedOver(t *testing.T) {
	s := startServer(t)
	be := backend(t, "alpha")
	r := newRelay(t, s.tunnel)
	s.runClient(t, "alpha", r.addr(), 1, be.URL)
	s.waitSessions(t, "alpha", 1)
	s.runClient(t, "alpha", s.tunnel, 1, be.URL)
	s.waitSessions(t, "alpha", 2)
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
	if bound := silenceBound + silencePing + 2*time.Second; slowest > bound {
		t.Errorf("a request took %v, want at most %v: it waited on the silent session", slowest, bound)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if len(s.sessions.sessionsOf("alpha")) != 1 {
			return errors.New("the silent session is still open")
		}
		return nil
	})
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
	r := newRelay(t, s.tunnel)
	s.runClient(t, "alpha", r.addr(), 1, be.URL)
	s.waitSessions(t, "alpha", 1)
	s.runClient(t, "alpha", s.tunnel, 1, be.URL)
	s.waitSessions(t, "alpha", 2)

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
	testutil.WaitFor(t, 10*time.Second, func() error {
		if len(s.sessions.sessionsOf("alpha")) != 1 {
			return errors.New("the lost session is still listed")
		}
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
	secret := filepath.Join(t.TempDir(), "peer-secret")
	writeFile(t, secret, peerSecretForTests)
	peer := listen(t)
	reg := f.replica(id, peer.Addr().String())
	return startServerWith(t, serverSetup{keys: k, log: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), opts: []Option{WithRegistry(reg)}, peer: peer},
		append([]func(*Config){func(c *Config) { c.ReplicaID, c.PeerSecretFile = id, secret }}, mutate...)...)
}

const peerSecretForTests = "fleet-secret-0123456789"
