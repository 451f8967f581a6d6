package status

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/tether-dev/tether/tunnel/server"
)

// Admin reads a tether server's admin API.
type Admin struct {
	url       *url.URL
	token     string
	tokenFile string

	// Timeout bounds one request (DefaultTimeout when 0).
	Timeout time.Duration
	// HTTP is the client requests go through (http.DefaultClient when nil).
	HTTP *http.Client
}

// NewAdmin checks the --admin address and reads the token in tokenFile
// ("" when the server needs none). A bare HOST:PORT means http://HOST:PORT.
func NewAdmin(rawURL, tokenFile string) (*Admin, error) {
	if !strings.Contains(rawURL, "://") {
		rawURL = "http://" + rawURL
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--admin %q: want the server's admin URL, e.g. http://127.0.0.1:7700 (its --admin-addr)", rawURL)
	}
	a := &Admin{url: u, tokenFile: tokenFile}
	if tokenFile == "" {
		return a, nil
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("read --admin-token-file: %w: pass the file that holds the server's admin token", err)
	}
	if a.token = strings.TrimSpace(string(b)); a.token == "" {
		return nil, fmt.Errorf("--admin-token-file %s is empty: pass the file the server's --admin-token-file names", tokenFile)
	}
	return a, nil
}

// Tunnels returns the sessions of the server's connected tunnels (a tunnel
// may have several), sorted by tunnel name, a tunnel's oldest first.
func (a *Admin) Tunnels(ctx context.Context) ([]server.Info, error) {
	var list []server.Info
	if err := a.endpoint("/api/tunnels").getJSON(ctx, &list); err != nil {
		return nil, err
	}
	slices.SortStableFunc(list, func(x, y server.Info) int {
		return cmp.Or(cmp.Compare(x.Name, y.Name), x.ConnectedSince.Compare(y.ConnectedSince))
	})
	return list, nil
}

// Fleet returns the registry's view of every replica's tunnels, as the
// server asked sees it.
func (a *Admin) Fleet(ctx context.Context) (server.Fleet, error) {
	e := a.endpoint("/api/fleet")
	var fleet server.Fleet
	if err := e.getJSON(ctx, &fleet); err != nil {
		return server.Fleet{}, err
	}
	if fleet.Replica == "" || fleet.Registry.Backend == "" {
		return server.Fleet{}, e.notOurs(http.MethodGet, "JSON without the replica and its registry")
	}
	return fleet, nil
}

// endpoint is the admin API's endpoint at path.
func (a *Admin) endpoint(path string) endpoint {
	base := a.shown()
	return endpoint{
		url: base + path, shown: base, what: "tether server admin API", kind: "tether server admin address",
		flag: "--admin", origin: "the server's --admin-addr",
		token: a.token, tokenFile: a.tokenFile, timeout: a.Timeout, client: a.HTTP,
	}
}

// Filter keeps the tunnels whose names match any of its patterns: names or
// shell-style globs such as acme-*. With no patterns it keeps every tunnel.
type Filter struct {
	patterns []string
}

// NewFilter checks the patterns.
func NewFilter(patterns []string) (Filter, error) {
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil {
			return Filter{}, fmt.Errorf("tunnel name pattern %q: %w: use a name or a glob like acme-*", p, err)
		}
	}
	return Filter{patterns: patterns}, nil
}

// Apply returns the tunnels that match, in list order. The error, a
// *NoMatchError, names the patterns that matched no tunnel.
func (f Filter) Apply(list []server.Info) ([]server.Info, error) {
	names := make([]string, len(list))
	for i, t := range list {
		names[i] = t.Name
	}
	keep, err := f.match(names)
	var kept []server.Info
	for i, t := range list {
		if keep[i] {
			kept = append(kept, t)
		}
	}
	return kept, err
}

// match reports which names a pattern matches; the error, a *NoMatchError,
// names the patterns that matched none. A name may appear more than once
// (a tunnel with several sessions): Connected counts distinct names.
func (f Filter) match(names []string) ([]bool, error) {
	keep := make([]bool, len(names))
	if len(f.patterns) == 0 {
		for i := range keep {
			keep[i] = true
		}
		return keep, nil
	}
	used := make([]bool, len(f.patterns))
	for i, name := range names {
		for j, p := range f.patterns {
			if ok, _ := path.Match(p, name); ok {
				used[j], keep[i] = true, true
			}
		}
	}
	var missing []string
	for j, p := range f.patterns {
		if !used[j] {
			missing = append(missing, p)
		}
	}
	if missing != nil {
		distinct := make(map[string]bool, len(names))
		for _, name := range names {
			distinct[name] = true
		}
		return keep, &NoMatchError{Patterns: missing, Connected: len(distinct)}
	}
	return keep, nil
}

// NoMatchError says that tunnel names were asked for that no connected
// tunnel has.
type NoMatchError struct {
	Patterns  []string
	Connected int // how many tunnels the server lists (not sessions)
}

func (e *NoMatchError) Error() string {
	quoted := make([]string, len(e.Patterns))
	for i, p := range e.Patterns {
		quoted[i] = fmt.Sprintf("%q", p)
	}
	return fmt.Sprintf("no connected tunnel matches %s (%d connected): check the name, or leave names out to list every tunnel",
		strings.Join(quoted, ", "), e.Connected)
}
