package auth

import (
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Claims are the verified claims of a tunnel token.
type Claims struct {
	// Tunnel is the tunnel name (sub): a DNS label, see [ValidTunnelName].
	Tunnel string
	// Account is the platform account (account), for humans, logs and metrics.
	Account string
	// Runtime is the platform runtime (runtime), for humans, logs and metrics.
	Runtime string
	// ID is the token ID (jti).
	ID string
	// Issuer is iss, empty when absent.
	Issuer string
	// Audience is aud, nil when absent.
	Audience []string
	// IssuedAt is iat, zero when absent.
	IssuedAt time.Time
	// NotBefore is nbf, zero when absent.
	NotBefore time.Time
	// ExpiresAt is exp. It is required, so it is never zero after Verify.
	ExpiresAt time.Time
	// KeyID is the kid of the key that verified the token (the token's kid
	// header when it has one), for logs.
	KeyID string
	// Renews is the jti of the token this one renews, and of every renewal
	// between them: the first token's (renews claim), empty for a token the
	// platform issued. Revoking that jti revokes its renewals too.
	Renews string
}

// Lineage is the jti that names a token and all its renewals: Renews for a
// renewed token, ID for one the platform issued.
func (c *Claims) Lineage() string {
	if c.Renews != "" {
		return c.Renews
	}
	return c.ID
}

// wireClaims is the JSON payload of a tunnel token.
type wireClaims struct {
	jwt.RegisteredClaims
	Account string `json:"account,omitempty"`
	Runtime string `json:"runtime,omitempty"`
	Renews  string `json:"renews,omitempty"`
}

// claims converts verified wire claims.
func (w *wireClaims) claims(kid string) *Claims {
	return &Claims{
		Tunnel:    w.Subject,
		Account:   w.Account,
		Runtime:   w.Runtime,
		ID:        w.ID,
		Issuer:    w.Issuer,
		Audience:  []string(w.Audience),
		IssuedAt:  numericTime(w.IssuedAt),
		NotBefore: numericTime(w.NotBefore),
		ExpiresAt: numericTime(w.ExpiresAt),
		KeyID:     kid,
		Renews:    w.Renews,
	}
}

// numericTime returns d as a UTC time, zero when d is nil.
func numericTime(d *jwt.NumericDate) time.Time {
	if d == nil {
		return time.Time{}
	}
	return d.UTC()
}
