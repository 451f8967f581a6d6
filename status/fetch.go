package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
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
	err := e.call(ctx, http.MethodGet, nil, http.StatusOK, v)
	if r, ok := errors.AsType[*RefusedError](err); ok {
		return e.notOurs(http.MethodGet, r.status())
	}
	return err
}

// maxRefusal bounds what is read of a refusal's text.
const maxRefusal = 4 << 10

// call sends method to e.url, with body as JSON unless it is nil, and
// decodes the JSON answer into v when its status is want. A 4xx answer
// other than 401 is a *RefusedError with the sentence the server wrote.
// Its errors say what went wrong and which flag to check; they never
// contain the token.
func (e endpoint) call(ctx context.Context, method string, body any, want int, v any) error {
	timeout := e.timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var payload io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode the request to the %s: %w", e.what, err)
		}
		payload = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.url, payload)
	if err != nil {
		return fmt.Errorf("%s %q: %w", e.flag, e.shown, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
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
		return fmt.Errorf("%s %s: %w: check %s (%s)", method, e.url, err, e.flag, e.origin)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return e.unauthorized()
	case resp.StatusCode != want && resp.StatusCode >= 400 && resp.StatusCode < 500:
		text, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusal))
		first, _, _ := strings.Cut(strings.TrimSpace(string(text)), "\n")
		return &RefusedError{Status: resp.StatusCode, Text: printable(first), Request: method + " " + e.url}
	case resp.StatusCode != want:
		return e.notOurs(method, printable(resp.Status)) // whatever answered wrote it
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("read the answer of the %s at %s: %w", e.what, e.shown, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return e.notOurs(method, "an answer that is not its JSON")
	}
	return nil
}

// RefusedError is a 4xx answer (other than 401) of a tether endpoint,
// with the first line of the text it came with, escaped for a terminal.
type RefusedError struct {
	Status  int
	Text    string
	Request string // "POST http://host/api/revocations"
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%s answered %s: %s", e.Request, e.status(), e.Text)
}

// status is "404 Not Found".
func (e *RefusedError) status() string {
	return fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
}

// notOurs: something answered at the address, but not what tether serves.
func (e endpoint) notOurs(method, answer string) error {
	return fmt.Errorf("%s does not look like a %s (%s %s gave %s): check %s (%s)",
		e.shown, e.kind, method, e.url, answer, e.flag, e.origin)
}

// unauthorized explains a 401; the token itself never appears.
func (e endpoint) unauthorized() error {
	if e.token == "" {
		return fmt.Errorf("the %s at %s needs a token: pass --admin-token-file (the server's --admin-token-file)", e.what, e.shown)
	}
	return fmt.Errorf("the %s at %s refused the token in --admin-token-file %s: pass the file the server's --admin-token-file names", e.what, e.shown, e.tokenFile)
}
