package proxy

import (
	"errors"
	"net/url"
	"testing"
)

func TestHasSegmentPrefix(t *testing.T) {
	tests := []struct {
		path, prefix string
		want         bool
	}{
		{"/argo-cd", "/argo-cd", true},
		{"/argo-cd/", "/argo-cd", true},
		{"/argo-cd/x", "/argo-cd", true},
		{"/argo-cdx", "/argo-cd", false},
		{"/argo", "/argo-cd", false},
		{"/ARGO-CD", "/argo-cd", false},
		{"/a/b/c", "/a/b", true},
		{"/a/bc", "/a/b", false},
		{"/anything", "/", true},
		{"/", "/", true},
		{"/argo-cd%2Fx", "/argo-cd", false}, // match form keeps escaped slashes
	}
	for _, tc := range tests {
		if got := hasSegmentPrefix(tc.path, tc.prefix); got != tc.want {
			t.Errorf("hasSegmentPrefix(%q, %q) = %v, want %v", tc.path, tc.prefix, got, tc.want)
		}
	}
}

func TestSplitPath(t *testing.T) {
	tests := []struct {
		target  string
		match   string
		wantErr error
	}{
		{"/a/b", "/a/b", nil},
		{"/a%2Fb/c", "/a%2Fb/c", nil},
		{"/a%2fb", "/a%2Fb", nil},
		{"/%61rgo-cd/x", "/argo-cd/x", nil}, // needless escapes decode
		{"/a/.well-known/x", "/a/.well-known/x", nil},
		{"/a/..b/c.", "/a/..b/c.", nil},
		{"http://evil.internal", "/", nil},
		{"http://evil.internal/x?y", "/x", nil},
		{"/a/../b", "", errDotSegment},
		{"/a/./b", "", errDotSegment},
		{"/a/..", "", errDotSegment},
		{"/.", "", errDotSegment},
		{"/a/%2e%2e/b", "", errDotSegment},
		{"/a/%2E/b", "", errDotSegment},
		{"/a/%2e%2e%2Fb", "", errDotSegment},
		{"*", "", errBadPath},
	}
	for _, tc := range tests {
		t.Run(tc.target, func(t *testing.T) {
			u, err := url.ParseRequestURI(tc.target)
			if err != nil {
				t.Fatalf("ParseRequestURI(%q): %v", tc.target, err)
			}
			rp, err := splitPath(u)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("splitPath(%q) error = %v, want %v", tc.target, err, tc.wantErr)
			}
			if err == nil && rp.match != tc.match {
				t.Errorf("splitPath(%q).match = %q, want %q", tc.target, rp.match, tc.match)
			}
		})
	}
}

// TestRewrite pins the nginx proxy_pass rule: an upstream URL without a path
// keeps the request path; with a path, the prefix is replaced by it.
func TestRewrite(t *testing.T) {
	tests := []struct {
		prefix, upstream, target string
		wantURI                  string // path and escaping as sent upstream
	}{
		// Kept: no path in the upstream URL.
		{"/argo-cd", "http://u", "/argo-cd/api/v1?watch=1", "/argo-cd/api/v1"},
		{"/argo-cd", "http://u", "/argo-cd", "/argo-cd"},
		{"/", "http://u", "/", "/"},
		{"/", "http://u", "/x/y/", "/x/y/"},
		{"/argo-cd", "http://u", "/argo-cd/a%2Fb/c%20d", "/argo-cd/a%2Fb/c%20d"},
		// Stripped: upstream path "/".
		{"/workflows", "https://u/", "/workflows/api/v1/info", "/api/v1/info"},
		{"/workflows", "https://u/", "/workflows", "/"},
		{"/workflows", "https://u/", "/workflows/", "/"},
		{"/workflows", "https://u/", "/workflows//x", "//x"},
		{"/workflows", "https://u/", "/workflows/a%2Fb/c", "/a%2Fb/c"},
		{"/workflows", "https://u/", "/workflows/a%2fb", "/a%2fb"},
		{"/workflows", "https://u/", "/workflows/a b", "/a%20b"},
		{"/a/b", "https://u/", "/a/b/c%2Fd/e", "/c%2Fd/e"},
		{"/a/b", "https://u/", "/a/b", "/"},
		{"/a/b", "https://u/", "/%61/b/c%2Fd", "/c%2Fd"},
		// Replaced: upstream with a longer path, with or without a slash.
		{"/webhooks", "http://u/hooks", "/webhooks/push", "/hooks/push"},
		{"/webhooks", "http://u/hooks/", "/webhooks/push", "/hooks/push"},
		{"/webhooks", "http://u/hooks", "/webhooks", "/hooks"},
		{"/webhooks", "http://u/hooks/", "/webhooks", "/hooks/"},
		{"/webhooks", "http://u/a%2Fb/", "/webhooks/c", "/a%2Fb/c"},
		{"/webhooks", "http://u/a%2Fb/", "/webhooks/c%2Fd", "/a%2Fb/c%2Fd"},
		{"/", "http://u/base", "/x", "/base/x"},
		{"/", "http://u/base/", "/", "/base/"},
	}
	for _, tc := range tests {
		t.Run(tc.prefix+"→"+tc.upstream+tc.target, func(t *testing.T) {
			in, err := url.ParseRequestURI(tc.target)
			if err != nil {
				// "a b" is not a valid request URI; build it as a server would
				// not, but as a handler could receive it from another router.
				in = &url.URL{Path: tc.target}
			}
			rp, err := splitPath(in)
			if err != nil {
				t.Fatalf("splitPath(%q): %v", tc.target, err)
			}
			if !hasSegmentPrefix(rp.match, tc.prefix) {
				t.Fatalf("%q does not match prefix %q", tc.target, tc.prefix)
			}
			out := &url.URL{}
			out.Path, out.RawPath = rewrite(rp, tc.prefix, mustURL(t, tc.upstream))
			if got := out.EscapedPath(); got != tc.wantURI {
				t.Errorf("rewrite(%q, prefix %q, upstream %q) = %q (path %q, raw %q), want %q",
					tc.target, tc.prefix, tc.upstream, got, out.Path, out.RawPath, tc.wantURI)
			}
		})
	}
}

func TestJoinPath(t *testing.T) {
	tests := []struct{ base, rest, want string }{
		{"", "", ""},
		{"", "/x", "/x"},
		{"/", "", "/"},
		{"/", "/x", "/x"},
		{"/a", "/x", "/a/x"},
		{"/a/", "/x", "/a/x"},
		{"/a/", "x", "/a/x"},
		{"/a", "//x", "/a//x"},
	}
	for _, tc := range tests {
		if got := joinPath(tc.base, tc.rest); got != tc.want {
			t.Errorf("joinPath(%q, %q) = %q, want %q", tc.base, tc.rest, got, tc.want)
		}
	}
}
