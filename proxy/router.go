package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Options tune a Router. The zero value is ready to use.
//
// There is no router-wide response timeout: Route.Timeout is authoritative,
// because a default could not tell a route that set no timeout from one that
// needs none (0, for streams). Routes from DefaultRoutes and ParseRoute carry
// their adapter's timeout.
type Options struct {
	// DialTimeout bounds connecting to an upstream, DNS lookup included.
	// Zero means DefaultDialTimeout (5s).
	DialTimeout time.Duration

	// DialContext dials upstreams, at their Route.DialAddr; nil means a
	// net.Dialer. The tunnel server injects one that dials through the
	// tunnel's session, where the client connects to the upstream; tests
	// inject their own. DialTimeout still applies, through the context.
	// A connection it returns that is a ReadyWaiter (a tunnel stream) holds
	// a smaller buffer while its response streams.
	DialContext DialFunc

	// Unreachable, if set, is asked about a request whose upstream could
	// not be connected to, before the router answers it 502
	// upstream_unreachable: none of the request was sent, and req, the
	// caller's request, has its body unread by the router. When it
	// returns true it has answered req itself, and the router writes
	// nothing more. The tunnel server uses it to store a request of a
	// buffered route for delivery once the upstream is back.
	Unreachable func(w http.ResponseWriter, req *http.Request) bool

	// Metrics, if set, receives the router's collectors:
	// tether_proxy_requests_total{route,adapter,class} and
	// tether_proxy_upstream_latency_seconds{route,adapter}.
	Metrics prometheus.Registerer
}

// Router is an http.Handler that forwards each request to the upstream of
// the route whose prefix matches the request path, longest prefix first. The
// tunnel server builds one per tunnel session, from the routes its client
// advertised. It is safe for concurrent use. Create it with NewRouter.
type Router struct {
	log        *zap.Logger
	routes     []*route // longest prefix first
	given      []Route  // as given to NewRouter, normalized
	transports []*transport
	unmatched  *routeMetrics // nil without metrics
}

// route is one Route with what serving it needs.
type route struct {
	Route
	upstream    string // Upstream as text, for errors
	strip       bool   // the upstream URL has a path, which replaces the prefix
	dialTimeout time.Duration
	transport   *transport // shared by the routes of one upstream
	log         *zap.Logger
	metrics     *routeMetrics // nil without metrics
	unreachable func(http.ResponseWriter, *http.Request) bool
}

// ValidateRoutes checks routes as NewRouter does (at least one, prefixes
// unique and well formed, upstreams absolute http(s) URLs) and returns them
// normalized, without building a router.
func ValidateRoutes(routes []Route) ([]Route, error) { return validateRoutes(routes) }

// NewRouter validates routes and builds a Router. It needs at least one
// route; prefixes must be unique and upstreams absolute http or https URLs
// without user info, query or fragment. Every problem is reported, joined.
// Upstreams that share scheme, dial address (Route.DialAddr) and TLS setting
// share one connection pool. NewRouter does not dial; the router logs under
// log.Named("proxy").
func NewRouter(routes []Route, log *zap.Logger, opts Options) (*Router, error) {
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("proxy")
	given, err := validateRoutes(routes)
	if opts.DialTimeout < 0 {
		err = errors.Join(err, fmt.Errorf("dial timeout %s is negative; want a positive duration, or 0 for %s", opts.DialTimeout, DefaultDialTimeout))
	}
	if err != nil {
		return nil, err
	}
	var m *metrics
	if opts.Metrics != nil {
		if m, err = newMetrics(opts.Metrics); err != nil {
			return nil, err
		}
	}

	dialTimeout := opts.DialTimeout
	if dialTimeout == 0 {
		dialTimeout = DefaultDialTimeout
	}
	dial := newDialFunc(opts)

	r := &Router{log: log, given: given}
	byKey := make(map[transportKey]*transport)
	for _, g := range given {
		k := keyOf(g)
		t, ok := byKey[k]
		if !ok {
			t = newTransport(k, dial)
			byKey[k] = t
			r.transports = append(r.transports, t)
		}
		rt := &route{
			Route:       g,
			upstream:    g.Upstream.String(),
			strip:       g.Upstream.Path != "",
			dialTimeout: dialTimeout,
			transport:   t,
			unreachable: opts.Unreachable,
		}
		rt.log = log.With(
			zap.String("route", g.Prefix),
			zap.String("adapter", g.Adapter),
			zap.String("upstream", rt.upstream))
		if m != nil {
			rt.metrics = m.forRoute(g.Prefix, g.Adapter)
		}
		r.routes = append(r.routes, rt)
	}
	slices.SortStableFunc(r.routes, func(a, b *route) int { return len(b.Prefix) - len(a.Prefix) })
	if m != nil {
		r.unmatched = m.forUnmatched("", "")
	}
	return r, nil
}

// validateRoutes checks routes and returns normalized copies.
func validateRoutes(routes []Route) ([]Route, error) {
	if len(routes) == 0 {
		return nil, errors.New("no routes; want at least one, e.g. proxy.DefaultRoutes()")
	}
	var errs []error
	seen := make(map[string]bool, len(routes))
	given := make([]Route, 0, len(routes))
	for _, r := range routes {
		if err := normalizeRoute(&r); err != nil {
			errs = append(errs, fmt.Errorf("route %q: %w", r.Prefix, err))
			continue
		}
		if seen[r.Prefix] {
			errs = append(errs, fmt.Errorf("route %q: duplicate prefix; each prefix may have one route", r.Prefix))
			continue
		}
		seen[r.Prefix] = true
		given = append(given, r)
	}
	return given, errors.Join(errs...)
}

// normalizeRoute validates r and normalizes it in place, with its own copy
// of the upstream URL.
func normalizeRoute(r *Route) error {
	p, err := cleanPrefix(r.Prefix)
	if err != nil {
		return err
	}
	r.Prefix = p
	if err := validateUpstream(r.Upstream); err != nil {
		return err
	}
	u := *r.Upstream
	r.Upstream = &u
	if r.Timeout < 0 {
		return fmt.Errorf("timeout %s is negative; want a positive duration, or 0 for none", r.Timeout)
	}
	if r.HealthPath != "" && !strings.HasPrefix(r.HealthPath, "/") {
		return fmt.Errorf("health path %q must start with \"/\"", r.HealthPath)
	}
	if r.Adapter == "" {
		r.Adapter = AdapterCustom
	}
	return nil
}

// Routes returns the router's routes in the order given to NewRouter, with
// prefixes normalized and adapters defaulted. The caller may modify them.
func (r *Router) Routes() []Route {
	out := make([]Route, len(r.given))
	for i, g := range r.given {
		u := *g.Upstream
		g.Upstream = &u
		out[i] = g
	}
	return out
}

// Close closes the idle connections to upstreams. It does not interrupt
// requests in flight. The router stays usable (it dials again when needed),
// but a caller that closes it is expected to stop using it. Close may be
// called more than once.
func (r *Router) Close() {
	for _, t := range r.transports {
		t.closeIdle()
	}
}

// ServeHTTP forwards req to the upstream of the route matching its path, or
// answers with a short error: 404 when no route matches, 400 for a target
// that is not a clean absolute path, 405 for CONNECT, and 502/504 when the
// upstream fails (see ErrorHeader).
//
// The upstream is always the route's: the request's Host header, an
// absolute-form request target and X-Forwarded-Host never change where the
// router dials.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) { r.serve(w, req, false) }

// ErrNotDelivered marks an error of Options.DialContext after which nothing
// of the request has reached anyone, so that another way may take it: the
// tunnel server wraps a tunnel session's failure in it.
var ErrNotDelivered = errors.New("request not delivered")

// Deliver is ServeHTTP for a caller that has another way to send req: when
// dialing the upstream fails with ErrNotDelivered (and the caller is still
// there), it answers nothing, counts nothing and returns false; the caller
// sends req elsewhere. Otherwise it answers req as ServeHTTP does and
// returns true. A StatusWriter carries one request from one attempt to the
// next: the attempt that answers is counted once.
func (r *Router) Deliver(w http.ResponseWriter, req *http.Request) (delivered bool) {
	return r.serve(w, req, true)
}

// serve forwards or answers req; elsewhere says whether a request not
// delivered is left to the caller (Deliver) or answered (ServeHTTP).
func (r *Router) serve(w http.ResponseWriter, req *http.Request, elsewhere bool) (delivered bool) {
	rt := r.routeFor(w, req)
	if rt == nil {
		return true
	}
	noteRoute(req.Context(), rt.Prefix)
	if req.ContentLength != 0 {
		// Let the upstream answer while the body still streams in (Go's
		// HTTP/1 server otherwise stops reading the body once the response
		// starts). Not supported on HTTP/2, which is full duplex anyway.
		_ = http.NewResponseController(w).EnableFullDuplex()
	}
	sw := attempt(w)
	start := time.Now()
	delivered = true
	// Deferred, so that a response aborted mid-body (forward panics with
	// http.ErrAbortHandler) is still counted.
	defer func() {
		if delivered {
			rt.finish(sw, req, start)
		}
	}()
	delivered = rt.forward(sw, req, elsewhere)
	return delivered
}

// attempt returns the StatusWriter that records this router's answer on w:
// w itself when it is one (the server's entry wraps every request in one,
// for its own metrics), so that one request has one record of its status.
// What the router noted of an earlier attempt on it is cleared.
func attempt(w http.ResponseWriter) *StatusWriter {
	sw, ok := w.(*StatusWriter)
	if !ok {
		return NewStatusWriter(w)
	}
	sw.canceled = false
	return sw
}

// routeFor returns the route req goes to, or answers req itself and
// returns nil: a CONNECT, a path it cannot read, or one no route matches.
func (r *Router) routeFor(w http.ResponseWriter, req *http.Request) *route {
	if req.Method == http.MethodConnect {
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		r.reject(w, req, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			"tether: CONNECT is not supported; the router forwards requests to its routes only")
		return nil
	}
	rp, err := splitPath(req.URL)
	if err != nil {
		r.reject(w, req, http.StatusBadRequest, CodeBadRequest, "tether: bad request: "+err.Error())
		return nil
	}
	rt := r.match(rp.match)
	if rt == nil {
		r.reject(w, req, http.StatusNotFound, CodeNoRoute,
			fmt.Sprintf("tether: no route for path %q", rp.decoded))
	}
	return rt
}

// match returns the route with the longest prefix matching the path.
func (r *Router) match(p string) *route {
	for _, rt := range r.routes {
		if hasSegmentPrefix(p, rt.Prefix) {
			return rt
		}
	}
	return nil
}

// reject answers a request the router does not forward.
func (r *Router) reject(w http.ResponseWriter, req *http.Request, status int, code, msg string) {
	if ce := r.log.Check(zapcore.DebugLevel, "request rejected"); ce != nil {
		ce.Write(
			zap.String("method", req.Method),
			zap.String("path", req.URL.Path),
			zap.String("code", code))
	}
	WriteError(w, status, code, msg)
	r.unmatched.count(status, false)
}

// finish logs and counts a forwarded request.
func (rt *route) finish(sw *StatusWriter, req *http.Request, start time.Time) {
	rt.metrics.count(sw.status, sw.canceled)
	if ce := rt.log.Check(zapcore.DebugLevel, "request"); ce != nil {
		ce.Write(
			zap.String("method", req.Method),
			zap.String("path", req.URL.Path),
			zap.Int("status", sw.status),
			zap.Duration("duration", time.Since(start)))
	}
}
