package client

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
)

const (
	// dialRequestTimeout bounds reading the server's dial request.
	dialRequestTimeout = 10 * time.Second
	// upstreamDialTimeout matches the router's dial bound on the server.
	upstreamDialTimeout = proxy.DefaultDialTimeout
)

// upstreams connects the server to the routes' upstreams, and to nothing
// else: the address in a dial request must be one of theirs.
type upstreams struct {
	allowed map[string]string // proxy.Route.DialAddr -> adapter name
	dial    proxy.DialFunc
	dials   *prometheus.CounterVec
}

func newUpstreams(routes []proxy.Route, reg prometheus.Registerer) *upstreams {
	d := &net.Dialer{Timeout: upstreamDialTimeout, KeepAlive: 30 * time.Second}
	u := &upstreams{
		allowed: make(map[string]string),
		dial:    d.DialContext,
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_client_upstream_dials_total",
			Help: "Connections the server asked for to a route's upstream, by adapter and result (ok, refused, not_found, unreachable, timeout, not_allowed, failed).",
		}, []string{"adapter", "result"}),
	}
	// The server's router dials exactly the DialAddr of the route it picked.
	for _, r := range routes {
		u.allowed[r.DialAddr()] = r.Adapter
		// Every result exists from the start, at 0, so that an alert on a
		// rise of failures sees the first.
		for _, result := range dialResults {
			u.dials.WithLabelValues(r.Adapter, result)
		}
	}
	u.dials.WithLabelValues("", dialNotAllowed)
	reg.MustRegister(u.dials)
	return u
}

// serve answers one dial request on a server-opened stream and then copies
// bytes between the stream and the upstream until both directions end.
func (u *upstreams) serve(stream net.Conn, log *zap.Logger) {
	defer stream.Close()
	_ = stream.SetReadDeadline(time.Now().Add(dialRequestTimeout))
	addr, err := tunnel.ReadDialRequest(stream)
	if err != nil {
		log.Debug("unreadable dial request", zap.Error(err))
		return
	}
	_ = stream.SetReadDeadline(time.Time{})
	adapter, ok := u.allowed[addr]
	if !ok {
		// Only a server that disagrees with this client about its routes
		// asks for another address; never connect to it.
		u.dials.WithLabelValues("", dialNotAllowed).Inc()
		log.Warn("refused to connect to an address that is not a route's upstream", zap.String("upstream", addr))
		_ = tunnel.WriteDialReply(stream, tunnel.DialNotAllowed, "not one of this client's route upstreams")
		return
	}
	conn, err := u.dial(context.Background(), "tcp", addr)
	if err != nil {
		code, result := dialCode(err)
		u.dials.WithLabelValues(adapter, result).Inc()
		log.Warn("connect to upstream failed", zap.String("adapter", adapter), zap.String("upstream", addr), zap.Error(err))
		_ = tunnel.WriteDialReply(stream, code, err.Error())
		return
	}
	defer conn.Close()
	u.dials.WithLabelValues(adapter, "ok").Inc()
	if err := tunnel.WriteDialReply(stream, tunnel.DialOK, ""); err != nil {
		return
	}
	splice(stream, conn)
}

// dialResults are the results of tether_client_upstream_dials_total of a
// route's adapter; dialNotAllowed is that of an address no route has.
var dialResults = []string{"ok", "refused", "not_found", "unreachable", "timeout", "failed"}

const dialNotAllowed = "not_allowed"

// dialCode classifies a dial error for the server, which explains it to the
// caller.
func dialCode(err error) (tunnel.DialCode, string) {
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return tunnel.DialRefused, "refused"
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return tunnel.DialNotFound, "not_found"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return tunnel.DialUnreachable, "unreachable"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return tunnel.DialTimeout, "timeout"
	}
	var te interface{ Timeout() bool }
	if errors.As(err, &te) && te.Timeout() {
		return tunnel.DialTimeout, "timeout"
	}
	return tunnel.DialFailed, "failed"
}

// splice copies both ways and half-closes each side when its source ends,
// so a request body's end or an upload's end reaches the other side.
func splice(stream, upstream net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() { pump(upstream, stream) })
	pump(stream, upstream)
	wg.Wait()
}

// pump copies src to dst, then closes dst for writing.
func pump(dst, src net.Conn) {
	if _, err := tunnel.Copy(dst, src); err != nil {
		// One side broke: end both, so that the other pump ends too.
		_ = dst.Close()
		_ = src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		_ = dst.Close() // a yamux stream's Close sends FIN and still reads
	}
}
