package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/server/gate"
)

// sessionHandler is how requests reach one session's client.
type sessionHandler interface {
	// Deliver serves r through the session and reports whether it did:
	// false, having written nothing, when the session failed before any
	// of r reached the client, so that another session may take it.
	Deliver(w http.ResponseWriter, r *http.Request) (delivered bool)
	// CloseIdle closes the idle connections (streams) it keeps for later
	// requests; requests in flight go on.
	CloseIdle()
}

// maxRoutes bounds the routes a client may advertise.
const maxRoutes = 32

// parseAdvertised parses the routes a tether client advertised at login, a
// JSON list of --route specs, and checks them as the router will; nil (a
// stock frpc) gives nil.
func parseAdvertised(raw *string) ([]proxy.Route, error) {
	if raw == nil {
		return nil, nil
	}
	var specs []string
	if err := json.Unmarshal([]byte(*raw), &specs); err != nil {
		return nil, fmt.Errorf("the client's advertised routes are not a JSON list of route specs: %w", err)
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
	if _, err := proxy.ValidateRoutes(routes); err != nil {
		return nil, fmt.Errorf("the client advertised unusable routes: %w", err)
	}
	return routes, nil
}

// newHandler returns how requests reach sess's client; it is built at the
// session's first request (lazyHandler), since most sessions idle: a
// router and its transports cost more than the rest of an idle session.
//
// A tether client advertised its routes at login, checked then
// (parseAdvertised). The server runs
// the router for them, so each request is parsed once, here: the router
// picks the route by path and asks the client, on a stream of the session,
// to connect to that route's upstream; the client checks the upstream is
// one of its own and then only copies bytes. Streams stay open in
// per-upstream keep-alive pools, so a request costs no new stream and no new
// dial. When the session fails before a request reached it, the router
// says so (proxy.Router.Deliver, with the session's failures marked
// proxy.ErrNotDelivered by sessionDialer), and the entry sends the request
// through another session.
//
// A stock frpc advertises nothing (stock) and is reached through frp's
// own HTTP vhost, which routes by Host to the tunnel's load-balancing group.
func (s *replica) newHandler(sess *gate.Session, stock bool) sessionHandler {
	if stock {
		return &lazyHandler{build: func() (sessionHandler, error) { return s.vhostProxy(), nil }}
	}
	return &lazyHandler{build: func() (sessionHandler, error) {
		// Parsed again rather than kept: a session may idle for days.
		routes, err := parseAdvertised(sess.AdvertisedRoutes())
		if err != nil {
			sess.Logger().Error("build the session's router", zap.Error(err))
			return nil, err
		}
		router, err := proxy.NewRouter(routes, sampled(sess.Logger(), routerLogPeriod), proxy.Options{DialContext: sessionDialer(sess), Unreachable: offerUnreachable})
		if err != nil {
			sess.Logger().Error("build the session's router", zap.Error(err))
			return nil, err
		}
		return routerHandler{router}, nil
	}}
}

// routerLogPeriod: an upstream that is down in a customer's cluster fails
// every request for it: one log line per failure kind every 10s per session
// tells the platform's operator enough without flooding the server's log.
const routerLogPeriod = 10 * time.Second

// lazyHandler builds its handler at the first request. CloseIdle before
// then builds nothing.
type lazyHandler struct {
	build func() (sessionHandler, error)

	mu  sync.Mutex
	h   sessionHandler
	err error
}

func (l *lazyHandler) handler() (sessionHandler, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == nil && l.err == nil {
		l.h, l.err = l.build()
		l.build = nil
	}
	return l.h, l.err
}

func (l *lazyHandler) Deliver(w http.ResponseWriter, r *http.Request) bool {
	h, err := l.handler()
	if err != nil {
		// Login checked the routes as the router does: this is a bug,
		// not the client's doing.
		proxy.WriteError(w, http.StatusBadGateway, "tunnel_error", "tether: the tunnel's routes could not be served; reconnect the client")
		return true
	}
	return h.Deliver(w, r)
}

func (l *lazyHandler) CloseIdle() {
	l.mu.Lock()
	h := l.h
	l.mu.Unlock()
	if h != nil {
		h.CloseIdle()
	}
}

// sampled returns log, passing each message at each level at most once per
// period. zap's own sampler keeps 7×4096 counters, 460 KiB, for each logger
// it samples: this one keeps the messages it has seen, a few.
func sampled(log *zap.Logger, period time.Duration) *zap.Logger {
	state := &sampleState{period: period, last: make(map[sampleKey]time.Time)}
	return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return &sampledCore{Core: c, state: state}
	}))
}

// maxSampledMessages bounds what a sampled logger remembers; past it, it
// starts afresh. Loggers log a fixed set of messages, far fewer.
const maxSampledMessages = 64

type sampleKey struct {
	level   zapcore.Level
	message string
}

type sampleState struct {
	period time.Duration
	mu     sync.Mutex
	last   map[sampleKey]time.Time
}

// allow reports whether an entry at level with message may pass at now.
func (s *sampleState) allow(level zapcore.Level, message string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sampleKey{level, message}
	if last, ok := s.last[k]; ok && now.Sub(last) < s.period {
		return false
	}
	if len(s.last) >= maxSampledMessages {
		clear(s.last)
	}
	s.last[k] = now
	return true
}

// sampledCore is a core whose entries pass its state's sampling; the cores
// With derives share the state.
type sampledCore struct {
	zapcore.Core
	state *sampleState
}

func (c *sampledCore) With(fields []zapcore.Field) zapcore.Core {
	return &sampledCore{Core: c.Core.With(fields), state: c.state}
}

func (c *sampledCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !c.Enabled(ent.Level) || !c.state.allow(ent.Level, ent.Message, ent.Time) {
		return ce
	}
	return c.Core.Check(ent, ce)
}

// sessionDialer is the router's DialContext for sess: sess.Dial, its
// failures of the session itself (*gate.SessionError: nothing of the
// request reached the client) marked proxy.ErrNotDelivered.
func sessionDialer(sess *gate.Session) proxy.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := sess.Dial(ctx, network, addr)
		if se := (*gate.SessionError)(nil); errors.As(err, &se) {
			return nil, fmt.Errorf("%w: %w", proxy.ErrNotDelivered, err)
		}
		return conn, err
	}
}

// routerHandler is a tether client's router.
type routerHandler struct{ *proxy.Router }

func (h routerHandler) CloseIdle() { h.Close() }

// vhostHandler forwards to frp's HTTP vhost, for a stock frpc's session.
type vhostHandler struct {
	proxy     *httputil.ReverseProxy
	transport *vhostTransport
}

// Deliver always delivers: frp's vhost picks the session itself.
func (h vhostHandler) Deliver(w http.ResponseWriter, r *http.Request) bool {
	h.proxy.ServeHTTP(w, r)
	return true
}

func (h vhostHandler) CloseIdle() { h.transport.CloseIdleConnections() }

// vhostProxy forwards to frp's HTTP vhost, which routes by Host, through a
// transport of its own: one per stock frpc session, closed with it, so that a
// pooled connection to the vhost is never shared by two tunnels (frp joins a
// CONNECT raw to the tenant's work connection, and an answer that looks
// complete would return it to a shared pool, with the tenant on the other
// end).
func (s *replica) vhostProxy() vhostHandler {
	transport := s.frp.vhostTransport(s.srv.floodLog)
	return vhostHandler{transport: transport, proxy: &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = s.frp.vhostAddr
			pr.Out.Host = pr.In.Host
			// Rewrite drops X-Forwarded-*; the entry already set them.
			for _, h := range forwardedHeaders {
				pr.Out.Header[h] = pr.In.Header[h]
			}
		},
		Transport:  transport,
		BufferPool: bufferPool{},
		ErrorLog:   s.srv.proxyErrorLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the caller went away; nobody reads an answer
			}
			if errors.Is(err, proxy.ErrBadResponse) {
				s.srv.floodLog.Warn("a stock frpc's answer refused", zap.String("host", r.Host), zap.Error(err))
				proxy.WriteError(w, http.StatusBadGateway, proxy.CodeUpstreamBadResponse, proxy.BadResponseMessage("the tunnel's service", err))
				return
			}
			var te interface{ Timeout() bool }
			var op *net.OpError
			dialing := errors.As(err, &op) && op.Op == "dial"
			if errors.As(err, &te) && te.Timeout() && !dialing {
				proxy.WriteError(w, http.StatusGatewayTimeout, proxy.CodeUpstreamTimeout,
					fmt.Sprintf("tether: the tunnel's service sent no response headers within %.0fs", vhostResponseHeaderTimeout.Seconds()))
				return
			}
			s.srv.log.Warn("request through frp's vhost failed", zap.String("host", r.Host), zap.Error(err))
			proxy.WriteError(w, http.StatusBadGateway, "tunnel_error", "tether: the tunnel could not carry the request; retry")
		},
	}}
}
