package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tether-dev/tether/proxy"
)

// sessionHandler is how requests reach one session's client.
type sessionHandler interface {
	http.Handler
	// CloseIdle closes the idle connections (streams) it keeps for later
	// requests; requests in flight go on.
	CloseIdle()
}

// maxRoutes bounds the routes a client may advertise.
const maxRoutes = 32

// parseAdvertised parses the routes a tether client advertised at login, a
// JSON list of --route specs; nil (a stock frpc) gives nil.
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
	return routes, nil
}

// newHandler builds how requests reach sess's client.
//
// A tether client advertised its routes at login (routes). The server runs
// the router for them, so each request is parsed once, here: the router
// picks the route by path and asks the client, on a stream of the session,
// to connect to that route's upstream; the client checks the upstream is
// one of its own and then only copies bytes. Streams stay open in
// per-upstream keep-alive pools, so a request costs no new stream and no new
// dial. When the session fails before a request reached it, the router
// leaves the request to the entry, which sends it through another session
// (Reroute).
//
// A stock frpc advertises nothing (routes nil) and is reached through frp's
// own HTTP vhost, which routes by Host to the tunnel's load-balancing group.
func (s *serving) newHandler(sess *Session, routes []proxy.Route) (sessionHandler, error) {
	if routes == nil {
		return s.vhostProxy(), nil
	}
	// An upstream that is down in a customer's cluster fails every request
	// for it: one log line per failure kind every 10s per session tells the
	// platform's operator enough without flooding the server's log.
	sampled := sess.logger().WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, 10*time.Second, 1, 0)
	}))
	router, err := proxy.NewRouter(routes, sampled, proxy.Options{DialContext: sess.dial, Reroute: reroutable})
	if err != nil {
		return nil, fmt.Errorf("the client advertised unusable routes: %w", err)
	}
	return routerHandler{router}, nil
}

// reroutable reports whether a request that failed with err never reached
// the client: its session could not carry the dial.
func reroutable(err error) bool {
	var de *sessionDialError
	return errors.As(err, &de)
}

// routerHandler is a tether client's router.
type routerHandler struct{ *proxy.Router }

func (h routerHandler) CloseIdle() { h.Close() }

// vhostHandler forwards to frp's HTTP vhost, for a stock frpc's session.
type vhostHandler struct {
	*httputil.ReverseProxy
	transport *http.Transport
}

func (h vhostHandler) CloseIdle() { h.transport.CloseIdleConnections() }

// vhostProxy forwards to frp's HTTP vhost, which routes by Host, through a
// transport of its own: one per stock frpc session, closed with it, so that a
// pooled connection to the vhost is never shared by two tunnels (frp joins a
// CONNECT raw to the tenant's work connection, and an answer that looks
// complete would return it to a shared pool, with the tenant on the other
// end).
func (s *serving) vhostProxy() vhostHandler {
	transport := vhostTransport()
	return vhostHandler{transport: transport, ReverseProxy: &httputil.ReverseProxy{
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
	}}
}
