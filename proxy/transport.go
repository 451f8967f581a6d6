package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultDialTimeout is the dial timeout when Options.DialTimeout is zero.
const DefaultDialTimeout = 5 * time.Second

// Connection settings of the upstream transports. They are fixed because
// upstreams are in-cluster services one hop away: none needs tuning.
const (
	tlsHandshakeTimeout = 10 * time.Second
	idleConnTimeout     = 90 * time.Second
	// maxIdleConnsPerHost is large because http.Transport's default of 2
	// closes every connection beyond the second after each burst, and the
	// next burst pays a new dial for each: the router is a hop that many
	// concurrent requests cross.
	maxIdleConnsPerHost = 256
	tcpKeepAlive        = 30 * time.Second
	expectContinue      = time.Second
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

// newTransport returns the transport for one upstream: it dials k.addr and
// nothing else.
func newTransport(k transportKey, dial DialFunc) *http.Transport {
	t := &http.Transport{
		// Upstreams are in-cluster: never send them through an egress proxy
		// named by HTTP_PROXY/HTTPS_PROXY, which NO_PROXY rarely exempts
		// short service names from.
		Proxy: nil,
		// The address http.Transport derives from the request URL is not
		// used: its own rules (IDNA, default ports) need not agree with
		// Route.DialAddr, which the tether client checks a dial against,
		// and one transport serves one address only.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dial(ctx, network, k.addr)
		},
		TLSHandshakeTimeout:   tlsHandshakeTimeout,
		IdleConnTimeout:       idleConnTimeout,
		MaxIdleConnsPerHost:   maxIdleConnsPerHost,
		ExpectContinueTimeout: expectContinue,
		// A proxy passes Accept-Encoding and bodies through untouched.
		DisableCompression: true,
	}
	// HTTP/1.1 only: websocket upgrades need it, and one hop inside the
	// cluster gains nothing from HTTP/2.
	t.Protocols = new(http.Protocols)
	t.Protocols.SetHTTP1(true)
	if k.scheme == "https" {
		t.TLSClientConfig = &tls.Config{
			MinVersion: tls.VersionTLS12,
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

// routeTransport is one route's view of its upstream's shared transport: it
// applies the route's response-header timeout and records its latency.
type routeTransport struct {
	next    http.RoundTripper
	timeout time.Duration       // 0: none
	latency prometheus.Observer // nil: no metrics
}

// RoundTrip implements http.RoundTripper.
func (t *routeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var start time.Time
	if t.latency != nil {
		start = time.Now()
	}
	var (
		res *http.Response
		err error
	)
	if t.timeout > 0 {
		res, err = t.roundTripTimeout(req)
	} else {
		res, err = t.next.RoundTrip(req)
	}
	if err == nil && t.latency != nil {
		t.latency.Observe(time.Since(start).Seconds())
	}
	return res, err
}

// roundTripTimeout runs the request under a timer that starts once the
// request, body included, has been written (httptrace WroteRequest) and
// stops when response headers arrive. http.Transport's
// ResponseHeaderTimeout would do the same, but it is per transport, where
// routes with different timeouts share one, and its error cannot be told
// apart from other timeouts without matching strings.
func (t *routeTransport) roundTripTimeout(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	hd := &headerDeadline{d: t.timeout, cancel: cancel}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: hd.wroteRequest})
	res, err := t.next.RoundTrip(req.WithContext(ctx))
	if hd.stop() {
		// The timer fired, possibly just as headers arrived; either way the
		// request's context is canceled, so the body is unusable.
		if res != nil {
			res.Body.Close()
		}
		cancel(errHeaderTimeout)
		return nil, errHeaderTimeout
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	// The context must live as long as the body: cancel it when the body is
	// closed. A 101 response's body is the upgraded connection, which
	// ReverseProxy needs to write to.
	if rwc, ok := res.Body.(io.ReadWriteCloser); ok {
		res.Body = &cancelRWBody{ReadWriteCloser: rwc, cancel: cancel}
	} else {
		res.Body = &cancelBody{ReadCloser: res.Body, cancel: cancel}
	}
	return res, nil
}

// headerDeadline is the timer of one request's response-header timeout.
type headerDeadline struct {
	d      time.Duration
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	timer *time.Timer // nil until the request is written
	done  bool        // RoundTrip returned
}

// wroteRequest starts the timer. It runs on the transport's write goroutine.
func (h *headerDeadline) wroteRequest(httptrace.WroteRequestInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done || h.timer != nil {
		return
	}
	h.timer = time.AfterFunc(h.d, h.expire)
}

func (h *headerDeadline) expire() { h.cancel(errHeaderTimeout) }

// stop ends the deadline and reports whether it had expired.
func (h *headerDeadline) stop() bool {
	h.mu.Lock()
	h.done = true
	t := h.timer
	h.mu.Unlock()
	return t != nil && !t.Stop()
}

// cancelBody cancels a request's context when its response body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// cancelRWBody is cancelBody for the read-write body of a 101 response.
type cancelRWBody struct {
	io.ReadWriteCloser
	cancel context.CancelCauseFunc
}

func (b *cancelRWBody) Close() error {
	err := b.ReadWriteCloser.Close()
	b.cancel(nil)
	return err
}

// bufSize is the size of the buffers that copy response bodies.
const bufSize = 32 << 10

// bufferPool recycles ReverseProxy's copy buffers, which it would otherwise
// allocate (32 KiB) for every response. Buffers are kept as array pointers so
// that Put does not allocate.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if buf, ok := b.p.Get().(*[bufSize]byte); ok {
		return buf[:]
	}
	return make([]byte, bufSize)
}

func (b *bufferPool) Put(buf []byte) {
	if len(buf) == bufSize {
		b.p.Put((*[bufSize]byte)(buf))
	}
}
