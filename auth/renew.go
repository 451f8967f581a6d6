package auth

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Renewal keeps a tunnel up for as long as its client runs, although every
// token expires: a server that holds a renewal key (a Signer whose public
// key the servers trust) sends a connected client the renewal of its token
// once a third of the token's lifetime is left (RenewalDue), and the client
// logs in with the newest valid token it has. A renewal has the same
// claims and lifetime as the token it renews, a new iat, nbf, exp and jti,
// and names the first token of its line in its renews claim, so that
// revoking that jti (Claims.Lineage) revokes every renewal of it.

// Lifetime is how long a token was valid for when issued: exp minus nbf
// (or minus iat when it has no nbf); zero when it has neither.
func Lifetime(c *Claims) time.Duration {
	start := c.NotBefore
	if start.IsZero() {
		start = c.IssuedAt
	}
	if start.IsZero() || !c.ExpiresAt.After(start) {
		return 0
	}
	return c.ExpiresAt.Sub(start)
}

// RenewAt is when a token is due for renewal: when a third of its lifetime
// is left. A token whose lifetime is unknown is due at once.
func RenewAt(c *Claims) time.Time {
	return c.ExpiresAt.Add(-Lifetime(c) / 3)
}

// minRenewableLifetime: a token valid for less is not renewed. Renewing it
// would mean a renewal every few seconds, and a platform that issues such
// tokens wants them to end.
const minRenewableLifetime = 30 * time.Second

// ErrNotRenewable is the error of a token with no known lifetime (neither nbf nor iat),
// or one shorter than minRenewableLifetime.
var ErrNotRenewable = errors.New("token is not renewable")

// Renew returns the renewal of the token with claims c, issued at now: the
// same sub, account, runtime, iss and aud, valid from now for the token's
// own lifetime, with a new jti and c's lineage in its renews claim.
func (s *Signer) Renew(c *Claims, now time.Time) (string, error) {
	lifetime := Lifetime(c)
	if lifetime < minRenewableLifetime {
		return "", fmt.Errorf("renew token of tunnel %q: %w (lifetime %v; at least %v, with iat or nbf)", c.Tunnel, ErrNotRenewable, lifetime, minRenewableLifetime)
	}
	jti, err := newTokenID()
	if err != nil {
		return "", fmt.Errorf("renew token of tunnel %q: %w", c.Tunnel, err)
	}
	now = now.Truncate(time.Second)
	return s.sign(wireClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   c.Tunnel,
			Issuer:    c.Issuer,
			Audience:  jwt.ClaimStrings(c.Audience),
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(lifetime)),
			ID:        jti,
		},
		Account: c.Account,
		Runtime: c.Runtime,
		Renews:  c.Lineage(),
	})
}

// CheckRenewalKey reports whether v accepts the tokens s signs, so that a
// server refuses at start a --token-renewal-key whose public half is not
// among its --jwt-public-key keys, instead of handing clients renewals
// that every server then refuses.
func CheckRenewalKey(s *Signer, v *Verifier) error {
	now := v.now()
	probe := &Claims{Tunnel: "renewal-key-check", Issuer: v.issuer, IssuedAt: now, ExpiresAt: now.Add(time.Hour)}
	if v.audience != "" {
		probe.Audience = []string{v.audience}
	}
	token, err := s.Renew(probe, now)
	if err != nil {
		return err
	}
	if _, err := v.Verify(token); err != nil {
		return fmt.Errorf("the servers do not accept tokens signed with this key (%s key, kid %s): %w; add its public key to --jwt-public-key", s.Algorithm(), s.KeyID(), err)
	}
	return nil
}
