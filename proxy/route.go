package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// AdapterCustom is the Adapter name of a route whose prefix matches no
// default adapter.
const AdapterCustom = "custom"

// Route maps a path prefix to one upstream.
//
// The upstream URL's path decides how the request path is forwarded, as
// nginx's proxy_pass does:
//
//   - no path ("http://argocd-server:80"): the request path is forwarded
//     unchanged, prefix included;
//   - any path, even "/" ("https://argo-server:2746/"): the matched prefix is
//     replaced by that path ("/workflows/api/v1" → "/api/v1"), joined without
//     a double slash, and X-Forwarded-Prefix tells the upstream what was
//     removed.
//
// Escaping is preserved (an escaped slash "%2F" stays escaped and is never a
// segment boundary) and the query string is always forwarded as received.
type Route struct {
	// Prefix is the path prefix this route serves, matched on segment
	// boundaries: "/argo-cd" matches "/argo-cd" and "/argo-cd/x", never
	// "/argo-cdx". "/" matches every path no longer route matches. Segments
	// use letters, digits and "-._~"; a trailing slash is dropped.
	Prefix string

	// Upstream is the absolute http or https URL requests are sent to, without
	// user info, query or fragment. Its path follows the rule above.
	Upstream *url.URL

	// Timeout bounds the wait for the upstream's response headers, counted
	// from the moment the request (body included) has been written, so a
	// slow upload is never cut short. Zero means no bound, which routes that
	// stream (watch responses, server-sent events, long polls) need. It does
	// not bound the body: a response may stream for as long as both sides
	// keep it open.
	Timeout time.Duration

	// InsecureSkipVerify turns off certificate verification for an https
	// upstream, for in-cluster services with self-signed certificates
	// (argo-server's default). It has no effect on http upstreams.
	InsecureSkipVerify bool

	// Adapter names the component behind the route ("app-proxy", "argo-cd",
	// ...) or is AdapterCustom. It appears in logs, error bodies and metric
	// labels. Empty means AdapterCustom.
	Adapter string

	// HealthPath is a path, relative to the upstream URL, that answers a
	// health check with a 2xx status; empty means the upstream has none.
	// The router does not use it; diagnostics call HealthURL.
	HealthPath string

	// Buffer asks the tunnel server to store POST, PUT and PATCH requests
	// for this route that cannot reach its upstream (the tunnel is down, or
	// the upstream refused the connection), answer them 202 Accepted, and
	// deliver them in order when the upstream is back. Git providers do
	// not retry a failed webhook, and some disable a hook that keeps
	// failing, so an outage would otherwise lose events. The router does
	// not use it; the server reads it from the advertised routes
	// (Buffered).
	Buffer bool
}

// ParseRoute parses the value of the --route flag:
//
//	PREFIX=URL[;timeout=DURATION][;insecure-skip-verify[=BOOL]][;buffer[=BOOL]]
//
// for example "/argo-cd=http://argo-cd-server:80",
// "/workflows=https://argo-server:2746/;insecure-skip-verify;timeout=0" or
// "/hooks=http://receiver:8080;buffer".
// A route whose prefix is a default adapter's prefix (see Adapters) takes
// that adapter's name, health path, timeout, TLS and buffer settings, unless
// the spec sets them; any other route is AdapterCustom with no timeout, no
// health path and no buffer. Errors name the spec and say what is expected.
func ParseRoute(spec string) (Route, error) {
	r, err := parseRoute(spec)
	if err != nil {
		return Route{}, fmt.Errorf("route %q: %w", spec, err)
	}
	return r, nil
}

func parseRoute(spec string) (Route, error) {
	prefix, rest, ok := strings.Cut(spec, "=")
	if !ok {
		return Route{}, errors.New("missing \"=\"; want PREFIX=URL[;timeout=DURATION][;insecure-skip-verify][;buffer]")
	}
	prefix, err := cleanPrefix(prefix)
	if err != nil {
		return Route{}, err
	}
	parts := strings.Split(rest, ";")
	u, err := parseUpstream(parts[0])
	if err != nil {
		return Route{}, err
	}

	r := Route{Prefix: prefix, Upstream: u, Adapter: AdapterCustom}
	if a, ok := adapterByPrefix(prefix); ok {
		r.Adapter = a.Name
		r.HealthPath = a.HealthPath
		r.Timeout = a.Timeout
		r.InsecureSkipVerify = a.InsecureSkipVerify
		r.Buffer = a.Buffer
	}

	for _, opt := range parts[1:] {
		name, value, hasValue := strings.Cut(opt, "=")
		switch strings.TrimSpace(name) {
		case "timeout":
			d, err := time.ParseDuration(strings.TrimSpace(value))
			if err != nil || d < 0 {
				return Route{}, fmt.Errorf("timeout %q is not a duration; want e.g. 30s, or 0 for none", value)
			}
			r.Timeout = d
		case "insecure-skip-verify":
			if r.InsecureSkipVerify, err = flagOption("insecure-skip-verify", value, hasValue); err != nil {
				return Route{}, err
			}
		case "buffer":
			if r.Buffer, err = flagOption("buffer", value, hasValue); err != nil {
				return Route{}, err
			}
		case "":
			if opt != "" {
				return Route{}, fmt.Errorf("option %q has no name; want %s", opt, routeOptions)
			}
			// Tolerate an empty option, as in a trailing ";".
		default:
			return Route{}, fmt.Errorf("unknown option %q; want %s", opt, routeOptions)
		}
	}
	return r, nil
}

// routeOptions is what ParseRoute's errors say the options may be.
const routeOptions = "timeout=DURATION, insecure-skip-verify or buffer"

// flagOption reads the value of a boolean option: true when it has none.
func flagOption(name, value string, hasValue bool) (bool, error) {
	if !hasValue {
		return true, nil
	}
	b, err := strconv.ParseBool(strings.TrimSpace(value))
	if err != nil {
		return false, fmt.Errorf("%s=%q is not a boolean; want true or false", name, value)
	}
	return b, nil
}

// String formats r as a --route value that ParseRoute reads back into the
// same route (the health path and adapter come back from the prefix).
//
// The timeout is always written, insecure-skip-verify whenever it is on,
// and both it and buffer when they differ from what ParseRoute takes from
// the prefix's adapter. So the default /webhooks route, whose adapter
// buffers, is advertised without the buffer option, in a form servers that
// predate the option accept; a server that knows it takes it from the
// prefix.
func (r Route) String() string {
	var b strings.Builder
	b.WriteString(r.Prefix)
	b.WriteByte('=')
	if r.Upstream != nil {
		// ";" separates options; in a path it is the same as "%3B".
		b.WriteString(strings.ReplaceAll(r.Upstream.String(), ";", "%3B"))
	}
	b.WriteString(";timeout=")
	b.WriteString(r.Timeout.String())
	a, _ := adapterByPrefix(r.Prefix)
	switch {
	case r.InsecureSkipVerify:
		b.WriteString(";insecure-skip-verify")
	case a.InsecureSkipVerify:
		b.WriteString(";insecure-skip-verify=false")
	}
	switch {
	case r.Buffer && !a.Buffer:
		b.WriteString(";buffer")
	case !r.Buffer && a.Buffer:
		b.WriteString(";buffer=false")
	}
	return b.String()
}

// Buffered reports whether the route that the route specs of a tunnel (as
// its client advertised them, see Route.String) give the request target u
// has the buffer option: the route with the longest prefix that matches, as
// a Router picks it. It is false when no route matches, when u is a target
// the router refuses (a dot segment, not an absolute path), and when any
// spec does not parse: the server refuses such routes at login, so they
// never served.
func Buffered(specs []string, u *url.URL) bool {
	rp, err := splitPath(u)
	if err != nil {
		return false
	}
	var best *Route
	for _, spec := range specs {
		r, err := ParseRoute(spec)
		if err != nil {
			return false
		}
		if hasSegmentPrefix(rp.match, r.Prefix) && (best == nil || len(r.Prefix) > len(best.Prefix)) {
			best = &r
		}
	}
	return best != nil && best.Buffer
}

// DialAddr is the address the route's upstream is dialled at, HOST:PORT,
// with the scheme's default port (80 for http, 443 for https) when the URL
// names none. It is the one answer to "where does this route connect": the
// router's transports dial it, and a tether client accepts a dial request
// only for the DialAddr of one of its own routes. r.Upstream must be set,
// as ParseRoute and NewRouter ensure.
func (r Route) DialAddr() string {
	port := r.Upstream.Port()
	if port == "" {
		port = "80"
		if r.Upstream.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(r.Upstream.Hostname(), port)
}

// HealthURL returns the absolute URL of the route's health check, the
// upstream URL joined with HealthPath, or nil if the route has none.
func (r Route) HealthURL() *url.URL {
	if r.HealthPath == "" || r.Upstream == nil {
		return nil
	}
	hp, err := url.Parse(r.HealthPath)
	if err != nil {
		return nil
	}
	u := *r.Upstream
	u.Path = joinPath(u.Path, hp.Path)
	u.RawPath = ""
	if r.Upstream.RawPath != "" || hp.RawPath != "" {
		u.RawPath = joinPath(r.Upstream.EscapedPath(), hp.EscapedPath())
	}
	u.RawQuery = hp.RawQuery
	return &u
}

// cleanPrefix validates a route prefix and returns it without a trailing
// slash ("/" stays "/").
func cleanPrefix(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("prefix %q must start with \"/\"", p)
	}
	if p == "/" {
		return p, nil
	}
	p = strings.TrimSuffix(p, "/")
	for seg := range strings.SplitSeq(p[1:], "/") {
		switch seg {
		case "":
			return "", fmt.Errorf("prefix %q has an empty segment; want e.g. /argo-cd", p)
		case ".", "..":
			return "", fmt.Errorf("prefix %q has a %q segment; want e.g. /argo-cd", p, seg)
		}
		for i := 0; i < len(seg); i++ {
			if !isPrefixByte(seg[i]) {
				return "", fmt.Errorf("prefix %q has the character %q; want letters, digits and -._~", p, seg[i])
			}
		}
	}
	return p, nil
}

// isPrefixByte reports whether c is an RFC 3986 unreserved character: a
// prefix made of them reads the same escaped and unescaped.
func isPrefixByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// parseUpstream parses and validates an upstream URL.
func parseUpstream(s string) (*url.URL, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("upstream URL is empty; want e.g. http://argocd-server:80")
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("upstream %q is not a URL; want e.g. http://argocd-server:80", s)
	}
	if err := validateUpstream(u); err != nil {
		return nil, err
	}
	return u, nil
}

// validateUpstream checks that u is something the router may dial.
func validateUpstream(u *url.URL) error {
	switch {
	case u == nil:
		return errors.New("upstream URL is missing; want e.g. http://argocd-server:80")
	case u.Scheme == "" || u.Opaque != "" && u.Host == "" && !strings.HasPrefix(u.Opaque, "/"):
		// "argocd-server" or "argocd-server:80" (which parses as scheme
		// "argocd-server").
		return fmt.Errorf("upstream %q has no scheme; want http:// or https://, e.g. http://argocd-server:80", u.Redacted())
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("upstream scheme %q not supported; want http or https", u.Scheme)
	case u.Opaque != "" || u.Hostname() == "":
		return fmt.Errorf("upstream %q has no host; want e.g. %s://argocd-server:80", u.Redacted(), u.Scheme)
	case u.User != nil:
		return fmt.Errorf("upstream %q has user info; credentials do not belong in a route", u.Redacted())
	case u.RawQuery != "" || u.ForceQuery:
		return fmt.Errorf("upstream %q has a query; want scheme://host[:port][/path]", u.Redacted())
	case u.Fragment != "":
		return fmt.Errorf("upstream %q has a fragment; want scheme://host[:port][/path]", u.Redacted())
	case u.Path != "" && !strings.HasPrefix(u.Path, "/"):
		return fmt.Errorf("upstream %q has a relative path; want scheme://host[:port][/path]", u.Redacted())
	}
	if u.Port() != "" {
		if n, err := strconv.Atoi(u.Port()); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("upstream %q has port %q; want 1-65535", u.Redacted(), u.Port())
		}
	}
	return nil
}
