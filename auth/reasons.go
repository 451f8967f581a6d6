package auth

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Reason is a bounded, stable, snake_case code for why a login or a route was
// refused. It is used as a Prometheus label value and as a log field, so the
// set of values is closed: new values are added here, never built at run time.
type Reason string

// The reasons a tunnel client can be refused.
const (
	// ReasonMissingToken means the login carried no token.
	ReasonMissingToken Reason = "missing_token"
	// ReasonMalformed means the token is not a JWT (bad segments, base64 or JSON).
	ReasonMalformed Reason = "malformed"
	// ReasonAlgorithm means alg is none, unknown, or not the one of the key.
	ReasonAlgorithm Reason = "algorithm"
	// ReasonUnknownKey means the token names a kid this server does not trust, or
	// the server has no usable key.
	ReasonUnknownKey Reason = "unknown_key"
	// ReasonSignature means the signature does not verify with any trusted key.
	ReasonSignature Reason = "bad_signature"
	// ReasonExpired means exp is in the past (beyond the leeway).
	ReasonExpired Reason = "expired"
	// ReasonNotYetValid means nbf or iat is in the future (beyond the leeway).
	ReasonNotYetValid Reason = "not_yet_valid"
	// ReasonNoExpiry means the token has no exp claim; tether requires one.
	ReasonNoExpiry Reason = "no_expiry"
	// ReasonIssuer means iss is not the configured issuer.
	ReasonIssuer Reason = "issuer"
	// ReasonAudience means aud does not contain the configured audience.
	ReasonAudience Reason = "audience"
	// ReasonSubject means sub is missing or not a valid tunnel name.
	ReasonSubject Reason = "subject"
	// ReasonRevoked means an operator revoked the tunnel, or the token (or
	// the token it was renewed from), with `tether token revoke`.
	ReasonRevoked Reason = "revoked"
	// ReasonSessionLimit means the tunnel already has as many sessions on
	// the server as it may (--max-sessions-per-tunnel).
	ReasonSessionLimit Reason = "session_limit"
	// ReasonMixedClients means a stock frpc and a tether client tried to
	// serve one tunnel on one server.
	ReasonMixedClients Reason = "mixed_clients"
	// ReasonProxy means a NewProxy that breaks the route rules.
	ReasonProxy Reason = "proxy"
	// ReasonSession means the login or proxy did not come through the tether
	// session layer, or its session is unknown or stale.
	ReasonSession Reason = "session"
	// ReasonInternal means the server's tunnel registry failed with an error that
	// is not a [*RejectError]; the client is told only that the server failed.
	ReasonInternal Reason = "internal"
)

// Reasons returns every Reason: the label values of the login metrics,
// which export each at 0 before its first refusal. A new Reason goes here
// too (TestReasonsListsEveryReason checks).
func Reasons() []Reason {
	return []Reason{
		ReasonMissingToken, ReasonMalformed, ReasonAlgorithm, ReasonUnknownKey, ReasonSignature,
		ReasonExpired, ReasonNotYetValid, ReasonNoExpiry, ReasonIssuer, ReasonAudience, ReasonSubject, ReasonRevoked,
		ReasonSessionLimit, ReasonMixedClients, ReasonProxy, ReasonSession, ReasonInternal,
	}
}

// RouteReasons returns the Reasons a route registration is refused for.
func RouteReasons() []Reason { return []Reason{ReasonProxy, ReasonSession, ReasonInternal} }

// RejectError is a refusal that the tunnel client may see. The plugin sends
// Error() to the client as frp's reject reason, so it says what was wrong and
// what to do, and never contains the token, a signature or key material.
type RejectError struct {
	// Reason is the stable code, for metrics and logs.
	Reason Reason
	// Detail is one short, human sentence: what was wrong and what to do.
	Detail string
	// ClaimedTunnel is the unverified sub of the token, if it could be read.
	// It is attacker-controlled: use it in logs only, never for decisions.
	ClaimedTunnel string
}

// Error returns "<reason>: <detail>", the text the tunnel client sees.
func (e *RejectError) Error() string {
	if e.Detail == "" {
		return string(e.Reason)
	}
	return string(e.Reason) + ": " + e.Detail
}

// reject builds a *RejectError with a formatted detail.
func reject(reason Reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// maxQuoted bounds how much of an untrusted value is echoed back in a detail
// or an error: enough to recognise it, not enough to flood a log line.
const maxQuoted = 64

// quote returns s as a Go-quoted string, truncated to maxQuoted bytes (on a
// rune boundary) with "..." appended when cut, so that untrusted input can be
// echoed safely.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return fmt.Sprintf("%q", s)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q...", s[:cut])
}

// quoteList renders a list of untrusted strings like ["a" "b"], bounded.
func quoteList(ss []string) string {
	const maxItems = 8
	var b strings.Builder
	b.WriteByte('[')
	for i, s := range ss {
		if i == maxItems {
			fmt.Fprintf(&b, " ...%d more", len(ss)-maxItems)
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quote(s))
	}
	b.WriteByte(']')
	return b.String()
}
