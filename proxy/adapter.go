package proxy

import (
	"net/url"
	"time"
)

// Adapter describes one in-cluster component and its default route. The
// client runs in the runtime's namespace, so upstreams use short service
// names. Every default can be overridden with --route (see ParseRoute);
// adding a component is one small file with one function returning its
// Adapter, listed in Adapters.
type Adapter struct {
	// Name identifies the component in logs, error bodies and metrics.
	Name string
	// Prefix is the route prefix the component is served under.
	Prefix string
	// Upstream is the default upstream URL (see Route for the path rule).
	Upstream string
	// HealthPath is the health-check path relative to Upstream; empty means none.
	HealthPath string
	// Timeout bounds the wait for response headers; zero means none.
	Timeout time.Duration
	// InsecureSkipVerify turns off certificate verification for an https Upstream.
	InsecureSkipVerify bool
	// Buffer stores requests the component cannot take while it is away
	// and delivers them later (see Route.Buffer).
	Buffer bool
}

// Adapters returns the default adapters, in a fixed order: app-proxy,
// argo-cd, argo-workflows, argo-events, argo-rollouts. Each call returns a
// new slice.
func Adapters() []Adapter {
	return []Adapter{
		appProxy(),
		argoCD(),
		argoWorkflows(),
		argoEvents(),
		argoRollouts(),
	}
}

// DefaultRoutes returns Adapters as routes, in the same order: what the
// client serves when no --route is given.
func DefaultRoutes() []Route {
	as := Adapters()
	routes := make([]Route, 0, len(as))
	for _, a := range as {
		routes = append(routes, a.Route())
	}
	return routes
}

// Route returns the adapter's default route. It panics if the adapter's
// Upstream is not a valid upstream URL, which is a programming error in the
// adapter's definition.
func (a Adapter) Route() Route {
	u, err := url.Parse(a.Upstream)
	if err == nil {
		err = validateUpstream(u)
	}
	if err != nil {
		panic("proxy: adapter " + a.Name + ": " + err.Error())
	}
	return Route{
		Prefix:             a.Prefix,
		Upstream:           u,
		Timeout:            a.Timeout,
		InsecureSkipVerify: a.InsecureSkipVerify,
		Buffer:             a.Buffer,
		Adapter:            a.Name,
		HealthPath:         a.HealthPath,
	}
}

// adapterByPrefix returns the default adapter served under prefix.
func adapterByPrefix(prefix string) (Adapter, bool) {
	for _, a := range Adapters() {
		if a.Prefix == prefix {
			return a, true
		}
	}
	return Adapter{}, false
}
