package proxy

import "context"

// A RouteNote learns which route served a request, for an access log: a
// Router that matches a request whose context carries one (WithRouteNote)
// sets its Prefix. It is written by the goroutine that serves the request;
// read it after the handler returned.
type RouteNote struct {
	// Prefix is the prefix of the route the request's path matched; ""
	// when no Router matched it.
	Prefix string
}

type routeNoteKey struct{}

// WithRouteNote returns ctx carrying n.
func WithRouteNote(ctx context.Context, n *RouteNote) context.Context {
	return context.WithValue(ctx, routeNoteKey{}, n)
}

// noteRoute tells the request's RouteNote, if any, the prefix it matched.
func noteRoute(ctx context.Context, prefix string) {
	if n, ok := ctx.Value(routeNoteKey{}).(*RouteNote); ok {
		n.Prefix = prefix
	}
}
