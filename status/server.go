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

// Tunnels returns the server's connected tunnels, sorted by name.
func (a *Admin) Tunnels(ctx context.Context) ([]server.Info, error) {
	base := strings.TrimSuffix(a.url.String(), "/")
	e := endpoint{
		url: base + "/api/tunnels", shown: base, what: "tether server admin API", kind: "tether server admin address",
		flag: "--admin", origin: "the server's --admin-addr",
		token: a.token, tokenFile: a.tokenFile, timeout: a.Timeout, client: a.HTTP,
	}
	var list []server.Info
	if err := e.getJSON(ctx, &list); err != nil {
		return nil, err
	}
	slices.SortStableFunc(list, func(x, y server.Info) int { return cmp.Compare(x.Name, y.Name) })
	return list, nil
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
	if len(f.patterns) == 0 {
		return list, nil
	}
	used := make([]bool, len(f.patterns))
	var kept []server.Info
	for _, t := range list {
		match := false
		for i, p := range f.patterns {
			if ok, _ := path.Match(p, t.Name); ok {
				used[i], match = true, true
			}
		}
		if match {
			kept = append(kept, t)
		}
	}
	var missing []string
	for i, p := range f.patterns {
		if !used[i] {
			missing = append(missing, p)
		}
	}
	if missing != nil {
		return kept, &NoMatchError{Patterns: missing, Connected: len(list)}
	}
	return kept, nil
}

// NoMatchError says that tunnel names were asked for that no connected
// tunnel has.
type NoMatchError struct {
	Patterns  []string
	Connected int // how many tunnels the server lists
}

func (e *NoMatchError) Error() string {
	quoted := make([]string, len(e.Patterns))
	for i, p := range e.Patterns {
		quoted[i] = fmt.Sprintf("%q", p)
	}
	return fmt.Sprintf("no connected tunnel matches %s (%d connected): check the name, or leave names out to list every tunnel",
		strings.Join(quoted, ", "), e.Connected)
}
