package registry

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tether-dev/tether/internal/testutil"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial to stderr; the tests read the
	// registry's own logs.
	BridgeRedisLog(zap.NewNop())
	goleak.VerifyTestMain(m)
}

// testTTL keeps the tests short: entries of a dead replica go within a
// second.
const testTTL = time.Second

// redisServer is a redis-server that a test started on a free loopback port,
// in a temp dir, without persistence: a restart brings it back empty.
type redisServer struct {
	t    testing.TB
	bin  string
	dir  string
	addr string
	args []string // extra arguments
	tls  *tls.Config
	pass string

	cmd *exec.Cmd
	out *syncBuffer
}

// startRedis starts redis-server with extra arguments; the test fails if it
// is not installed.
func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	s := newRedisServer(t, extra...)
	s.start()
	return s
}

// newRedisServer prepares a redis-server; start starts it.
func newRedisServer(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not on PATH; the registry tests need it: install it (Debian: apt-get install redis-server)")
	}
	s := &redisServer{t: t, bin: bin, dir: t.TempDir(), addr: testutil.ClosedAddr(t), args: extra, out: &syncBuffer{}}
	for i, a := range extra {
		if a == "--requirepass" {
			s.pass = extra[i+1]
		}
	}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("redis-server output:\n%s", s.out.String())
		}
	})
	return s
}

func (s *redisServer) port() string {
	_, port, _ := net.SplitHostPort(s.addr)
	return port
}

// url is the server's redis:// URL, without a password.
func (s *redisServer) url() string { return "redis://" + s.addr + "/0" }

// start starts the server and waits until it answers.
func (s *redisServer) start() {
	s.t.Helper()
	args := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--loglevel", "warning"}
	if s.tls == nil {
		args = append(args, "--port", s.port())
	} else {
		args = append(args, "--port", "0", "--tls-port", s.port())
	}
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.cmd = cmd
	c := s.client()
	defer c.Close()
	testutil.WaitFor(s.t, 10*time.Second, func() error {
		err := c.Ping(context.Background()).Err()
		if err != nil && !redis.IsAuthError(err) {
			return fmt.Errorf("redis-server not answering on %s: %w", s.addr, err)
		}
		return nil
	})
}

// kill stops the server as a crash would.
func (s *redisServer) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// client is a plain client of the server, to look at the keys.
func (s *redisServer) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr, Password: s.pass, TLSConfig: s.tls, DialerRetries: 1, MaxRetries: -1})
}

// keys returns the server's keys, sorted.
func (s *redisServer) keys(t testing.TB) []string {
	t.Helper()
	c := s.client()
	defer c.Close()
	keys, err := c.Keys(t.Context(), "*").Result()
	if err != nil {
		t.Fatalf("list keys: %v", err)
	}
	slices.Sort(keys)
	return keys
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// replica is a running Redis registry.
type replica struct {
	*Redis
	logs   *observer.ObservedLogs
	cancel context.CancelFunc
	done   chan struct{}
}

// newReplica makes the registry of replica id on url; change adjusts its
// config. It is not running yet.
func newReplica(t testing.TB, url, id, password string, change ...func(*Config)) *replica {
	t.Helper()
	cfg := Config{URL: url, Replica: id, Addr: id + ".peers.test:7443", TTL: testTTL}
	for _, f := range change {
		f(&cfg)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core)).Named(id)
	r, err := NewRedis(cfg, password, log)
	if err != nil {
		t.Fatalf("new registry %s: %v", id, err)
	}
	return &replica{Redis: r, logs: logs}
}

// start runs the registry until the test ends (or stop).
func (r *replica) start(t testing.TB) *replica {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("run %s: %v", r.cfg.Replica, err)
		}
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// runReplica makes and starts a registry.
func runReplica(t testing.TB, url, id string, change ...func(*Config)) *replica {
	t.Helper()
	return newReplica(t, url, id, "", change...).start(t)
}

// stop cancels Run and waits for it, and returns how long that took.
func (r *replica) stop(t testing.TB) time.Duration {
	t.Helper()
	start := time.Now()
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Run of %s did not return 30s after its context ended", r.cfg.Replica)
	}
	return time.Since(start)
}

// epoch is the epoch of r's own hold of tunnel.
func (r *replica) epoch(t testing.TB, tunnel string) uint64 {
	t.Helper()
	e, ok := r.table.ownEpoch(tunnel)
	if !ok {
		t.Fatalf("%s does not hold %s", r.cfg.Replica, tunnel)
	}
	return e
}

// holder is r as it appears among the holders of tunnel.
func (r *replica) holder(t testing.TB, tunnel string) Holder {
	return Holder{Replica: r.cfg.Replica, Addr: r.cfg.Addr, Epoch: r.epoch(t, tunnel)}
}

// holdersAre reports whether reg's Holders(tunnel) is want.
func holdersAre(reg Registry, tunnel string, want ...Holder) error {
	got := reg.Holders(tunnel)
	if !slices.Equal(got, want) {
		return fmt.Errorf("holders of %s: got %v, want %v", tunnel, got, want)
	}
	return nil
}

// all combines conditions for testutil.WaitFor.
func all(conds ...func() error) func() error {
	return func() error {
		var errs []string
		for _, c := range conds {
			if err := c(); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%s", strings.Join(errs, "; "))
		}
		return nil
	}
}

// partition is a TCP proxy on loopback in front of Redis that a test can
// cut as a network partition would: while cut, nothing answers — open
// connections stop relaying and new ones are accepted and held silent.
// heal closes what was held (the far end forgot those connections) and
// relays again.
type partition struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu        sync.Mutex
	cut       bool
	clients   []net.Conn // relayed connections, client side
	upstreams []net.Conn // relayed connections, Redis side
	held      []net.Conn // connections left silent
}

func newPartition(t testing.TB, target string) *partition {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range slices.Concat(p.clients, p.upstreams, p.held) {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *partition) url() string { return "redis://" + p.ln.Addr().String() + "/0" }

func (p *partition) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.held = append(p.held, c)
			p.mu.Unlock()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.clients = append(p.clients, c)
		p.upstreams = append(p.upstreams, up)
		p.mu.Unlock()
		p.wg.Go(func() { p.pump(up, c) })
		p.wg.Go(func() { p.pump(c, up) })
	}
}

// pump relays src to dst; when it ends, it closes both, unless the
// partition is cut, which keeps the client side open and silent.
func (p *partition) pump(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	p.mu.Lock()
	cut := p.cut
	p.mu.Unlock()
	if !cut {
		dst.Close()
		src.Close()
	}
}

// cutOff starts the partition.
func (p *partition) cutOff() {
	p.mu.Lock()
	p.cut = true
	ups := p.upstreams
	p.held = append(p.held, p.clients...)
	p.clients, p.upstreams = nil, nil
	p.mu.Unlock()
	for _, c := range ups {
		c.Close()
	}
}

// heal ends the partition.
func (p *partition) heal() {
	p.mu.Lock()
	p.cut = false
	held := p.held
	p.held = nil
	p.mu.Unlock()
	for _, c := range held {
		c.Close()
	}
}

// quietFor fails the test if cond does not hold at every check during d:
// for what must not change while time passes.
func quietFor(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	end := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		if err := cond(); err != nil {
			t.Fatalf("after %v of %v: %v", d-time.Until(end), d, err)
		}
		<-tick.C
	}
}

// isUp reports whether r's status is up.
func isUp(r Registry) error {
	if st := r.Status(); !st.Up {
		return fmt.Errorf("status: got %+v, want up", st)
	}
	return nil
}
