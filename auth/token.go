package auth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// DefaultLeeway is the clock skew allowed for exp, nbf and iat when
// VerifierConfig.Leeway is zero.
const DefaultLeeway = 30 * time.Second

// maxTokenSize bounds the token accepted by Verify. A tether token is a few
// hundred bytes; frp's login metadata has no limit of its own.
const maxTokenSize = 8 << 10

// VerifierConfig configures a [Verifier].
type VerifierConfig struct {
	// Keys supplies the trusted keys. Required.
	Keys KeySource
	// Issuer, when set, must equal the token's iss.
	Issuer string
	// Audience, when set, must be one of the token's aud.
	Audience string
	// Leeway is the clock skew allowed for exp, nbf and iat. Zero means
	// DefaultLeeway (30s); a negative value means no leeway.
	Leeway time.Duration
	// Now returns the current time. Nil means time.Now.
	Now func() time.Time
	// OnKeyError, when set, is called from Verify with each error Keys
	// reports (a key file that failed to reload; the last good keys stay in
	// force), so that the caller can log it. It must not block. Nil drops
	// the errors.
	OnKeyError func(error)
}

// Verifier verifies tunnel tokens. It is safe for concurrent use.
type Verifier struct {
	keys       KeySource
	issuer     string
	audience   string
	leeway     time.Duration
	now        func() time.Time
	onKeyError func(error)
}

// NewVerifier validates cfg and returns a Verifier.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	if cfg.Keys == nil {
		return nil, errors.New("new verifier: no key source; set VerifierConfig.Keys")
	}
	v := &Verifier{
		keys:       cfg.Keys,
		issuer:     cfg.Issuer,
		audience:   cfg.Audience,
		leeway:     cfg.Leeway,
		now:        cfg.Now,
		onKeyError: cfg.OnKeyError,
	}
	switch {
	case v.leeway == 0:
		v.leeway = DefaultLeeway
	case v.leeway < 0:
		v.leeway = 0
	}
	if v.now == nil {
		v.now = time.Now
	}
	return v, nil
}

// supportedAlgs are the only algorithms a token may name at all; which of
// them a server accepts depends on its keys.
var supportedAlgs = []string{algEdDSA, algES256, algRS256, algHS256}

// tokenHeader is the JOSE header members tether reads.
type tokenHeader struct {
	Alg  string          `json:"alg"`
	Kid  string          `json:"kid"`
	Crit json.RawMessage `json:"crit"`
}

// ValidUntil is the last moment the verifier accepts claims: their expiry
// plus the clock-skew leeway. A session that lives no longer than its token
// ends then, and not earlier, so that a login accepted inside the leeway is
// not dropped at once.
func (v *Verifier) ValidUntil(c *Claims) time.Time { return c.ExpiresAt.Add(v.leeway) }

// Verify checks a token and returns its claims. It checks, in order: the
// JWT structure; that alg is EdDSA, ES256, RS256 or HS256 (never "none");
// that the key named by kid is trusted and has that alg, or, when the token
// has no kid, that some trusted key has it; the signature, with the named key
// or with every key of that alg; exp (required), nbf and iat against
// the clock with the configured leeway; iss and aud when configured; and
// that sub is a valid tunnel name. Claims are looked at only once the
// signature is good, so an unsigned token learns nothing more than
// "bad signature". Every failure is a [*RejectError]. Verify never panics.
func (v *Verifier) Verify(token string) (*Claims, error) {
	token = strings.TrimSpace(token)
	if token == "" {
		return nil, reject(ReasonMissingToken, "no token given; the client must send its tunnel token")
	}
	if len(token) > maxTokenSize {
		return nil, reject(ReasonMalformed, "token is %d bytes; want a JWT of at most %d bytes", len(token), maxTokenSize)
	}
	segs := strings.Split(token, ".")
	if len(segs) != 3 {
		return nil, reject(ReasonMalformed, "token has %d dot-separated parts; want a JWT: header.claims.signature", len(segs))
	}
	var h tokenHeader
	if err := decodeSegment(segs[0], &h); err != nil {
		return nil, reject(ReasonMalformed, "token header is not base64url-encoded JSON (%s); want a JWT", err)
	}
	var wc wireClaims
	if err := decodeSegment(segs[1], &wc); err != nil {
		return nil, reject(ReasonMalformed, "token claims are not base64url-encoded JSON with the expected types (%s); want a JWT", err)
	}
	claims, rerr := v.verify(segs, &h, &wc)
	if rerr != nil {
		rerr.ClaimedTunnel = boundedClaim(wc.Subject)
		return nil, rerr
	}
	return claims, nil
}

// verify checks a decoded token.
func (v *Verifier) verify(segs []string, h *tokenHeader, wc *wireClaims) (*Claims, *RejectError) {
	sig, err := base64.RawURLEncoding.Strict().DecodeString(segs[2])
	if err != nil {
		return nil, reject(ReasonMalformed, "token signature is not base64url without padding; want a JWT")
	}
	if len(h.Crit) > 0 {
		return nil, reject(ReasonMalformed, "token header has critical extensions (crit) this server does not implement; issue the token without crit")
	}

	ks, err := v.keys.Keys()
	if err != nil && v.onKeyError != nil {
		v.onKeyError(err)
	}
	if ks.Len() == 0 {
		return nil, reject(ReasonUnknownKey, "this server has no token verification keys; ask the platform operator to configure them")
	}
	accepted := ks.algorithms()
	if h.Alg == "" {
		return nil, reject(ReasonAlgorithm, "token header has no alg; want %s", quoteList(accepted))
	}
	if !slices.Contains(supportedAlgs, h.Alg) {
		return nil, reject(ReasonAlgorithm, "token alg %s is not accepted; this server accepts %s", quote(h.Alg), quoteList(accepted))
	}

	var candidates []verifyKey
	if h.Kid != "" {
		i := slices.IndexFunc(ks.keys, func(k verifyKey) bool { return k.kid == h.Kid })
		if i < 0 {
			return nil, reject(ReasonUnknownKey, "token signed by key %s which this server does not trust; issue a token with a current key", quote(h.Kid))
		}
		k := ks.keys[i]
		if k.alg != h.Alg {
			return nil, reject(ReasonAlgorithm, "token alg %s does not match key %s, which verifies %s only", quote(h.Alg), quote(k.kid), quote(k.alg))
		}
		candidates = []verifyKey{k}
	} else {
		for _, k := range ks.keys {
			if k.alg == h.Alg {
				candidates = append(candidates, k)
			}
		}
		if len(candidates) == 0 {
			return nil, reject(ReasonAlgorithm, "token alg %s is not accepted; this server accepts %s", quote(h.Alg), quoteList(accepted))
		}
	}

	signingString := segs[0] + "." + segs[1]
	var good *verifyKey
	for i := range candidates {
		if candidates[i].method.Verify(signingString, sig, candidates[i].key) == nil {
			good = &candidates[i]
			break
		}
	}
	if good == nil {
		if h.Kid != "" {
			return nil, reject(ReasonSignature, "token signature does not verify with key %s; the token was altered or signed by another key", quote(h.Kid))
		}
		return nil, reject(ReasonSignature, "token signature does not verify with any of the %d trusted %s keys; the token was altered or signed by another key", len(candidates), h.Alg)
	}

	if rerr := v.checkClaims(wc); rerr != nil {
		return nil, rerr
	}
	return wc.claims(good.kid), nil
}

// checkClaims checks the registered claims of a token whose signature is good.
func (v *Verifier) checkClaims(wc *wireClaims) *RejectError {
	now := v.now()
	if wc.ExpiresAt == nil {
		return reject(ReasonNoExpiry, "token has no expiry (exp); tether requires one: issue tokens with a TTL")
	}
	if exp := wc.ExpiresAt.Time; !now.Before(exp.Add(v.leeway)) {
		return reject(ReasonExpired, `token expired at %s (now %s); issue a new token with "tether token issue"`, fmtTime(exp), fmtTime(now))
	}
	if wc.NotBefore != nil {
		if nbf := wc.NotBefore.Time; now.Before(nbf.Add(-v.leeway)) {
			return reject(ReasonNotYetValid, "token is not valid before %s (now %s); wait, or check the clocks of the issuer and this server", fmtTime(nbf), fmtTime(now))
		}
	}
	if wc.IssuedAt != nil {
		if iat := wc.IssuedAt.Time; now.Before(iat.Add(-v.leeway)) {
			return reject(ReasonNotYetValid, "token was issued in the future, at %s (now %s); check the clocks of the issuer and this server", fmtTime(iat), fmtTime(now))
		}
	}
	if v.issuer != "" && wc.Issuer != v.issuer {
		if wc.Issuer == "" {
			return reject(ReasonIssuer, "token has no issuer (iss); want %s", quote(v.issuer))
		}
		return reject(ReasonIssuer, "issuer %s not accepted; want %s", quote(wc.Issuer), quote(v.issuer))
	}
	if v.audience != "" && !slices.Contains(wc.Audience, v.audience) {
		if len(wc.Audience) == 0 {
			return reject(ReasonAudience, "token has no audience (aud); want %s", quote(v.audience))
		}
		return reject(ReasonAudience, "audience %s not accepted; want %s", quoteList(wc.Audience), quote(v.audience))
	}
	if wc.Subject == "" {
		return reject(ReasonSubject, "token has no subject (sub); want the tunnel name")
	}
	if problem := tunnelNameProblem(wc.Subject); problem != "" {
		return reject(ReasonSubject, "token subject (sub) is not a valid tunnel name: %s", problem)
	}
	return nil
}

// decodeSegment decodes one base64url JSON segment into dst. The error says
// which step failed without echoing the input.
func decodeSegment(seg string, dst any) error {
	raw, err := base64.RawURLEncoding.Strict().DecodeString(seg)
	if err != nil {
		return errors.New("bad base64url")
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			// Field is a Go path ("RegisteredClaims.sub"); its last element
			// is the JSON member name.
			member := typeErr.Field[strings.LastIndexByte(typeErr.Field, '.')+1:]
			return fmt.Errorf("member %s has the wrong type", quote(member))
		}
		return errors.New("bad JSON")
	}
	return nil
}

// fmtTime renders a claim time for a detail.
func fmtTime(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}

// boundedClaim makes an unverified claim safe to log: valid UTF-8, bounded.
func boundedClaim(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxQuoted {
		return s
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
