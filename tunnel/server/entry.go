package server

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/proxy"
)

// serveEntry is the public HTTP entry: a request for <tunnel>.<domain> goes
// to that tunnel's session and nowhere else.
func (s *Server) serveEntry(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if refused := s.refuseTarget(w, r); refused {
		return
	}
	name, ok := tunnelName(r.Host, s.cfg.Domain)
	if !ok {
		s.metrics.unrouted.WithLabelValues("unknown_host").Inc()
		proxy.WriteError(w, http.StatusNotFound, "unknown_host",
			fmt.Sprintf("tether: no tunnel is served at host %q; tunnels are served at <name>.%s", r.Host, s.cfg.Domain))
		return
	}
	sess, ok := s.registry.Lookup(name)
	var forward http.Handler
	if ok {
		forward, ok = sess.routed()
	}
	if !ok {
		s.metrics.unrouted.WithLabelValues("tunnel_down").Inc()
		proxy.WriteError(w, http.StatusServiceUnavailable, "tunnel_down",
			fmt.Sprintf("tether: tunnel %q is not connected; check the tether client in that cluster", name))
		return
	}
	s.setForwarded(r)
	rec := proxy.NewStatusWriter(w)
	forward.ServeHTTP(rec, r)
	sess.countRequest(rec.Status())
	s.metrics.requestDuration.WithLabelValues(classLabel(rec.Status())).Observe(time.Since(start).Seconds())
}

// refuseTarget answers, before any routing, the request targets a tunnel
// never serves, and reports whether it did.
//
// CONNECT gets 405 whatever the tunnel. The entry is no forward proxy, and
// frp's vhost, which serves stock frpc tunnels, answers CONNECT by joining
// the connection raw to the tenant's service: whatever that service wrote
// back could leave the connection looking reusable, with the tenant on the
// other end.
//
// An absolute-form target ("GET http://b.<domain>/ HTTP/1.1") gets 400. Go's
// server takes the host from the URL and drops the Host header before the
// handler runs, so a request naming one tunnel in its Host header could
// reach another, and the two cannot be compared here. Clients send such
// targets only to forward proxies; an ingress sends origin-form.
//
// Refusals are counted, and logged at most once per 10s each, so that a
// flood of them cannot flood the log.
func (s *Server) refuseTarget(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case r.Method == http.MethodConnect:
		s.metrics.unrouted.WithLabelValues("connect").Inc()
		s.refusalLog.Warn("connect request refused", zap.String("remote_addr", r.RemoteAddr), zap.String("host", r.Host))
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		// The caller wanted a raw tunnel: what it sends next is no request.
		w.Header().Set("Connection", "close")
		proxy.WriteError(w, http.StatusMethodNotAllowed, proxy.CodeMethodNotAllowed,
			"tether: CONNECT is not supported; tunnels serve HTTP requests at <tunnel>."+s.cfg.Domain)
		return true
	case r.URL.Host != "" || r.URL.Scheme != "":
		s.metrics.unrouted.WithLabelValues("absolute_form").Inc()
		s.refusalLog.Warn("absolute-form request refused", zap.String("remote_addr", r.RemoteAddr), zap.String("host", r.Host))
		proxy.WriteError(w, http.StatusBadRequest, proxy.CodeBadRequest,
			fmt.Sprintf("tether: bad request: absolute-form target %q; send origin-form (%s /path) with a Host header of <tunnel>.%s",
				r.RequestURI, r.Method, s.cfg.Domain))
		return true
	}
	return false
}

// tunnelName extracts N from a Host of N.<domain>, with or without a port.
func tunnelName(host, domain string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	name, ok := strings.CutSuffix(host, "."+domain)
	if !ok || auth.ValidTunnelName(name) != nil {
		return "", false
	}
	return name, true
}

// maxRoutes bounds the routes a client may advertise.
const maxRoutes = 32

// forwarder builds the handler that carries requests to sess's client.
//
// A tether client advertises its routes at login. The server runs the
// router for them, so each request is parsed once, here: the router picks
// the route by path and asks the client, on a stream of the session, to
// connect to that route's upstream; the client checks the upstream is one
// of its own and then only copies bytes. Streams stay open in per-upstream
// keep-alive pools, so a request costs no new stream and no new dial.
//
// A stock frpc advertises nothing and is reached through frp's own HTTP
// vhost, which routes by Host to the frp proxy the client registered.
func (s *Server) forwarder(sess *Session) (http.Handler, error) {
	specs, advertised, err := sess.advertisedRoutes()
	if err != nil {
		return nil, err
	}
	if !advertised {
		transport := vhostTransport()
		sess.atEnd(transport.CloseIdleConnections)
		return s.frpVhostProxy(transport), nil
	}
	if len(specs) == 0 || len(specs) > maxRoutes {
		return nil, fmt.Errorf("the client advertised %d routes; want 1 to %d", len(specs), maxRoutes)
	}
	routes := make([]proxy.Route, 0, len(specs))
	for _, spec := range specs {
		r, err := proxy.ParseRoute(spec)
		if err != nil {
			return nil, fmt.Errorf("the client advertised an invalid route: %w", err)
		}
		routes = append(routes, r)
	}
	// An upstream that is down in a customer's cluster fails every request
	// for it: one log line per failure kind every 10s per tunnel tells the
	// platform's operator enough without flooding the server's log.
	sampled := sess.logger().WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, 10*time.Second, 1, 0)
	}))
	router, err := proxy.NewRouter(routes, sampled, proxy.Options{DialContext: sess.dial})
	if err != nil {
		return nil, fmt.Errorf("the client advertised unusable routes: %w", err)
	}
	sess.atEnd(router.Close)
	return router, nil
}

// frpVhostProxy forwards through transport to frp's HTTP vhost, which
// routes by Host.
func (s *Server) frpVhostProxy(transport http.RoundTripper) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = s.frpVhostAddr
			pr.Out.Host = pr.In.Host
			// Rewrite drops X-Forwarded-*; the entry already set them.
			for _, h := range forwardedHeaders {
				pr.Out.Header[h] = pr.In.Header[h]
			}
		},
		Transport:  transport,
		BufferPool: bufferPool{},
		ErrorLog:   s.proxyErrorLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the caller went away; nobody reads an answer
			}
			var te interface{ Timeout() bool }
			var op *net.OpError
			dialing := errors.As(err, &op) && op.Op == "dial"
			if errors.As(err, &te) && te.Timeout() && !dialing {
				proxy.WriteError(w, http.StatusGatewayTimeout, proxy.CodeUpstreamTimeout,
					fmt.Sprintf("tether: the tunnel's service sent no response headers within %.0fs", vhostResponseHeaderTimeout.Seconds()))
				return
			}
			s.log.Warn("request through frp's vhost failed", zap.String("host", r.Host), zap.Error(err))
			proxy.WriteError(w, http.StatusBadGateway, "tunnel_error", "tether: the tunnel could not carry the request; retry")
		},
	}
}

var forwardedHeaders = []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// setForwarded sets X-Forwarded-For/-Host/-Proto on a public request before
// it is routed. A trusted proxy's (--trusted-proxies) forwarding headers are
// kept and extended. From anyone else, every header that tells an upstream
// about the caller (X-Forwarded-*, Forwarded, X-Real-Ip) is dropped first,
// so that what the upstreams read comes from tether: a caller's
// X-Forwarded-Prefix would otherwise reach them, and the router would build
// its own X-Forwarded-Prefix on it.
func (s *Server) setForwarded(r *http.Request) {
	clientIP, _, _ := net.SplitHostPort(r.RemoteAddr)
	forwardedFor, proto, host := clientIP, "http", r.Host
	if r.TLS != nil {
		proto = "https"
	}
	h := r.Header
	if s.trusts(clientIP) {
		if prior := h.Values("X-Forwarded-For"); len(prior) > 0 {
			forwardedFor = strings.Join(prior, ", ") + ", " + clientIP
		}
		if p := h.Get("X-Forwarded-Proto"); p == "http" || p == "https" {
			proto = p
		}
		if fh := h.Get("X-Forwarded-Host"); fh != "" {
			host = fh
		}
	} else {
		for k := range h {
			if isForwardingHeader(k) {
				delete(h, k)
			}
		}
	}
	h.Set("X-Forwarded-For", forwardedFor)
	h.Set("X-Forwarded-Host", host)
	h.Set("X-Forwarded-Proto", proto)
}

// isForwardingHeader reports whether the header named k is X-Forwarded-*,
// Forwarded or X-Real-Ip, in any case and with '_' for '-': servers that
// map headers to CGI-style variables (HTTP_X_FORWARDED_PREFIX) read
// "X-Forwarded_Prefix" as the same header.
func isForwardingHeader(k string) bool {
	const xf = "x-forwarded-"
	return headerIs(k, "forwarded") || headerIs(k, "x-real-ip") ||
		len(k) > len(xf) && headerIs(k[:len(xf)], xf)
}

// headerIs reports whether k equals name (lower case) ignoring case, with
// '_' matching '-'. It does not allocate: it runs for every header of every
// untrusted request.
func headerIs(k, name string) bool {
	if len(k) != len(name) {
		return false
	}
	for i := range len(k) {
		c := k[i]
		switch {
		case c == '_':
			c = '-'
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

func (s *Server) trusts(ip string) bool {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	addr = addr.Unmap()
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// classLabel is the bounded status label of metrics: "2xx".."5xx", or
// "error" when no response was written.
func classLabel(status int) string {
	if c := statusClass(status); c > 0 {
		return strconv.Itoa(c) + "xx"
	}
	return "error"
}

// bufferPool lends 32 KiB copy buffers to the reverse proxies, so streaming a
// body allocates nothing per request.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
