package client

import (
	"net/url"
	"os"
	"slices"
	"strings"
)

// redacted stands for a proxy's credentials wherever its value is shown.
const redacted = "[redacted]"

// RedactProxy returns an egress proxy value (--proxy, HTTPS_PROXY,
// ALL_PROXY) fit for an error, a log line, /status or a diagnose bundle:
// everything before the last "@" (after the scheme) is user info and becomes
// [redacted], the user name included, whether or not the value parses as a
// URL: "http://user:pass@proxy:3128", "user:pass@proxy:3128", a password
// with a raw "@", "/" or "#" in it, a percent-encoded one.
//
// A port that is not a number is most likely a password whose host was
// forgotten ("http://user:pass"), so it is redacted too, with whatever
// follows it.
func RedactProxy(s string) string {
	p := splitProxy(s)
	var b strings.Builder
	b.WriteString(p.scheme)
	if p.hasUser {
		b.WriteString(redacted + "@")
	}
	b.WriteString(p.host)
	if p.badPort != "" {
		b.WriteString(":" + redacted)
	} else {
		b.WriteString(p.rest)
	}
	return b.String()
}

// redactURL is RedactProxy for a parsed proxy URL.
func redactURL(u *url.URL) string { return RedactProxy(u.String()) }

// ProxySecrets returns what RedactProxy hides of the proxy values the client
// reads (--proxy, HTTPS_PROXY and ALL_PROXY with their lower-case variants,
// through cfg.Getenv) and of HTTP_PROXY, which an http:// request from
// `tether diagnose` may use: each user info and password as written and
// percent-decoded, longest first. A support bundle removes them from every
// file, as a last line of defence, the way it removes the token.
func ProxySecrets(cfg Config) []string {
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	values := []string{cfg.Proxy}
	for _, name := range append([]string{"HTTP_PROXY", "http_proxy"}, proxyEnv...) {
		values = append(values, getenv(name))
	}
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if dec, err := url.PathUnescape(s); err == nil && dec != s {
			out = append(out, dec)
		}
	}
	for _, v := range values {
		p := splitProxy(v)
		if p.hasUser {
			add(p.userinfo)
			if _, pass, ok := strings.Cut(p.userinfo, ":"); ok {
				add(pass)
			}
		}
		if p.badPort != "" {
			add(p.badPort)
		}
	}
	// Longest first, so that a password inside a user info does not break
	// the user info's replacement.
	slices.SortFunc(out, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b) // duplicates side by side, for Compact
	})
	return slices.Compact(out)
}

// proxyParts is a proxy value cut where RedactProxy cuts it.
type proxyParts struct {
	scheme   string // "http://", or "" when the value has no valid scheme
	userinfo string // before the last "@"
	hasUser  bool   // there is an "@"
	host     string // host, with its port when that is a number
	badPort  string // a port that is not a number, and all after it
	rest     string // path, query, fragment: from the first "/", "?" or "#" after the host
}

func splitProxy(s string) proxyParts {
	var p proxyParts
	if i := strings.Index(s, "://"); i > 0 && isScheme(s[:i]) {
		p.scheme, s = s[:i+3], s[i+3:]
	}
	// The last "@", as url.Parse finds it: a password may hold "@" (and "/",
	// "?", "#", which url.Parse would take for the end of the host).
	if i := strings.LastIndex(s, "@"); i >= 0 {
		p.userinfo, p.hasUser, s = s[:i], true, s[i+1:]
	}
	if i := strings.IndexAny(s, "/?#"); i >= 0 {
		s, p.rest = s[:i], s[i:]
	}
	p.host = s
	// The port follows the last ":", after the "]" of an IPv6 literal.
	hostEnd := strings.LastIndex(s, "]") + 1
	if i := strings.LastIndex(s[hostEnd:], ":"); i >= 0 {
		i += hostEnd
		if port := s[i+1:]; !isDigits(port) {
			p.host, p.badPort = s[:i], port+p.rest
		}
	}
	return p
}

// isScheme reports whether s is an RFC 3986 scheme.
func isScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
