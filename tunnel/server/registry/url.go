package registry

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// target is a parsed --registry URL: where Redis is and how to log in.
type target struct {
	tls      bool
	addr     string // HOST:PORT
	db       int
	username string
	password string // from the URL; never printed
}

// String is the URL without its password, for logs and Status.
func (t target) String() string {
	u := url.URL{Scheme: "redis", Host: t.addr, Path: "/" + strconv.Itoa(t.db)}
	if t.tls {
		u.Scheme = "rediss"
	}
	if t.username != "" {
		u.User = url.User(t.username)
	}
	return u.String()
}

const urlForms = "want redis://HOST[:PORT][/DB] or rediss://HOST[:PORT][/DB] (TLS), or memory"

// parseURL parses a --registry URL. Its errors show the URL with any
// password masked.
func parseURL(raw string) (target, error) {
	shown := redact(raw)
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error quotes the whole URL, password included.
		return target{}, fmt.Errorf("--registry %q is not a URL: %s", shown, urlForms)
	}
	var t target
	switch u.Scheme {
	case "redis":
	case "rediss":
		t.tls = true
	default:
		return target{}, fmt.Errorf("--registry %q: %s", shown, urlForms)
	}
	if u.Opaque != "" || u.Host == "" {
		return target{}, fmt.Errorf("--registry %q has no host: %s", shown, urlForms)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return target{}, fmt.Errorf("--registry %q: options after '?' or '#' are not supported: %s", shown, urlForms)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return target{}, fmt.Errorf("--registry %q has no host: %s", shown, urlForms)
	}
	if port == "" {
		port = "6379"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return target{}, fmt.Errorf("--registry %q: port %q: want 1-65535", shown, port)
	}
	t.addr = net.JoinHostPort(host, port)
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return target{}, fmt.Errorf("--registry %q: database %q is not a number: %s", shown, db, urlForms)
		}
		t.db = n
	}
	if u.User != nil {
		t.username = u.User.Username()
		t.password, _ = u.User.Password()
	}
	return t, nil
}

// redact masks everything between the scheme and the last '@' of a URL,
// for error messages. Unlike url.URL.Redacted it also masks a password that
// keeps the URL from parsing, or that holds a '/' and so parses as a path.
func redact(raw string) string {
	at := strings.LastIndex(raw, "@")
	if at < 0 {
		return raw
	}
	start := 0
	if i := strings.Index(raw, "://"); i >= 0 && i < at {
		start = i + len("://")
	}
	return raw[:start] + "xxxxx" + raw[at:]
}

// errPasswordTwice is returned when the URL and the file both give a
// password: one of them would be silently ignored.
var errPasswordTwice = errors.New("the Redis password is both in --registry and in --registry-password-file: keep it in the file only")
