package test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// relay is a TCP relay on loopback in front of a target. Freeze makes every
// connection open at that moment stop forwarding in both directions without
// closing either side, like a NAT that silently dropped its state or a
// network path that went dark; connections made later forward normally.
type relay struct {
	ln       net.Listener
	target   string
	accepted atomic.Int64

	mu     sync.Mutex
	cond   *sync.Cond
	closed bool
	pairs  map[*relayPair]struct{}
	wg     sync.WaitGroup
}

type relayPair struct {
	client, upstream net.Conn
	frozen           bool // guarded by relay.mu
}

func newRelay(t testing.TB, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, pairs: make(map[*relayPair]struct{})}
	r.cond = sync.NewCond(&r.mu)
	r.wg.Go(r.serve)
	t.Cleanup(r.close)
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.accepted.Add(1)
		r.wg.Go(func() { r.handle(c) })
	}
}

func (r *relay) handle(c net.Conn) {
	u, err := net.Dial("tcp", r.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p := &relayPair{client: c, upstream: u}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		_ = c.Close()
		_ = u.Close()
		return
	}
	r.pairs[p] = struct{}{}
	r.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { r.pipe(p, u, c) })
	wg.Go(func() { r.pipe(p, c, u) })
	wg.Wait()
	r.mu.Lock()
	delete(r.pairs, p)
	r.mu.Unlock()
}

// pipe copies src to dst while the pair is not frozen. Bytes read while it
// is frozen are held until it thaws (or the relay closes).
func (r *relay) pipe(p *relayPair, dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		if !r.waitThawed(p) {
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			if !r.waitThawed(p) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitThawed blocks while p is frozen; false when the relay closed.
func (r *relay) waitThawed(p *relayPair) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p.frozen && !r.closed {
		r.cond.Wait()
	}
	return !r.closed
}

// freeze stops every open connection; it returns how many it froze.
func (r *relay) freeze() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range r.pairs {
		p.frozen = true
	}
	return len(r.pairs)
}

// open returns the number of connections the relay carries.
func (r *relay) open() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pairs)
}

// thaw lets frozen connections forward again.
func (r *relay) thaw() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range r.pairs {
		p.frozen = false
	}
	r.cond.Broadcast()
}

func (r *relay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for p := range r.pairs {
		_ = p.client.Close()
		_ = p.upstream.Close()
	}
	r.cond.Broadcast()
	r.mu.Unlock()
	r.wg.Wait()
}
