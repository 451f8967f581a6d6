package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"
)

// maxBody bounds what is read of an answer: a list of thousands of tunnels
// fits many times over.
const maxBody = 64 << 20

// endpoint is one JSON endpoint and how to talk about it in errors.
type endpoint struct {
	url       string // what to GET
	shown     string // the address as the user gave it
	what      string // "tether server admin API"
	kind      string // "tether server admin address"
	flag      string // the flag that names the address
	origin    string // where the right address comes from, e.g. "the server's --admin-addr"
	token     string // bearer token; "" sends none
	tokenFile string // where the token came from, for messages
	timeout   time.Duration
	client    *http.Client
}

// getJSON GETs e.url and decodes the JSON answer into v. Its errors say what
// went wrong and which flag to check; they never contain the token.
func (e endpoint) getJSON(ctx context.Context, v any) error {
	timeout := e.timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url, nil)
	if err != nil {
		return fmt.Errorf("%s %q: %w", e.flag, e.shown, err)
	}
	req.Header.Set("Accept", "application/json")
	if e.token != "" {
		req.Header.Set("Authorization", "Bearer "+e.token)
	}
	c := e.client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("no %s at %s: check %s (%s)", e.what, e.shown, e.flag, e.origin)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no answer from the %s at %s within %v: check %s (%s), or allow more with --timeout", e.what, e.shown, timeout, e.flag, e.origin)
	case err != nil:
		return fmt.Errorf("GET %s: %w: check %s (%s)", e.url, err, e.flag, e.origin)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		return e.unauthorized()
	}
	if resp.StatusCode != http.StatusOK {
		return e.notOurs(printable(resp.Status)) // whatever answered wrote it
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("read the answer of the %s at %s: %w", e.what, e.shown, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return e.notOurs("an answer that is not its JSON")
	}
	return nil
}

// notOurs: something answered at the address, but not what tether serves.
func (e endpoint) notOurs(answer string) error {
	return fmt.Errorf("%s does not look like a %s (GET %s gave %s): check %s (%s)",
		e.shown, e.kind, e.url, answer, e.flag, e.origin)
}

// unauthorized explains a 401; the token itself never appears.
func (e endpoint) unauthorized() error {
	if e.token == "" {
		return fmt.Errorf("the %s at %s needs a token: pass --admin-token-file (the server's --admin-token-file)", e.what, e.shown)
	}
	return fmt.Errorf("the %s at %s refused the token in --admin-token-file %s: pass the file the server's --admin-token-file names", e.what, e.shown, e.tokenFile)
}
