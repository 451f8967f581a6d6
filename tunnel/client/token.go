package client

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tether-dev/tether/auth"
)

// Where the token a client logs in with comes from, as /status names it.
const (
	// TokenFromFile is the token in --token-file.
	TokenFromFile = "file"
	// TokenRenewed is a renewal the server sent, or one the client kept in
	// --renewed-token-file before a restart.
	TokenRenewed = "renewed"
)

// Token is a tunnel token as the client reads it: without verifying it,
// which only the server can do. Its String names it by source and jti, so
// that printing a Token never shows the token.
type Token struct {
	raw string
	// Source is TokenFromFile or TokenRenewed.
	Source string
	// Claims are the token's claims, unverified. KeyID is its kid header.
	Claims auth.Claims
}

// Raw is the token itself: for a login, never for a log line.
func (t *Token) Raw() string { return t.raw }

func (t *Token) String() string { return fmt.Sprintf("%s token (jti %q)", t.Source, t.Claims.ID) }

// expired reports whether the token has expired at now; a token without
// exp has not (the server refuses it, and says why).
func (t *Token) expired(now time.Time) bool {
	return !t.Claims.ExpiresAt.IsZero() && !now.Before(t.Claims.ExpiresAt)
}

// unverifiedClaims are the claims of a tunnel token as auth issues them.
type unverifiedClaims struct {
	jwt.RegisteredClaims
	Account string `json:"account,omitempty"`
	Runtime string `json:"runtime,omitempty"`
	Renews  string `json:"renews,omitempty"`
}

// ParseToken reads token raw from source without verifying it: the client
// needs the tunnel's name (sub) to register its route, and the token's
// times to choose between tokens and to warn before it expires.
func ParseToken(raw, source string) (*Token, error) {
	var w unverifiedClaims
	parsed, _, err := jwt.NewParser().ParseUnverified(raw, &w)
	if err != nil {
		return nil, fmt.Errorf("not a JWT (%w): put the token from `tether token issue` in the file", err)
	}
	if err := auth.ValidTunnelName(w.Subject); err != nil {
		return nil, fmt.Errorf("token's sub %q is not a tunnel name: %w", w.Subject, err)
	}
	kid, _ := parsed.Header["kid"].(string)
	return &Token{raw: raw, Source: source, Claims: auth.Claims{
		Tunnel: w.Subject, Account: w.Account, Runtime: w.Runtime, ID: w.ID, Issuer: w.Issuer,
		Audience: []string(w.Audience), IssuedAt: numericTime(w.IssuedAt), NotBefore: numericTime(w.NotBefore),
		ExpiresAt: numericTime(w.ExpiresAt), KeyID: kid, Renews: w.Renews,
	}}, nil
}

func numericTime(d *jwt.NumericDate) time.Time {
	if d == nil {
		return time.Time{}
	}
	return d.UTC()
}

// readTokenFile reads and parses the token in --token-file. It is called at
// every login, so the file may change under a running client.
func readTokenFile(path string) (*Token, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read --token-file: %w; mount the tunnel's token Secret there or fix the path", err)
	}
	raw := strings.TrimSpace(string(b))
	if raw == "" {
		return nil, fmt.Errorf("--token-file %s is empty: put the JWT from `tether token issue` in it", path)
	}
	t, err := ParseToken(raw, TokenFromFile)
	if err != nil {
		return nil, fmt.Errorf("--token-file %s: %w", path, err)
	}
	return t, nil
}

// ReadRenewedToken reads the renewal a client of tunnel keeps in
// --renewed-token-file path, as the client does at start. It returns nil
// and no error when there is no such file yet, and an error that says why
// when the file holds nothing the client may log in with at now: no JWT, a
// token of another tunnel, or an expired one.
func ReadRenewedToken(path, tunnel string, now time.Time) (*Token, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read --renewed-token-file: %w", err)
	}
	t, err := ParseToken(strings.TrimSpace(string(b)), TokenRenewed)
	switch {
	case err != nil:
		return nil, fmt.Errorf("--renewed-token-file %s: %w", path, err)
	case t.Claims.Tunnel != tunnel:
		return nil, fmt.Errorf("--renewed-token-file %s holds a token for tunnel %q, and --token-file one for %q", path, t.Claims.Tunnel, tunnel)
	case t.Claims.ExpiresAt.IsZero():
		return nil, fmt.Errorf("--renewed-token-file %s holds a token without exp, which no server renews", path)
	case t.expired(now):
		return nil, fmt.Errorf("--renewed-token-file %s holds a renewal that expired at %s", path, t.Claims.ExpiresAt.Format(time.RFC3339))
	}
	return t, nil
}

// PreferToken returns the token to log in with at now, of the token file's
// (nil when the file is unusable) and the newest renewal (nil when there is
// none): the renewal, unless it has expired or the file's token is newer
// (issued later: the platform wrote a new token into the Secret) and has not
// expired itself.
func PreferToken(file, renewed *Token, now time.Time) *Token {
	switch {
	case renewed == nil:
		return file
	case file == nil:
		return renewed
	case renewed.expired(now):
		return file
	case file.expired(now):
		return renewed
	case file.Claims.IssuedAt.After(renewed.Claims.IssuedAt):
		return file
	}
	return renewed
}

// checkRenewal says why the client will not log in with renewal raw, a
// client of tunnel whose token in use is cur, at now; nil when it will.
func checkRenewal(raw, tunnel string, cur *Token, now time.Time) (*Token, error) {
	t, err := ParseToken(raw, TokenRenewed)
	switch {
	case err != nil:
		return nil, err
	case t.Claims.Tunnel != tunnel:
		return nil, fmt.Errorf("it is a token for tunnel %q, and this client serves %q", t.Claims.Tunnel, tunnel)
	case t.Claims.ExpiresAt.IsZero():
		return nil, errors.New("it has no exp")
	case t.expired(now):
		return nil, fmt.Errorf("it expired at %s", t.Claims.ExpiresAt.Format(time.RFC3339))
	case cur != nil && !t.Claims.ExpiresAt.After(cur.Claims.ExpiresAt):
		return nil, fmt.Errorf("%w: it expires at %s, the %s at %s", errNotNewer,
			t.Claims.ExpiresAt.Format(time.RFC3339), cur, cur.Claims.ExpiresAt.Format(time.RFC3339))
	}
	return t, nil
}

// writeSecretFile writes b to path, mode 0600, through a file in the same
// directory renamed over it: a client that restarts reads the old token or
// the new one, never part of one.
func writeSecretFile(path string, b []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*") // mode 0600
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(b); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// expiryWarnings are how long before it expires a token draws a warning
// (in the log, /status and tether diagnose), the longest first.
var expiryWarnings = [...]time.Duration{7 * 24 * time.Hour, 24 * time.Hour}

// overdueAt is when a renewal of a token with claims c is overdue: a tenth
// of a third of its lifetime after servers with --token-renewal-key send
// one (auth.RenewAt, a third of its lifetime before exp). A token whose
// lifetime is unknown is never renewed: it is overdue from the start.
func overdueAt(c *auth.Claims) time.Time {
	lifetime := auth.Lifetime(c)
	if lifetime == 0 {
		return time.Time{}
	}
	return auth.RenewAt(c).Add(lifetime / 30)
}

// warningAt is when a token with claims c crosses warning threshold: that
// long before it expires, but not before its renewal is overdue, so that a
// token the servers renew (a short-lived one, too) never draws a warning.
func warningAt(c *auth.Claims, threshold time.Duration) time.Time {
	at := c.ExpiresAt.Add(-threshold)
	if o := overdueAt(c); o.After(at) {
		return o
	}
	return at
}

// ExpiryWarning returns the shortest warning threshold (7 days, 1 day) that
// a token with claims c has crossed at now: it expires within that time and
// no renewal came although one is overdue. It returns 0 when the token
// draws no warning, and for a token without exp (the server refuses it and
// says why).
func ExpiryWarning(c *auth.Claims, now time.Time) time.Duration {
	if c.ExpiresAt.IsZero() {
		return 0
	}
	for i := len(expiryWarnings) - 1; i >= 0; i-- {
		if th := expiryWarnings[i]; !now.Before(warningAt(c, th)) {
			return th
		}
	}
	return 0
}

// nextWarning is when a token with claims c, already warned about at
// threshold warned (0: not yet), crosses its next threshold after now; zero
// when it crosses none.
func nextWarning(c *auth.Claims, warned time.Duration, now time.Time) time.Time {
	if c.ExpiresAt.IsZero() {
		return time.Time{}
	}
	for _, th := range expiryWarnings {
		if warned != 0 && th >= warned {
			continue
		}
		if at := warningAt(c, th); at.After(now) {
			return at
		}
	}
	return time.Time{}
}
