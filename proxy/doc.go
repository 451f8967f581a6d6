// Package proxy is the tunnel client's in-process router: an http.Handler
// that receives the requests the tunnel server carries through the tunnel
// and forwards each one to an in-cluster service, chosen by path prefix.
//
// The default routes are the adapters of the platform's runtime (see
// Adapters): "/" to the app-proxy, "/argo-cd" to Argo CD, "/workflows" to
// argo-server, "/webhooks" to the Argo Events webhook event source and
// "/rollouts" to the Argo Rollouts dashboard. Each is one small file naming
// its prefix, upstream, health check and timeout, with the reason for each.
//
// # Usage
//
//	routes := proxy.DefaultRoutes()
//	if len(flags.Routes) > 0 { // --route PREFIX=URL[;timeout=D][;insecure-skip-verify]
//		routes = routes[:0]
//		for _, spec := range flags.Routes {
//			r, err := proxy.ParseRoute(spec)
//			if err != nil {
//				return err
//			}
//			routes = append(routes, r)
//		}
//	}
//	router, err := proxy.NewRouter(routes, log, proxy.Options{Metrics: reg})
//	if err != nil {
//		return err
//	}
//	defer router.Close()
//	// serve router on the tunnel's streams, e.g. http.Server{Handler: router}
//
// # Behaviour
//
// Routes match on path segment boundaries, longest prefix first; a path
// matching none gets 404. Whether the prefix reaches the upstream depends on
// the upstream URL's path, as with nginx's proxy_pass (see Route).
//
// Every request goes to its route's upstream and nowhere else: the Host
// header, an absolute-form request target ("GET http://other/ HTTP/1.1") and
// X-Forwarded-Host never change where the router dials, and CONNECT is
// refused, so the router is never an open proxy into the cluster.
//
// Bodies stream in both directions, without buffering: every write is
// flushed at once (server-sent events, watch streams), websocket upgrades
// pass through, and an upstream may answer while the request body still
// streams in. Hop-by-hop headers are dropped (Upgrade is kept for websocket
// only). X-Forwarded-For, -Host and -Proto are trusted as set by the tunnel
// server and passed on unchanged; X-Forwarded-Prefix is set when the prefix
// is stripped; the upstream sees its own Host.
//
// When the router answers instead of the upstream, the response is one short
// line of text and the ErrorHeader header holds a code: 502 when the
// upstream is unreachable or fails, 504 when it sends no headers within the
// route's Timeout. Failures are logged at Warn with the route and upstream,
// never with request headers; a caller that goes away is logged at Debug.
//
// Upstreams sharing a scheme, host and TLS setting share one pool of
// keep-alive HTTP/1.1 connections, with many idle connections kept per host.
//
// # What it does not do
//
// It does not authenticate or authorize: requests have passed the tunnel
// server's tenancy checks before they reach the tunnel. It does not retry,
// balance between upstreams, rewrite response bodies or redirects, or speak
// HTTP/2 to upstreams. It does not run health checks; Route.HealthURL tells
// diagnostics where they are. It never imports the tunnel engine.
package proxy
