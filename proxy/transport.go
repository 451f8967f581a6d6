package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultDialTimeout is the dial timeout when Options.DialContext is zero.
const DefaultDialTimeout = 5 * time.Second

// Connection settings of the upstream transports. They are fixed because
// upstreams are in-cluster services one hop away: none needs tuning.
const (
	tlsHandshakeTimeout = 10 * time.Second
	// idleConnTimeout is how long an idle connection (a tunnel stream) is
	// kept for the next request: an idle tunnel holds no streams after it.
	idleConnTimeout = 30 * time.Second
	// maxIdleConns bounds the idle connections kept per upstream. It is
	// large because a burst of concurrent requests would otherwise pay a
	// new dial for each connection beyond it at the next burst: the router
	// is a hop that many concurrent requests cross.
	maxIdleConns   = 256
	tcpKeepAlive   = 30 * time.Second
	expectContinue = time.Second
	// maxInformational bounds the 1xx responses before the final one.
	maxInformational = 32
	// bufSize is the size of the pooled buffers that read responses and
	// write requests. A response is read through one for its head and its
	// chunks' size lines; its body's reads of at least bufSize into an empty
	// reader go straight to the connection.
	bufSize = 4 << 10
	// waiterBufSize is the size of the reader of a connection that is a
	// ReadyWaiter. A quiet response waits in the connection rather than in
	// the reader, which is then empty, so a copy's reads bypass it whatever
	// its size: a smaller one costs a stream less. A reader that a wait
	// fills is read from next, in pieces of its size at most, which would
	// keep a bulk copy in small pieces: other connections keep bufSize.
	waiterBufSize = 1 << 10
)

// DialFunc dials an upstream; it has the shape of net.Dialer.DialContext.
// The context bounds only the dial, not the connection's later use.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// transportKey identifies upstreams that can share connections: same scheme,
// same address to dial (so "http://a" and "http://a:80" share), same TLS
// verification.
type transportKey struct {
	scheme   string
	addr     string // Route.DialAddr
	insecure bool
}

func keyOf(r Route) transportKey {
	return transportKey{
		scheme:   r.Upstream.Scheme,
		addr:     r.DialAddr(),
		insecure: r.Upstream.Scheme == "https" && r.InsecureSkipVerify,
	}
}

// newDialFunc returns opts' dialer bounded by its dial timeout.
func newDialFunc(opts Options) DialFunc {
	timeout := opts.DialTimeout
	if timeout == 0 {
		timeout = DefaultDialTimeout
	}
	if opts.DialContext == nil {
		d := &net.Dialer{Timeout: timeout, KeepAlive: tcpKeepAlive}
		return d.DialContext
	}
	dial := opts.DialContext
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return dial(ctx, network, addr)
	}
}

// transport sends HTTP/1.1 requests to one upstream and keeps its
// connections (through the tunnel, streams of the session) for the next
// requests. It dials k.addr and nothing else.
//
// It does what http.Transport did for the router, without its cost: no
// goroutine per connection, no hand-off between goroutines per request. The
// request's own goroutine writes the request and reads the response; a
// request with a body has one more goroutine that writes the body, so that
// the upstream may answer while it still streams in. A connection goes back
// to the pool only once its response body was read to the end and both
// sides keep it alive; it is closed otherwise, and after idleConnTimeout
// unused.
//
// It is at least as strict as http.Transport toward what an upstream
// answers: response heads are bounded (MaxHeadBytes, MaxHeadFields, the
// 1xx heads of an exchange counted with the final one), a 101 switches
// protocols only when the request asked for that switch, and a pooled
// connection on which anything arrives while it is idle (an extra
// response, a body after a HEAD answer, the upstream's close) is closed at
// once by the goroutine that watches it, and never handed to a request.
// Closing a tunnel stream resets it (tunnel/server's tunnelConn), so that
// nothing the upstream sends after stays buffered.
//
// A request that is safe to repeat (GET, HEAD, OPTIONS, TRACE, or one with
// an Idempotency-Key, all without a body) and that fails on a pooled
// connection before any byte of the response arrived is sent once more, on
// a new connection: the upstream may have closed the kept-alive connection
// as the request went out. So is a request without a body that failed
// before any of it was written.
type transport struct {
	addr      string
	dial      DialFunc
	tlsConfig *tls.Config // nil for http

	mu     sync.Mutex
	idle   []*persistConn // least recently used first
	reaper *time.Timer    // closes connections idle for idleConnTimeout
	reaps  bool           // reaper is due to run
}

// newTransport returns the transport for the upstreams of key k.
func newTransport(k transportKey, dial DialFunc) *transport {
	t := &transport{addr: k.addr, dial: dial}
	if k.scheme == "https" {
		host, _, _ := net.SplitHostPort(k.addr)
		t.tlsConfig = &tls.Config{
			MinVersion: tls.VersionTLS12,
			ServerName: host,
			// The route's operator asked for this, for an in-cluster
			// service with a self-signed certificate.
			InsecureSkipVerify: k.insecure, //nolint:gosec // opt-in per route
		}
	}
	return t
}

// errHeaderTimeout is the cause that ends a request whose upstream sent no
// response headers within the route's timeout.
var errHeaderTimeout = errors.New("no response headers within the route's timeout")

// roundTrip sends req and returns the upstream's response, giving up when
// no response headers came within timeout (0: none) of the request being
// written, body included. 1xx responses before the final one are written
// to informational (nil: dropped) before roundTrip returns. req.Host must
// be empty: the upstream sees the host of req.URL.
func (t *transport) roundTrip(req *http.Request, timeout time.Duration, informational http.ResponseWriter) (*http.Response, error) {
	ctx := req.Context()
	pc, err := t.getConn(ctx)
	if err != nil {
		return nil, err
	}
	ex := &exchange{pc: pc, req: req, informational: informational}
	res, err := ex.run(timeout)
	if err != nil && ex.retryable(err) && ctx.Err() == nil {
		if pc, err2 := t.dialConn(ctx); err2 != nil {
			err = err2
		} else {
			ex = &exchange{pc: pc, req: req, informational: informational}
			res, err = ex.run(timeout)
		}
	}
	return res, err
}

// getConn returns an idle connection on which nothing arrived while it
// was idle, or dials one.
func (t *transport) getConn(ctx context.Context) (*persistConn, error) {
	for {
		pc := t.popIdle()
		if pc == nil {
			return t.dialConn(ctx)
		}
		if pc.unwatch() {
			pc.br = pc.getReader()
			return pc, nil
		}
		pc.close()
	}
}

// dialConn dials a new connection, with a TLS handshake for https.
func (t *transport) dialConn(ctx context.Context) (*persistConn, error) {
	raw, err := t.dial(ctx, "tcp", t.addr)
	if err != nil {
		return nil, err
	}
	conn := raw
	if t.tlsConfig != nil {
		tc := tls.Client(raw, t.tlsConfig)
		hctx, cancel := context.WithTimeout(ctx, tlsHandshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			raw.Close()
			return nil, fmt.Errorf("tls handshake with %s: %w", t.addr, err)
		}
		conn = tc
	}
	pc := &persistConn{t: t, raw: raw, conn: conn}
	pc.waiter, _ = conn.(ReadyWaiter)
	if pc.rawWaiter, _ = raw.(ReadyWaiter); pc.rawWaiter == nil {
		pc.watched = make(chan struct{}, 1)
	}
	pc.br = pc.getReader()
	return pc, nil
}

// popIdle takes the most recently used idle connection, nil if none.
func (t *transport) popIdle() *persistConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.idle)
	if n == 0 {
		return nil
	}
	pc := t.idle[n-1]
	t.idle[n-1] = nil
	t.idle = t.idle[:n-1]
	pc.pooled = false
	return pc
}

// A Shrinker is a connection that keeps buffers sized by the most it had
// to hold and can give them back: a tunnel stream, whose receive buffer
// yamux grows to the most data that waited unread (up to the stream's
// window, megabytes) and keeps. The transport shrinks one each time it
// becomes idle, so that an idle stream does not keep what a large response
// made it hold.
type Shrinker interface {
	Shrink()
}

// putIdle keeps pc, whose last response was read to its end, for the next
// request, and watches it while it waits.
func (t *transport) putIdle(pc *persistConn) {
	if pc.br.Buffered() > 0 {
		// The upstream sent more than its response.
		pc.close()
		return
	}
	putReader(pc.br)
	pc.br = nil
	if s, ok := pc.raw.(Shrinker); ok {
		s.Shrink()
	}
	pc.idleAt = time.Now()
	pc.reused = true
	var evicted *persistConn
	t.mu.Lock()
	if len(t.idle) >= maxIdleConns {
		evicted = t.idle[0]
		evicted.pooled = false
		n := copy(t.idle, t.idle[1:])
		t.idle[n] = nil
		t.idle = t.idle[:n]
	}
	pc.pooled = true
	t.idle = append(t.idle, pc)
	// Watched from before anyone may take it.
	pc.watch()
	if !t.reaps {
		t.reaps = true
		if t.reaper == nil {
			t.reaper = time.AfterFunc(idleConnTimeout, t.reap)
		} else {
			t.reaper.Reset(idleConnTimeout)
		}
	}
	t.mu.Unlock()
	if evicted != nil {
		evicted.close()
	}
}

// drop takes pc out of the pool and reports whether it was there: whoever
// takes it out closes it.
func (t *transport) drop(pc *persistConn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !pc.pooled {
		return false
	}
	pc.pooled = false
	i := slices.Index(t.idle, pc)
	t.idle = slices.Delete(t.idle, i, i+1)
	return true
}

// reap closes the connections idle for idleConnTimeout, and runs again
// when the next one will be.
func (t *transport) reap() {
	now := time.Now()
	t.mu.Lock()
	n := 0
	for n < len(t.idle) && now.Sub(t.idle[n].idleAt) >= idleConnTimeout {
		n++
	}
	expired := make([]*persistConn, n)
	copy(expired, t.idle)
	for _, pc := range expired {
		pc.pooled = false
	}
	rest := copy(t.idle, t.idle[n:])
	clear(t.idle[rest:])
	t.idle = t.idle[:rest]
	if rest > 0 {
		t.reaper.Reset(t.idle[0].idleAt.Add(idleConnTimeout).Sub(now))
	} else {
		t.reaps = false
	}
	t.mu.Unlock()
	for _, pc := range expired {
		pc.close()
	}
}

// closeIdle closes the idle connections. Connections in use are closed when
// their request ends, unless they return to the pool.
func (t *transport) closeIdle() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	for _, pc := range idle {
		pc.pooled = false
	}
	if t.reaper != nil {
		t.reaper.Stop()
	}
	t.reaps = false
	t.mu.Unlock()
	for _, pc := range idle {
		pc.close()
	}
}

// idleCount is the number of idle connections.
func (t *transport) idleCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.idle)
}

// persistConn is one connection to the upstream, used by one request at a
// time.
type persistConn struct {
	t      *transport
	raw    net.Conn    // as dialed
	conn   net.Conn    // raw, or TLS over it
	waiter ReadyWaiter // conn, if it can wait without reading; else nil
	// rawWaiter is raw, if it can wait without reading (a tunnel stream,
	// under TLS or not); else nil.
	rawWaiter ReadyWaiter
	br        *bufio.Reader // reads conn through the persistConn; nil while idle
	idleAt    time.Time     // when it became idle
	reused    bool          // it has carried a request before
	pooled    bool          // in t.idle; guarded by t.mu

	// Counters of the current exchange, for its retry: what was read by
	// the request's goroutine, written by whichever goroutine writes.
	nread, nwritten int64
	// readErr is the last error of a read of the current exchange: a
	// response that fails to parse without one is malformed.
	readErr error
	// heads follows the response heads of the current exchange.
	heads headCount

	// The watch of the connection while it is idle (watch.go).
	watchState atomic.Int32  // of a waiting watch
	epoch      atomic.Uint64 // counts the connection's idle periods
	stopping   atomic.Bool   // unwatch stops a reading watch
	watched    chan struct{} // receives once each reading watch has returned
	peek       [1]byte
	peekN      int   // what a reading watch read
	peekErr    error // and the error it returned
}

// Read reads from the connection, for br, and follows the response heads.
func (pc *persistConn) Read(p []byte) (int, error) {
	if pc.heads.err != nil {
		return 0, pc.heads.err
	}
	n, err := pc.conn.Read(p)
	pc.nread += int64(n)
	if err != nil {
		pc.readErr = err
	}
	if herr := pc.heads.read(p[:n]); herr != nil {
		return 0, herr
	}
	return n, err
}

// Write writes to the connection, for the request's writer.
func (pc *persistConn) Write(p []byte) (int, error) {
	n, err := pc.conn.Write(p)
	pc.nwritten += int64(n)
	return n, err
}

// close closes the connection. Its reader is not pooled: a read may still be
// under way.
func (pc *persistConn) close() { _ = pc.conn.Close() }

var (
	readers       = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, bufSize) }}
	waiterReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, waiterBufSize) }}
	writers       = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, bufSize) }}
)

// getReader lends the reader for the connection's next response.
func (pc *persistConn) getReader() *bufio.Reader {
	pool := &readers
	if pc.waiter != nil {
		pool = &waiterReaders
	}
	br := pool.Get().(*bufio.Reader)
	br.Reset(pc)
	return br
}

func putReader(br *bufio.Reader) {
	pool := &readers
	if br.Size() == waiterBufSize {
		pool = &waiterReaders
	}
	br.Reset(nil)
	pool.Put(br)
}

func getWriter(w io.Writer) *bufio.Writer {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(w)
	return bw
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	writers.Put(bw)
}
