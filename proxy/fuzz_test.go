package proxy

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzParseRoute checks that ParseRoute never panics, that what it accepts
// NewRouter accepts too, and that String gives back the same route.
func FuzzParseRoute(f *testing.F) {
	for _, s := range []string{
		"/argo-cd=http://argo-cd-server:80",
		"/workflows=https://argo-server:2746/;insecure-skip-verify;timeout=0",
		"/x=http://h/a%2Fb/;timeout=1m30s;insecure-skip-verify=false",
		"/=http://[::1]:8080",
		"/x=ftp://h",
		"=",
		"/x=http://h;;",
		"/webhooks=http://es:12000/;buffer=false",
		"/workflows=https://argo-server:2746/;insecure-skip-verify=0",
		"/hooks=http://h;buffer",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		r, err := ParseRoute(spec)
		if err != nil {
			return
		}
		rt, err := NewRouter([]Route{r}, nil, Options{})
		if err != nil {
			t.Fatalf("ParseRoute(%q) = %s, which NewRouter rejects: %v", spec, r, err)
		}
		rt.Close()
		again, err := ParseRoute(r.String())
		if err != nil {
			t.Fatalf("ParseRoute(%q) = %s, which does not parse again: %v", spec, r, err)
		}
		if again.String() != r.String() || again.Adapter != r.Adapter || again.HealthPath != r.HealthPath ||
			again.Timeout != r.Timeout || again.InsecureSkipVerify != r.InsecureSkipVerify || again.Buffer != r.Buffer {
			t.Fatalf("ParseRoute(%q) = %s, which parses again as %s", spec, r, again)
		}
	})
}

// FuzzRoutePath checks matching and rewriting on arbitrary request targets:
// no panic, a kept prefix forwards the path exactly, and a rewritten path's
// escaping is always a valid encoding of it.
func FuzzRoutePath(f *testing.F) {
	for _, s := range []string{
		"/", "/argo-cd", "/argo-cd/", "/argo-cdx", "/argo-cd/a%2Fb", "/workflows//x",
		"/a/../b", "/%2e%2e/", "/a%2F..%2Fb", "http://evil/x", "*", "/a?b=c", "/%zz",
	} {
		f.Add(s)
	}
	prefixes := []string{"/", "/argo-cd", "/workflows", "/a/b"}
	upstreams := []*url.URL{
		{Scheme: "http", Host: "u"},
		{Scheme: "http", Host: "u", Path: "/"},
		{Scheme: "http", Host: "u", Path: "/base"},
		{Scheme: "http", Host: "u", Path: "/a/b", RawPath: "/a%2Fb"},
	}
	f.Fuzz(func(t *testing.T, target string) {
		in, err := url.ParseRequestURI(target)
		if err != nil {
			return
		}
		rp, err := splitPath(in)
		if err != nil {
			return
		}
		if hasDotSegment(rp.decoded) && rp.escaped == "" {
			t.Fatalf("splitPath(%q) accepted dot segments", target)
		}
		for _, prefix := range prefixes {
			if !hasSegmentPrefix(rp.match, prefix) {
				continue
			}
			for _, up := range upstreams {
				path, rawPath := rewrite(rp, prefix, up)
				out := &url.URL{Path: path, RawPath: rawPath}
				if rawPath != "" && out.EscapedPath() != rawPath {
					t.Fatalf("rewrite(%q, %q, %s): raw path %q is not an encoding of %q", target, prefix, up, rawPath, path)
				}
				if !strings.HasPrefix(path, "/") {
					t.Fatalf("rewrite(%q, %q, %s) = %q, want an absolute path", target, prefix, up, path)
				}
				if up.Path == "" && out.EscapedPath() != (&url.URL{Path: rp.decoded, RawPath: rp.escaped}).EscapedPath() {
					t.Fatalf("rewrite(%q, %q, %s) = %q, want the path unchanged", target, prefix, up, out.EscapedPath())
				}
				if up.Path != "" && !strings.HasPrefix(out.EscapedPath(), up.EscapedPath()) {
					t.Fatalf("rewrite(%q, %q, %s) = %q, want it under %q", target, prefix, up, out.EscapedPath(), up.EscapedPath())
				}
			}
		}
	})
}
