// Package proxy is the HTTP router for a tunnel's routes: an http.Handler
// that forwards each request to the upstream of the route its path matches.
//
// It runs in the tunnel server, one Router per tunnel session. A tether
// client advertises its routes at login (Route.String, read back with
// ParseRoute); the server builds a Router from them whose DialContext opens
// a stream of the session and asks the client to connect to the chosen
// route's upstream (Route.DialAddr). The client parses no HTTP: it checks
// that address against its own routes' DialAddr and copies bytes. So each
// request is parsed once, in the server, and the client still connects to
// nothing but its own upstreams.
//
// The default routes are the adapters of the platform's runtime (see
// Adapters): "/" to the app-proxy, "/argo-cd" to Argo CD, "/workflows" to
// argo-server, "/webhooks" to the Argo Events webhook event source and
// "/rollouts" to the Argo Rollouts dashboard. Each is one small file naming
// its prefix, upstream, health check and timeout, with the reason for each.
//
// # Usage
//
// The client picks its routes and advertises them:
//
//	routes := proxy.DefaultRoutes()
//	if len(flags.Routes) > 0 { // --route PREFIX=URL[;timeout=D][;insecure-skip-verify][;buffer]
//		routes = routes[:0]
//		for _, spec := range flags.Routes {
//			r, err := proxy.ParseRoute(spec)
//			if err != nil {
//				return err
//			}
//			routes = append(routes, r)
//		}
//	}
//	// advertise r.String() for each route at login
//
// The server, for each session, parses the advertised specs back and routes
// through the session:
//
//	// dialThroughSession opens a stream, asks the client to connect to
//	// addr, and returns the stream once the client has.
//	router, err := proxy.NewRouter(routes, log, proxy.Options{DialContext: dialThroughSession})
//	if err != nil {
//		return err // refuse the session's routes
//	}
//	defer router.Close() // when the session ends
//	router.ServeHTTP(w, req) // for each request to the tunnel's host
//
// # Behaviour
//
// Routes match on path segment boundaries, longest prefix first; a path
// matching none gets 404. Whether the prefix reaches the upstream depends on
// the upstream URL's path, as with nginx's proxy_pass (see Route).
//
// Every request goes to its route's upstream and nowhere else: the router
// dials the route's DialAddr, and the Host header, an absolute-form request
// target ("GET http://other/ HTTP/1.1") and X-Forwarded-Host never change
// that; CONNECT is refused. The router is never an open proxy into the
// cluster, and the client's check of the dial address makes sure of it.
//
// Bodies stream in both directions, without buffering: a stream's head and
// every write of its body are flushed at once (server-sent events, bodies
// of unknown length: watch streams, long polls), and a stream holds no copy
// buffer while its upstream is quiet; on a connection that is a
// ReadyWaiter, as the tunnel's streams are, it waits in the connection and
// holds a 1 KiB reader rather than 4 KiB. Websocket upgrades pass through,
// and an upstream may answer while the request body still streams in. 1xx
// responses (100 Continue, 103 Early Hints) and trailers pass through.
// Hop-by-hop headers are dropped (Upgrade is kept for websocket only), and
// so are Forwarded and Proxy-* from the caller. X-Forwarded-For, -Host and
// -Proto are trusted as the server's public entry set them and passed on
// unchanged; X-Forwarded-Prefix is set when the prefix is stripped; the
// upstream sees its own Host. Query parameters that Go's server cannot
// parse (";" separators, bad escapes) are dropped, as
// httputil.ReverseProxy does, so that the upstream cannot read the query
// differently from the router.
//
// The router reads what an upstream answers at least as strictly as
// net/http.Transport, and a differential test holds it to that: response
// heads are bounded to MaxHeadBytes (64 KiB) and MaxHeadFields (256 header
// fields), the 1xx heads of an exchange counted with the final one, before
// any parser holds them; a 101 switches protocols only to the upgrade the
// request asked for; anything that arrives on a pooled connection while it
// is idle closes it (see watch.go), and a connection the router is done
// with is closed at once, a tunnel stream reset. An upstream's X-Tether-*
// fields (tether's own) never reach the caller, in any head or trailer;
// the caller's trailers pass by the rules of its header fields, without
// forwarding fields, which only the server's entry sets. LimitHeads puts
// the same bounds on an http.Transport.
//
// When the router answers instead of the upstream, the response is one short
// line of text and the ErrorHeader header holds a code: 502 when the
// upstream is unreachable, fails, or answers what the router does not pass
// on (CodeUpstreamBadResponse), 504 when it sends no headers within the
// route's Timeout. The text names the route, never the upstream's address.
// Failures are logged at Warn with the route and upstream, never with
// request headers; a caller that goes away is logged at Debug.
//
// Upstreams sharing a scheme, dial address and TLS setting share one pool
// of keep-alive HTTP/1.1 connections (through the tunnel, streams of the
// session): up to 256 idle ones per upstream, each closed after 30s unused,
// so that an idle tunnel holds no streams. A connection returns to the pool
// only when its response was read to the end; one that is a Shrinker (a
// tunnel stream) then gives back its receive buffer. The router speaks
// HTTP/1.1 on them itself: a request costs its own goroutine, one more
// while a request body streams, and an idle connection the goroutine that
// watches it.
//
// A request that is safe to repeat (GET, HEAD, OPTIONS, TRACE, or with an
// Idempotency-Key; no body) and fails on a kept-alive connection before any
// byte of the response is sent once more on a new connection: the upstream
// may have closed the idle connection as the request went out. Nothing else
// is repeated.
//
// # Buffered routes
//
// A route with the buffer option (Route.Buffer; the /webhooks adapter has
// it) asks the tunnel server to keep the POST, PUT and PATCH requests that
// cannot reach it, because the tunnel is down or its upstream refused the
// connection, answer them 202 Accepted once stored, and deliver them in
// order when the upstream is back. The router itself treats such a route
// like any other: the server decides, from the specs a tunnel advertised
// at its last login, with Buffered.
//
// # What it does not do
//
// It does not authenticate or authorize: the server's public entry has
// already matched the request's host to this tunnel, and only to it. It does
// not balance between upstreams, rewrite response bodies or redirects, or
// speak HTTP/2 to upstreams. It does not run health checks;
// Route.HealthURL tells diagnostics where they are. It never imports the
// tunnel engine: the stream it dials through comes in as a DialFunc.
package proxy
