package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/human"
)

// tokens is what the client knows of its tokens: the token file's, as the
// last login read it, and the newest renewal the server sent. It chooses
// the token of each login (PreferToken), keeps the renewal in
// --renewed-token-file, and warns when the token in use nears its expiry
// with no renewal in sight. One lock guards its state, and every change is
// an on* method, as in status.go.
type tokens struct {
	// Static after construction.
	tunnel      string
	file        string // --token-file
	renewedFile string // --renewed-token-file; "" keeps renewals in memory only
	log         *zap.Logger
	// changed wakes warnLoop when the token in use may have changed; it has
	// room for one wake-up.
	changed chan struct{}

	// keeping serialises the writes of renewedFile, so that the last one
	// written is of the newest renewal.
	keeping sync.Mutex

	mu       sync.Mutex
	fromFile *Token // as the last login read it; the same pointer while the file is unchanged
	renewed  *Token // the newest renewal; nil before the first
	renewals int    // renewals taken since the start
	// warnedFor is the token in use that warnLoop last looked at, and
	// warned the shortest threshold (expiryWarnings) it has logged for it.
	warnedFor *Token
	warned    time.Duration
}

// newTokens starts from file, the token file's token read by New, and
// from the renewal kept in cfg.RenewedTokenFile when it is usable and
// newer. It fails only when that file's directory does not exist.
func newTokens(cfg Config, file *Token, log *zap.Logger) (*tokens, error) {
	t := &tokens{
		tunnel: file.Claims.Tunnel, file: cfg.TokenFile, renewedFile: cfg.RenewedTokenFile, log: log,
		changed: make(chan struct{}, 1), fromFile: file,
	}
	if t.renewedFile == "" {
		return t, nil
	}
	if fi, err := os.Stat(filepath.Dir(t.renewedFile)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("--renewed-token-file %s: its directory %s does not exist: mount a writable volume (an emptyDir) there, or leave the flag out", t.renewedFile, filepath.Dir(t.renewedFile))
	}
	renewed, err := ReadRenewedToken(t.renewedFile, t.tunnel, time.Now())
	switch {
	case err != nil:
		log.Info("renewal kept in --renewed-token-file not used; logging in with --token-file's token", zap.String("reason", err.Error()))
	case renewed == nil:
	case PreferToken(file, renewed, time.Now()) == file:
		log.Info("--token-file holds a newer token than the renewal kept in --renewed-token-file; logging in with it",
			zap.String("jti", file.Claims.ID))
	default:
		t.renewed = renewed
		log.Info("logging in with the renewal kept in --renewed-token-file", zap.String("jti", renewed.Claims.ID),
			zap.Time("expires_at", renewed.Claims.ExpiresAt), zap.String("renews", renewed.Claims.Renews))
	}
	return t, nil
}

// forLogin re-reads the token file and returns the token to log in with.
// When the file holds no token for this tunnel, a renewal that has not
// expired stands in for it: fileProblem then says what is wrong with the
// file, for the log.
func (t *tokens) forLogin() (tok *Token, fileProblem, err error) {
	file, ferr := readTokenFile(t.file)
	if ferr == nil && file.Claims.Tunnel != t.tunnel {
		// The route a slot registers is named after the tunnel this process
		// started with; a token for another tunnel cannot serve it.
		file, ferr = nil, fmt.Errorf("--token-file %s now holds a token for tunnel %q, but this client serves tunnel %q: restart the client to switch tunnels",
			t.file, file.Claims.Tunnel, t.tunnel)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if ferr != nil {
		if t.renewed == nil || t.renewed.expired(now) {
			return nil, nil, ferr
		}
		return t.renewed, ferr, nil
	}
	if t.fromFile.raw != file.raw {
		t.fromFile = file
		t.wakeLocked()
	}
	return PreferToken(t.fromFile, t.renewed, now), nil, nil
}

// errNotNewer: a renewal that expires no later than the token in use, such
// as the second of two sessions' renewals of one token.
var errNotNewer = errors.New("not newer than the token in use")

// onRenewal takes renewal raw from the server, for every later login,
// unless checkRenewal finds a reason not to; that reason is the error
// (errNotNewer for a renewal that brings nothing new).
func (t *tokens) onRenewal(raw string) (*Token, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	cur := t.inUseLocked(now)
	tok, err := checkRenewal(raw, t.tunnel, cur, now)
	if err != nil {
		return nil, err
	}
	t.renewed = tok
	t.renewals++
	t.wakeLocked()
	return tok, nil
}

// refusedAsForeign are the reasons for which a server refuses a token it
// cannot have signed or renewed: its renewal key is no longer trusted.
var refusedAsForeign = []auth.Reason{auth.ReasonUnknownKey, auth.ReasonSignature, auth.ReasonAlgorithm, auth.ReasonIssuer, auth.ReasonAudience, auth.ReasonMalformed}

// onRefused records that the server refused a login with tok for reason
// (its text, reason code first). A renewal refused as not the servers'
// own is dropped, so that the next login uses the token file's again; it
// reports whether it was.
func (t *tokens) onRefused(tok *Token, reason string) bool {
	code, _, _ := strings.Cut(reason, ":")
	foreign := false
	for _, r := range refusedAsForeign {
		foreign = foreign || auth.Reason(code) == r
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !foreign || tok != t.renewed {
		return false
	}
	t.renewed = nil
	t.wakeLocked()
	return true
}

// keep writes the newest renewal to --renewed-token-file, when one is set.
func (t *tokens) keep() error {
	if t.renewedFile == "" {
		return nil
	}
	t.keeping.Lock()
	defer t.keeping.Unlock()
	t.mu.Lock()
	r := t.renewed
	t.mu.Unlock()
	if r == nil {
		return nil
	}
	if err := writeSecretFile(t.renewedFile, []byte(r.raw+"\n")); err != nil {
		return fmt.Errorf("write --renewed-token-file: %w", err)
	}
	return nil
}

func (t *tokens) inUseLocked(now time.Time) *Token { return PreferToken(t.fromFile, t.renewed, now) }

func (t *tokens) wakeLocked() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// warnLoop logs a warning when the token in use crosses a threshold of
// expiryWarnings with no renewal (once per threshold and token), until ctx
// ends.
func (t *tokens) warnLoop(ctx context.Context) {
	for {
		next := t.checkExpiry(time.Now())
		var due <-chan time.Time
		var timer *time.Timer
		if !next.IsZero() {
			timer = time.NewTimer(time.Until(next))
			due = timer.C
		}
		select {
		case <-ctx.Done():
		case <-t.changed:
		case <-due:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// checkExpiry logs the warning the token in use is due at now, if it was
// not logged yet, and returns when the next one is due (zero: none).
func (t *tokens) checkExpiry(now time.Time) time.Time {
	t.mu.Lock()
	cur := t.inUseLocked(now)
	if cur != t.warnedFor {
		t.warnedFor, t.warned = cur, 0
	}
	th := ExpiryWarning(&cur.Claims, now)
	log := th != 0 && (t.warned == 0 || th < t.warned)
	if log {
		t.warned = th
	}
	next := nextWarning(&cur.Claims, t.warned, now)
	t.mu.Unlock()
	if log {
		t.log.Warn("tunnel token expires soon and no renewal came", zap.String("within", human.Age(th)),
			zap.Time("expires_at", cur.Claims.ExpiresAt), zap.String("source", cur.Source), zap.String("jti", cur.Claims.ID),
			zap.String("hint", renewHint(t.tunnel)))
	}
	return next
}

// renewHint says what to do about a token that expires without a renewal.
func renewHint(tunnel string) string {
	return fmt.Sprintf("issue a new token (tether token issue --tunnel %s ...) and update the Secret of --token-file: the client reads it at its next login, no restart needed; or have the servers renew tokens (--token-renewal-key)", tunnel)
}

// ExpiryWarningText is the warning about a token with claims c of tunnel
// at now, as /status and tether diagnose show it: "" when ExpiryWarning
// has none.
func ExpiryWarningText(c *auth.Claims, tunnel string, now time.Time) string {
	if ExpiryWarning(c, now) == 0 {
		return ""
	}
	when := fmt.Sprintf("expires in %s", human.Age(c.ExpiresAt.Sub(now)))
	if !now.Before(c.ExpiresAt) {
		when = fmt.Sprintf("expired %s ago", human.Age(now.Sub(c.ExpiresAt)))
	}
	return fmt.Sprintf("the token %s (at %s) and no renewal came: %s", when, c.ExpiresAt.UTC().Format(time.RFC3339), renewHint(tunnel))
}

// TokenState is the token the client logs in with, as /status reports it:
// what the token says, never the token itself.
type TokenState struct {
	// Source is where it comes from: "file" (--token-file) or "renewed" (a
	// renewal the server sent, or one kept in --renewed-token-file).
	Source string `json:"source"`
	// JTI is the token's ID (jti). Renews, for a renewal, is the jti of the
	// first token of its line: revoking that jti (tether token revoke
	// --jti) takes back every renewal of it.
	JTI    string `json:"jti,omitempty"`
	Renews string `json:"renews,omitempty"`
	// IssuedAt and ExpiresAt are its iat and exp, when it has them.
	IssuedAt  *time.Time `json:"issued_at,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// RenewedAt is when the server issued the newest renewal the client
	// holds (its iat), whether or not it is the one in use; empty before
	// the first.
	RenewedAt *time.Time `json:"renewed_at,omitempty"`
	// Renewals counts the renewals the client took since it started.
	Renewals int `json:"renewals"`
	// Warning says that the token expires within 7 days (or 1 day) with no
	// renewal in sight, and what to do; empty otherwise.
	Warning string `json:"warning,omitempty"`
}

// snapshot is the token in use at now, for /status.
func (t *tokens) snapshot(now time.Time) *TokenState {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.inUseLocked(now)
	s := &TokenState{
		Source: cur.Source, JTI: cur.Claims.ID, Renews: cur.Claims.Renews, Renewals: t.renewals,
		IssuedAt: optionalTime(cur.Claims.IssuedAt), ExpiresAt: optionalTime(cur.Claims.ExpiresAt),
		Warning: ExpiryWarningText(&cur.Claims, t.tunnel, now),
	}
	if t.renewed != nil {
		s.RenewedAt = optionalTime(t.renewed.Claims.IssuedAt)
	}
	return s
}

func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return timePtr(t)
}

// collectors expose the token in use as Prometheus metrics.
func (t *tokens) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		&tokenExpiry{t: t, desc: prometheus.NewDesc("tether_client_token_expiry_timestamp_seconds",
			"When the token the client logs in with expires (its exp, Unix seconds); absent for a token without exp.", nil, nil)},
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_client_token_renewals_total", Help: "Renewed tokens the client took from the server.",
		}, func() float64 {
			t.mu.Lock()
			defer t.mu.Unlock()
			return float64(t.renewals)
		}),
	}
}

// tokenExpiry is tether_client_token_expiry_timestamp_seconds, a gauge
// that is absent while the token in use has no exp.
type tokenExpiry struct {
	t    *tokens
	desc *prometheus.Desc
}

func (e *tokenExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc }

func (e *tokenExpiry) Collect(ch chan<- prometheus.Metric) {
	e.t.mu.Lock()
	exp := e.t.inUseLocked(time.Now()).Claims.ExpiresAt
	e.t.mu.Unlock()
	if !exp.IsZero() {
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(exp.Unix()))
	}
}
