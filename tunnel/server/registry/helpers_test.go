package registry

import (
	"context"
	"fmt"
	"io"
	"net"
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

// redisServer is a redis-server the test started (testutil.StartRedis),
// with what the registry tests look at it with.
type redisServer struct{ *testutil.RedisServer }

// startRedis starts redis-server with extra arguments; the test fails if it
// is not installed.
func startRedis(t testing.TB, extra ...string) redisServer {
	t.Helper()
	return redisServer{testutil.StartRedis(t, extra...)}
}

// client is a plain client of the server, to look at the keys.
func (s redisServer) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.Password, TLSConfig: s.TLS, DialerRetries: 1, MaxRetries: -1})
}

// keys returns the server's keys, sorted.
func (s redisServer) keys(t testing.TB) []string {
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
