package proxy

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestParseRoute(t *testing.T) {
	tests := []struct {
		spec string
		want Route
	}{
		{
			spec: "/x=http://svc:8080",
			want: Route{Prefix: "/x", Upstream: &url.URL{Scheme: "http", Host: "svc:8080"}, Adapter: AdapterCustom},
		},
		{
			spec: "/x/y/=https://svc/base/;timeout=1m30s;insecure-skip-verify",
			want: Route{
				Prefix: "/x/y", Upstream: &url.URL{Scheme: "https", Host: "svc", Path: "/base/"},
				Timeout: 90 * time.Second, InsecureSkipVerify: true, Adapter: AdapterCustom,
			},
		},
		{
			// A default adapter's prefix inherits its settings.
			spec: "/argo-cd=http://argo-cd-server:80",
			want: Route{
				Prefix: "/argo-cd", Upstream: &url.URL{Scheme: "http", Host: "argo-cd-server:80"},
				Adapter: "argo-cd", HealthPath: "/argo-cd/healthz",
			},
		},
		{
			// The webhooks adapter buffers.
			spec: "/webhooks=http://es:13000/",
			want: Route{
				Prefix: "/webhooks", Upstream: &url.URL{Scheme: "http", Host: "es:13000", Path: "/"},
				Adapter: "argo-events", HealthPath: "/health", Timeout: 30 * time.Second, Buffer: true,
			},
		},
		{
			spec: "/webhooks=http://es:13000/;buffer=false",
			want: Route{
				Prefix: "/webhooks", Upstream: &url.URL{Scheme: "http", Host: "es:13000", Path: "/"},
				Adapter: "argo-events", HealthPath: "/health", Timeout: 30 * time.Second,
			},
		},
		{
			spec: "/hooks/gitlab=http://receiver:8080;buffer",
			want: Route{
				Prefix: "/hooks/gitlab", Upstream: &url.URL{Scheme: "http", Host: "receiver:8080"},
				Adapter: AdapterCustom, Buffer: true,
			},
		},
		{
			// ... unless the spec overrides them.
			spec: "/workflows=https://argo-server:2746/;insecure-skip-verify=false;timeout=0",
			want: Route{
				Prefix: "/workflows", Upstream: &url.URL{Scheme: "https", Host: "argo-server:2746", Path: "/"},
				Adapter: "argo-workflows", HealthPath: "/",
			},
		},
		{
			spec: "/=http://app-proxy:9090;timeout=5s;",
			want: Route{
				Prefix: "/", Upstream: &url.URL{Scheme: "http", Host: "app-proxy:9090"},
				Adapter: "app-proxy", HealthPath: "/healthz", Timeout: 5 * time.Second,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := ParseRoute(tc.spec)
			if err != nil {
				t.Fatalf("ParseRoute(%q): %v", tc.spec, err)
			}
			if got.String() != tc.want.String() || got.Adapter != tc.want.Adapter || got.HealthPath != tc.want.HealthPath ||
				got.InsecureSkipVerify != tc.want.InsecureSkipVerify || got.Buffer != tc.want.Buffer {
				t.Errorf("ParseRoute(%q)\n got %s adapter %q health %q insecure %v buffer %v\nwant %s adapter %q health %q insecure %v buffer %v",
					tc.spec, got, got.Adapter, got.HealthPath, got.InsecureSkipVerify, got.Buffer,
					tc.want, tc.want.Adapter, tc.want.HealthPath, tc.want.InsecureSkipVerify, tc.want.Buffer)
			}
		})
	}
}

func TestParseRouteErrors(t *testing.T) {
	tests := []struct {
		spec string
		want string // the whole error
	}{
		{"/x=ftp://h", `route "/x=ftp://h": upstream scheme "ftp" not supported; want http or https`},
		{"/x", `route "/x": missing "="; want PREFIX=URL[;timeout=DURATION][;insecure-skip-verify][;buffer]`},
		{"x=http://h", `route "x=http://h": prefix "x" must start with "/"`},
		{"/a//b=http://h", `route "/a//b=http://h": prefix "/a//b" has an empty segment; want e.g. /argo-cd`},
		{"/a/../b=http://h", `route "/a/../b=http://h": prefix "/a/../b" has a ".." segment; want e.g. /argo-cd`},
		{"/a b=http://h", `route "/a b=http://h": prefix "/a b" has the character ' '; want letters, digits and -._~`},
		{"/x=", `route "/x=": upstream URL is empty; want e.g. http://argocd-server:80`},
		{"/x=argocd-server:80", `route "/x=argocd-server:80": upstream "argocd-server:80" has no scheme; want http:// or https://, e.g. http://argocd-server:80`},
		{"/x=argocd-server", `route "/x=argocd-server": upstream "argocd-server" has no scheme; want http:// or https://, e.g. http://argocd-server:80`},
		{"/x=http://", `route "/x=http://": upstream "http:" has no host; want e.g. http://argocd-server:80`},
		{"/x=http://u:secret@h", `route "/x=http://u:secret@h": upstream "http://u:xxxxx@h" has user info; credentials do not belong in a route`},
		{"/x=http://h/?a=b", `route "/x=http://h/?a=b": upstream "http://h/?a=b" has a query; want scheme://host[:port][/path]`},
		{"/x=http://h/#f", `route "/x=http://h/#f": upstream "http://h/#f" has a fragment; want scheme://host[:port][/path]`},
		{"/x=http://:80", `route "/x=http://:80": upstream "http://:80" has no host; want e.g. http://argocd-server:80`},
		{"/x=http://h:0", `route "/x=http://h:0": upstream "http://h:0" has port "0"; want 1-65535`},
		{"/x=http://h;timeout=soon", `route "/x=http://h;timeout=soon": timeout "soon" is not a duration; want e.g. 30s, or 0 for none`},
		{"/x=http://h;timeout=-1s", `route "/x=http://h;timeout=-1s": timeout "-1s" is not a duration; want e.g. 30s, or 0 for none`},
		{"/x=http://h;insecure-skip-verify=maybe", `route "/x=http://h;insecure-skip-verify=maybe": insecure-skip-verify="maybe" is not a boolean; want true or false`},
		{"/x=http://h;retries=3", `route "/x=http://h;retries=3": unknown option "retries=3"; want timeout=DURATION, insecure-skip-verify or buffer`},
		{"/x=http://h;buffer=later", `route "/x=http://h;buffer=later": buffer="later" is not a boolean; want true or false`},
		{"/x=http://h;=1", `route "/x=http://h;=1": option "=1" has no name; want timeout=DURATION, insecure-skip-verify or buffer`},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			_, err := ParseRoute(tc.spec)
			if err == nil {
				t.Fatalf("ParseRoute(%q): no error, want %q", tc.spec, tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("ParseRoute(%q) error\n got %q\nwant %q", tc.spec, err, tc.want)
			}
		})
	}
}

// TestRouteStringRoundTrip: String writes what ParseRoute reads back into
// the same route, settings that differ from the prefix's adapter included.
func TestRouteStringRoundTrip(t *testing.T) {
	routes := append(DefaultRoutes(),
		Route{Prefix: "/c", Upstream: mustURL(t, "https://h:1/a%2Fb/"), Timeout: time.Millisecond, Adapter: AdapterCustom},
		Route{Prefix: "/hooks", Upstream: mustURL(t, "http://h:1"), Adapter: AdapterCustom, Buffer: true},
	)
	workflows, err := ParseRoute("/workflows=https://argo-server:2746/;insecure-skip-verify=false")
	if err != nil {
		t.Fatal(err)
	}
	webhooks, err := ParseRoute("/webhooks=http://es:12000/;buffer=false")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range append(routes, workflows, webhooks) {
		got, err := ParseRoute(r.String())
		if err != nil {
			t.Fatalf("ParseRoute(%q): %v", r.String(), err)
		}
		if got.String() != r.String() || got.Adapter != r.Adapter || got.HealthPath != r.HealthPath ||
			got.InsecureSkipVerify != r.InsecureSkipVerify || got.Buffer != r.Buffer || got.Timeout != r.Timeout {
			t.Errorf("ParseRoute(%q) = %s (%s, %q, insecure %v, buffer %v), want %s (%s, %q, insecure %v, buffer %v)",
				r.String(), got, got.Adapter, got.HealthPath, got.InsecureSkipVerify, got.Buffer,
				r, r.Adapter, r.HealthPath, r.InsecureSkipVerify, r.Buffer)
		}
	}
}

// TestDefaultWebhooksRouteSpec: the default /webhooks route buffers, and is
// advertised in the form servers that predate the buffer option accept.
func TestDefaultWebhooksRouteSpec(t *testing.T) {
	for _, r := range DefaultRoutes() {
		if r.Buffer != (r.Prefix == "/webhooks") {
			t.Errorf("default route %s: buffer %v, want it on /webhooks only", r.Prefix, r.Buffer)
		}
		if strings.Contains(r.String(), "buffer") {
			t.Errorf("default route %s is advertised as %q; want no buffer option", r.Prefix, r)
		}
	}
}

func TestBuffered(t *testing.T) {
	specs := []string{
		"/=http://app-proxy:8080",
		"/webhooks=http://es:12000/",
		"/webhooks/ci=http://ci:80;buffer=false",
		"/hooks=http://receiver:8080;buffer",
	}
	tests := []struct {
		target string
		want   bool
	}{
		{"/webhooks", true},
		{"/webhooks/github?x=1", true},
		{"/webhooks/ci/push", false}, // the longer prefix wins
		{"/webhooks/cix", true},      // segment boundaries
		{"/hooks/a%2Fb", true},
		{"/webhooksx", false},
		{"/", false},
		{"/webhooks/../x", false}, // the router refuses it
		{"/hooks%2Fx", false},     // an escaped slash ends no prefix
	}
	for _, tc := range tests {
		u, err := url.ParseRequestURI(tc.target)
		if err != nil {
			t.Fatal(err)
		}
		if got := Buffered(specs, u); got != tc.want {
			t.Errorf("Buffered(%q) = %v, want %v", tc.target, got, tc.want)
		}
	}
	if Buffered(append(specs, "/bad=ftp://x"), mustURL(t, "/webhooks")) {
		t.Error("Buffered with a spec that does not parse: got true, want false")
	}
	if Buffered(nil, mustURL(t, "/webhooks")) {
		t.Error("Buffered without routes: got true, want false")
	}
}

func TestHealthURL(t *testing.T) {
	tests := []struct {
		upstream, health, want string
	}{
		{"http://argocd-server:80", "/argo-cd/healthz", "http://argocd-server:80/argo-cd/healthz"},
		{"https://argo-server:2746/", "/", "https://argo-server:2746/"},
		{"http://es:12000/", "/health", "http://es:12000/health"},
		{"http://h/base", "/healthz?full=true", "http://h/base/healthz?full=true"},
		{"http://h", "", ""},
	}
	for _, tc := range tests {
		r := Route{Upstream: mustURL(t, tc.upstream), HealthPath: tc.health}
		got := ""
		if u := r.HealthURL(); u != nil {
			got = u.String()
		}
		if got != tc.want {
			t.Errorf("HealthURL(%q, %q) = %q, want %q", tc.upstream, tc.health, got, tc.want)
		}
	}
}

func TestDialAddr(t *testing.T) {
	tests := []struct{ upstream, want string }{
		{"http://argocd-server", "argocd-server:80"},
		{"http://argocd-server:80", "argocd-server:80"},
		{"https://argo-server/", "argo-server:443"},
		{"https://argo-server:2746/", "argo-server:2746"},
		{"http://app-proxy.ns.svc:8080/base", "app-proxy.ns.svc:8080"},
		{"http://10.0.0.7", "10.0.0.7:80"},
		{"https://[fd00::7]", "[fd00::7]:443"},
		{"http://[fd00::7]:8080", "[fd00::7]:8080"},
	}
	for _, tc := range tests {
		if got := (Route{Upstream: mustURL(t, tc.upstream)}).DialAddr(); got != tc.want {
			t.Errorf("DialAddr(%q) = %q, want %q", tc.upstream, got, tc.want)
		}
	}
}

func TestNewRouterValidation(t *testing.T) {
	up := mustURL(t, "http://h:1")
	tests := []struct {
		name   string
		routes []Route
		opts   Options
		want   []string // each must appear in the error
	}{
		{"no routes", nil, Options{}, []string{"no routes; want at least one"}},
		{
			"duplicate prefixes after normalization",
			[]Route{{Prefix: "/a", Upstream: up}, {Prefix: "/a/", Upstream: up}},
			Options{},
			[]string{`route "/a": duplicate prefix`},
		},
		{
			"every problem reported",
			[]Route{
				{Prefix: "a", Upstream: up},
				{Prefix: "/b"},
				{Prefix: "/c", Upstream: mustURL(t, "http://u:p@h")},
				{Prefix: "/d", Upstream: mustURL(t, "http://h?q")},
				{Prefix: "/e", Upstream: mustURL(t, "/relative")},
				{Prefix: "/f", Upstream: up, Timeout: -time.Second},
				{Prefix: "/g", Upstream: up, HealthPath: "healthz"},
			},
			Options{DialTimeout: -1},
			[]string{
				`route "a": prefix "a" must start with "/"`,
				`route "/b": upstream URL is missing`,
				`route "/c": upstream "http://u:xxxxx@h" has user info`,
				`route "/d": upstream "http://h?q" has a query`,
				`route "/e": upstream "/relative" has no scheme`,
				`route "/f": timeout -1s is negative`,
				`route "/g": health path "healthz" must start with "/"`,
				`dial timeout -1ns is negative`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRouter(tc.routes, nil, tc.opts)
			if err == nil {
				t.Fatal("NewRouter: no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("NewRouter error %q\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

func TestRoutesNormalizedAndCopied(t *testing.T) {
	up := mustURL(t, "http://h:1")
	r, err := NewRouter([]Route{{Prefix: "/b/", Upstream: up}, {Prefix: "/", Upstream: up, Adapter: "app-proxy"}}, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	up.Host = "changed:1" // the caller's URL is not shared

	got := r.Routes()
	if len(got) != 2 || got[0].Prefix != "/b" || got[0].Adapter != AdapterCustom || got[1].Prefix != "/" {
		t.Fatalf("Routes() = %v, want [/b (custom), / (app-proxy)] in the order given", got)
	}
	if got[0].Upstream.Host != "h:1" {
		t.Errorf("route upstream host = %q, want %q", got[0].Upstream.Host, "h:1")
	}
	got[0].Upstream.Host = "mutated:1"
	if again := r.Routes(); again[0].Upstream.Host != "h:1" {
		t.Errorf("Routes() shares its URLs with the router: host %q after mutation", again[0].Upstream.Host)
	}
	r.Close()
}
