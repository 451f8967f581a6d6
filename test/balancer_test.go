package test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Bounds of a balancer.
const (
	balancerMaxConns    = 512             // connections relayed at once; more are closed at accept
	balancerDialTimeout = 2 * time.Second // per backend
)

// balancer is a round-robin TCP load balancer on loopback, as an L4 load
// balancer in front of server replicas: each new connection goes to the
// next backend in turn. A backend that refuses the connection (a replica
// that died, or drains and closed its listener) is skipped for the next
// one, as L4 balancers retry elsewhere; a connection that no backend takes
// is closed.
type balancer struct {
	ln       net.Listener
	backends []string
	turn     atomic.Uint32
	slots    chan struct{} // one per relayed connection
	accepted atomic.Int64
	skipped  atomic.Int64 // backends that refused a connection

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// newBalancer starts a balancer in front of backends (HOST:PORT). It stops
// when the test ends.
func newBalancer(t testing.TB, backends ...string) *balancer {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &balancer{
		ln: ln, backends: backends,
		slots: make(chan struct{}, balancerMaxConns),
		conns: make(map[net.Conn]struct{}),
	}
	b.wg.Go(b.serve)
	t.Cleanup(b.close)
	return b
}

func (b *balancer) addr() string { return b.ln.Addr().String() }

func (b *balancer) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.accepted.Add(1)
		select {
		case b.slots <- struct{}{}:
		default:
			_ = c.Close()
			continue
		}
		b.wg.Go(func() {
			defer func() { <-b.slots }()
			b.relay(c)
		})
	}
}

// relay connects c to the next backend that takes it and copies bytes
// both ways until both directions have ended.
func (b *balancer) relay(c net.Conn) {
	up := b.dial()
	if up == nil || !b.track(c, up) {
		_ = c.Close()
		if up != nil {
			_ = up.Close()
		}
		return
	}
	defer b.untrack(c, up)
	var wg sync.WaitGroup
	wg.Go(func() { pump(up, c) })
	wg.Go(func() { pump(c, up) })
	wg.Wait()
}

// dial returns a connection to the first backend, from the next in turn,
// that accepts one; nil when none does. The first connection goes to the
// first backend.
func (b *balancer) dial() net.Conn {
	start := int(b.turn.Add(1)) - 1
	for i := range b.backends {
		addr := b.backends[(start+i)%len(b.backends)]
		ctx, cancel := context.WithTimeout(context.Background(), balancerDialTimeout)
		up, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		cancel()
		if err == nil {
			return up
		}
		b.skipped.Add(1)
	}
	return nil
}

// pump copies src to dst, then half-closes dst so that the far end sees
// the end of this direction while the other may go on.
func pump(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok && err == nil {
		_ = tc.CloseWrite()
		return
	}
	// An error (a reset) ends both directions.
	_ = dst.Close()
	_ = src.Close()
}

func (b *balancer) track(cs ...net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	for _, c := range cs {
		b.conns[c] = struct{}{}
	}
	return true
}

func (b *balancer) untrack(cs ...net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
		delete(b.conns, c)
	}
}

func (b *balancer) close() {
	_ = b.ln.Close()
	b.mu.Lock()
	b.closed = true
	for c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}
