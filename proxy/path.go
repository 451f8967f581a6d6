package proxy

import (
	"errors"
	"net/url"
	"strings"
)

// errDotSegment rejects request paths with "." or ".." segments. Browsers and
// HTTP clients resolve them before sending, so only a hand-made request has
// them, and such a request could otherwise be matched to one route while an
// upstream that cleans paths serves it as another (the tunnel server may
// treat /webhooks differently from the rest).
var errDotSegment = errors.New("path has a \".\" or \"..\" segment")

// errBadPath rejects request targets that are not an absolute path, such as
// "*" (OPTIONS *) or an opaque URI.
var errBadPath = errors.New("request target is not an absolute path")

// reqPath is a request path split the way routes are matched against it.
type reqPath struct {
	// match is the decoded path in which only literal slashes separate
	// segments: an escaped slash in a segment stays "%2F", so it can never
	// complete a prefix.
	match string
	// escaped is the path as received (RawPath) when it differs from the
	// default escaping of the decoded path, "" otherwise.
	escaped string
	// decoded is the decoded path.
	decoded string
}

// splitPath validates u's path for routing.
func splitPath(u *url.URL) (reqPath, error) {
	if u.Opaque != "" {
		return reqPath{}, errBadPath
	}
	p := u.Path
	if p == "" {
		// An absolute-form target without a path ("GET http://h HTTP/1.1").
		p = "/"
	}
	if p[0] != '/' {
		return reqPath{}, errBadPath
	}
	// RawPath matters only when it is a valid encoding of Path that differs
	// from the default one (as with "%2F"); otherwise Go sends Path escaped
	// afresh, and every slash in Path is a literal one.
	if u.RawPath == "" || u.EscapedPath() != u.RawPath {
		if hasDotSegment(p) {
			return reqPath{}, errDotSegment
		}
		return reqPath{match: p, decoded: p}, nil
	}
	esc := u.RawPath
	var b strings.Builder
	b.Grow(len(esc))
	for seg := range strings.SplitSeq(esc[1:], "/") {
		dec, err := url.PathUnescape(seg)
		if err != nil {
			return reqPath{}, errBadPath
		}
		// An escaped slash is data, not a separator, but an upstream that
		// decodes it before cleaning the path would see dot segments too.
		if hasDotSegment("/" + dec) {
			return reqPath{}, errDotSegment
		}
		b.WriteByte('/')
		b.WriteString(strings.ReplaceAll(dec, "/", "%2F"))
	}
	return reqPath{match: b.String(), escaped: esc, decoded: p}, nil
}

// hasDotSegment reports whether the slash-separated path p has a "." or ".."
// segment.
func hasDotSegment(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] != '/' || i+1 >= len(p) || p[i+1] != '.' {
			continue
		}
		rest := p[i+2:]
		if rest == "" || rest[0] == '/' || rest[0] == '.' && (len(rest) == 1 || rest[1] == '/') {
			return true
		}
	}
	return false
}

// hasSegmentPrefix reports whether path p starts with prefix on a segment
// boundary. prefix is clean: "/" or "/a/b" without a trailing slash.
func hasSegmentPrefix(p, prefix string) bool {
	if prefix == "/" {
		return true
	}
	return strings.HasPrefix(p, prefix) && (len(p) == len(prefix) || p[len(prefix)] == '/')
}

// rewrite computes the upstream path for a request path matched by a route
// with the given prefix: unchanged when the upstream URL has no path, else
// the prefix replaced by the upstream path. It returns the decoded path and,
// when escaping must be kept as received, the escaped one ("" otherwise).
func rewrite(rp reqPath, prefix string, upstream *url.URL) (path, rawPath string) {
	if upstream.Path == "" {
		return rp.decoded, rp.escaped
	}
	if rp.escaped == "" {
		rest := rp.decoded
		if prefix != "/" {
			rest = rest[len(prefix):]
		}
		path = joinPath(upstream.Path, rest)
		if upstream.RawPath != "" {
			rawPath = joinPath(upstream.EscapedPath(), (&url.URL{Path: rest}).EscapedPath())
		}
		return path, rawPath
	}
	// The prefix is made of unreserved characters, so it spans as many
	// literal segments in the escaped path as it has in the match form.
	rest := rp.escaped
	if prefix != "/" {
		rest = cutSegments(rest, strings.Count(prefix, "/"))
	}
	decRest, err := url.PathUnescape(rest)
	if err != nil {
		// splitPath unescaped every segment already; keep the decoded path.
		decRest = rest
	}
	return joinPath(upstream.Path, decRest), joinPath(upstream.EscapedPath(), rest)
}

// cutSegments drops the first n slash-led segments of p.
func cutSegments(p string, n int) string {
	i := 0
	for ; n > 0; n-- {
		j := strings.IndexByte(p[i+1:], '/')
		if j < 0 {
			return ""
		}
		i += j + 1
	}
	return p[i:]
}

// joinPath joins two paths with exactly one slash at the seam. An empty rest
// leaves base as it is ("/" stays "/", "/base" stays "/base").
func joinPath(base, rest string) string {
	switch {
	case rest == "":
		return base
	case rest[0] != '/':
		rest = "/" + rest
	}
	if strings.HasSuffix(base, "/") {
		return base + rest[1:]
	}
	return base + rest
}
