package proxy

import (
	"testing"
	"time"
)

func TestAdapters(t *testing.T) {
	want := []Adapter{
		{Name: "app-proxy", Prefix: "/", Upstream: "http://app-proxy:8080", HealthPath: "/healthz", Timeout: 60 * time.Second},
		{Name: "argo-cd", Prefix: "/argo-cd", Upstream: "http://argocd-server:80", HealthPath: "/argo-cd/healthz"},
		{Name: "argo-workflows", Prefix: "/workflows", Upstream: "https://argo-server:2746/", HealthPath: "/", InsecureSkipVerify: true},
		{Name: "argo-events", Prefix: "/webhooks", Upstream: "http://webhook-eventsource-svc:12000/", HealthPath: "/health", Timeout: 30 * time.Second, Buffer: true},
		{Name: "argo-rollouts", Prefix: "/rollouts", Upstream: "http://argo-rollouts-dashboard:3100", HealthPath: "/rollouts/", Timeout: 60 * time.Second},
	}
	got := Adapters()
	if len(got) != len(want) {
		t.Fatalf("Adapters() has %d adapters, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Adapters()[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	got[0].Prefix = "/changed"
	if Adapters()[0].Prefix != "/" {
		t.Error("Adapters() returns shared state")
	}
}

func TestDefaultRoutes(t *testing.T) {
	routes := DefaultRoutes()
	r, err := NewRouter(routes, nil, Options{})
	if err != nil {
		t.Fatalf("NewRouter(DefaultRoutes()): %v", err)
	}
	defer r.Close()
	for i, a := range Adapters() {
		rt := routes[i]
		if rt.Prefix != a.Prefix || rt.Upstream.String() != a.Upstream || rt.Adapter != a.Name ||
			rt.Timeout != a.Timeout || rt.InsecureSkipVerify != a.InsecureSkipVerify || rt.HealthPath != a.HealthPath || rt.Buffer != a.Buffer {
			t.Errorf("DefaultRoutes()[%d] = %s (%s), want adapter %+v", i, rt, rt.Adapter, a)
		}
		// A --route with the same prefix and URL is the same route.
		parsed, err := ParseRoute(a.Prefix + "=" + a.Upstream)
		if err != nil {
			t.Fatal(err)
		}
		if parsed.String() != rt.String() || parsed.Adapter != rt.Adapter || parsed.HealthPath != rt.HealthPath {
			t.Errorf("ParseRoute(%q) = %s, want the default %s", a.Prefix+"="+a.Upstream, parsed, rt)
		}
	}
	if got := r.Routes(); len(got) != len(routes) {
		t.Errorf("Routes() has %d routes, want %d", len(got), len(routes))
	}
}

func TestAdapterRoutePanicsOnBadUpstream(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Route() of an adapter with an invalid upstream did not panic")
		}
	}()
	Adapter{Name: "broken", Prefix: "/b", Upstream: "ftp://x"}.Route()
}
