package auth_test

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tether-dev/tether/auth"
)

// with returns valid claims with the given members set (nil removes one).
func with(kv ...any) jwt.MapClaims {
	c := claims()
	for i := 0; i+1 < len(kv); i += 2 {
		name := kv[i].(string)
		if kv[i+1] == nil {
			delete(c, name)
			continue
		}
		c[name] = kv[i+1]
	}
	return c
}

func TestVerify(t *testing.T) {
	ed := newKeyPair(t, auth.EdDSA, 0)
	ec := newKeyPair(t, auth.ES256, 0)
	rs := newKeyPair(t, auth.RS256, 0)
	hm := newHMACPair(t)
	otherEd := newKeyPair(t, auth.EdDSA, 0)
	otherRS := newKeyPair(t, auth.RS256, 1)

	// One PEM file with three keys: also the "PEM with several keys" case.
	pemKeys := auth.NewStaticKeySource(keySet(t, ed.pubPEM, ec.pubPEM, rs.pubPEM))
	hmacKeys, err := auth.NewHMACKeySource(writeFile(t, t.TempDir(), "secret", append(hm.priv.([]byte), '\n')))
	if err != nil {
		t.Fatal(err)
	}

	vPEM := verifier(t, pemKeys, nil)
	vHMAC := verifier(t, hmacKeys, nil)
	vIssAud := verifier(t, pemKeys, func(c *auth.VerifierConfig) {
		c.Issuer = "https://platform.example"
		c.Audience = "tether"
	})
	vLeeway5 := verifier(t, pemKeys, func(c *auth.VerifierConfig) { c.Leeway = 5 * time.Second })
	vNoLeeway := verifier(t, pemKeys, func(c *auth.VerifierConfig) { c.Leeway = -1 })

	issued := func(k *keyPair, req auth.IssueRequest) string {
		t.Helper()
		if req.Tunnel == "" {
			req.Tunnel = "acme"
		}
		if req.TTL == 0 {
			req.TTL = time.Hour
		}
		tok, err := k.signer.Issue(req, now.Add(-time.Minute))
		if err != nil {
			t.Fatalf("Issue: %v", err)
		}
		return tok
	}
	// tampered swaps the claims of a good token for others.
	tampered := func(tok string) string {
		parts := strings.Split(tok, ".")
		forged := strings.Split(rawToken(t, map[string]any{}, with("sub", "other"), nil), ".")[1]
		return parts[0] + "." + forged + "." + parts[2]
	}
	edPEMAsSecret := ed.pubPEM
	rsPEMAsSecret := rs.pubPEM
	edRawAsSecret := []byte(ed.pub.(ed25519.PublicKey))

	tests := []struct {
		name       string
		v          *auth.Verifier
		token      string
		want       auth.Reason // "" means accepted
		detail     []string    // substrings the detail must contain
		wantTunnel string      // ClaimedTunnel on rejection, Tunnel on success
	}{
		// Accepted.
		{name: "ed25519", v: vPEM, token: issued(ed, auth.IssueRequest{}), wantTunnel: "acme"},
		{name: "es256", v: vPEM, token: issued(ec, auth.IssueRequest{}), wantTunnel: "acme"},
		{name: "rs256", v: vPEM, token: issued(rs, auth.IssueRequest{}), wantTunnel: "acme"},
		{name: "hs256", v: vHMAC, token: issued(hm, auth.IssueRequest{}), wantTunnel: "acme"},
		{name: "no kid tries every key of the alg", v: vPEM, token: mint(t, ec, claims(), map[string]any{"kid": nil}), wantTunnel: "acme"},
		{name: "surrounding whitespace", v: vPEM, token: " " + issued(ed, auth.IssueRequest{}) + "\n", wantTunnel: "acme"},
		{name: "iss and aud match", v: vIssAud, token: mint(t, ed, with("iss", "https://platform.example", "aud", []string{"x", "tether"}), nil), wantTunnel: "acme"},
		{name: "aud as a string", v: vIssAud, token: mint(t, ed, with("iss", "https://platform.example", "aud", "tether"), nil), wantTunnel: "acme"},
		{name: "exp within default leeway", v: vPEM, token: mint(t, ed, with("exp", now.Add(-29*time.Second).Unix()), nil), wantTunnel: "acme"},
		{name: "nbf within default leeway", v: vPEM, token: mint(t, ed, with("nbf", now.Add(30*time.Second).Unix()), nil), wantTunnel: "acme"},
		{name: "iat within default leeway", v: vPEM, token: mint(t, ed, with("iat", now.Add(30*time.Second).Unix()), nil), wantTunnel: "acme"},
		{name: "exp within leeway 5s", v: vLeeway5, token: mint(t, ed, with("exp", now.Add(-4*time.Second).Unix()), nil), wantTunnel: "acme"},
		{name: "exp one second ahead without leeway", v: vNoLeeway, token: mint(t, ed, with("exp", now.Add(time.Second).Unix()), nil), wantTunnel: "acme"},
		{name: "63-character name", v: vPEM, token: mint(t, ed, with("sub", strings.Repeat("a", 63)), nil), wantTunnel: strings.Repeat("a", 63)},
		{name: "no iat nor nbf", v: vPEM, token: mint(t, ed, with("iat", nil, "nbf", nil), nil), wantTunnel: "acme"},

		// Structure.
		{name: "empty", v: vPEM, token: "", want: auth.ReasonMissingToken},
		{name: "blank", v: vPEM, token: " \n", want: auth.ReasonMissingToken},
		{name: "not a JWT", v: vPEM, token: "not-a-jwt-at-all", want: auth.ReasonMalformed, detail: []string{"1 dot-separated parts"}},
		{name: "two parts", v: vPEM, token: "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhY21lIn0", want: auth.ReasonMalformed},
		{name: "five parts (JWE)", v: vPEM, token: "aaaa.bbbb.cccc.dddd.eeee", want: auth.ReasonMalformed},
		{name: "header not base64", v: vPEM, token: "!!!!.eyJzdWIiOiJhY21lIn0.c2ln", want: auth.ReasonMalformed, detail: []string{"header"}},
		{name: "header not JSON", v: vPEM, token: rawToken(t, []byte("hello there"), claims(), []byte("sig")), want: auth.ReasonMalformed, detail: []string{"header"}},
		{name: "claims not JSON", v: vPEM, token: rawToken(t, map[string]any{"alg": "EdDSA"}, []byte("[1,2"), []byte("sig")), want: auth.ReasonMalformed, detail: []string{"claims"}},
		{name: "sub is a number", v: vPEM, token: mint(t, ed, with("sub", 42), nil), want: auth.ReasonMalformed, detail: []string{`"sub"`}},
		{name: "exp is a string", v: vPEM, token: mint(t, ed, with("exp", "tomorrow"), nil), want: auth.ReasonMalformed},
		{name: "signature not base64url", v: vPEM, token: strings.Split(issued(ed, auth.IssueRequest{}), ".")[0] + "." + strings.Split(issued(ed, auth.IssueRequest{}), ".")[1] + ".a+b/c==", want: auth.ReasonMalformed, detail: []string{"signature"}},
		{name: "padded signature", v: vPEM, token: issued(ed, auth.IssueRequest{}) + "==", want: auth.ReasonMalformed},
		{name: "huge", v: vPEM, token: strings.Repeat("a", 9000) + ".b.c", want: auth.ReasonMalformed, detail: []string{"9004 bytes"}},
		{name: "crit header", v: vPEM, token: mint(t, ed, claims(), map[string]any{"crit": []string{"exp"}}), want: auth.ReasonMalformed, detail: []string{"crit"}},

		// Algorithm.
		{name: "alg none", v: vPEM, token: rawToken(t, map[string]any{"alg": "none", "typ": "JWT"}, claims(), nil), want: auth.ReasonAlgorithm, detail: []string{`"none"`, `"EdDSA"`}, wantTunnel: "acme"},
		{name: "alg none with a trusted kid", v: vPEM, token: rawToken(t, map[string]any{"alg": "none", "kid": ed.kid()}, claims(), nil), want: auth.ReasonAlgorithm},
		{name: "alg NONE", v: vPEM, token: rawToken(t, map[string]any{"alg": "NONE"}, claims(), nil), want: auth.ReasonAlgorithm},
		{name: "no alg", v: vPEM, token: rawToken(t, map[string]any{"kid": ed.kid()}, claims(), []byte("sig")), want: auth.ReasonAlgorithm},
		{name: "alg not a string", v: vPEM, token: rawToken(t, map[string]any{"alg": 1}, claims(), []byte("sig")), want: auth.ReasonMalformed},
		{name: "HS256 with RSA public key as secret", v: vPEM, token: mintHMAC(t, rsPEMAsSecret, claims(), nil), want: auth.ReasonAlgorithm, detail: []string{`"HS256" is not accepted`}},
		{name: "HS256 with RSA public key as secret and its kid", v: vPEM, token: mintHMAC(t, rsPEMAsSecret, claims(), map[string]any{"kid": rs.kid()}), want: auth.ReasonAlgorithm},
		{name: "HS256 with Ed25519 public key as secret", v: vPEM, token: mintHMAC(t, edPEMAsSecret, claims(), map[string]any{"kid": ed.kid()}), want: auth.ReasonAlgorithm},
		{name: "HS256 with Ed25519 raw public key as secret", v: vPEM, token: mintHMAC(t, edRawAsSecret, claims(), nil), want: auth.ReasonAlgorithm},
		{name: "RS512", v: vPEM, token: mintWith(t, rs, jwt.SigningMethodRS512, claims()), want: auth.ReasonAlgorithm, detail: []string{`"RS512"`}},
		{name: "ES256 token naming the Ed25519 key", v: vPEM, token: mint(t, ec, claims(), map[string]any{"kid": ed.kid()}), want: auth.ReasonAlgorithm, detail: []string{`verifies "EdDSA" only`}},
		{name: "EdDSA token on an HS256 server", v: vHMAC, token: issued(ed, auth.IssueRequest{}), want: auth.ReasonUnknownKey},
		{name: "EdDSA token without kid on an HS256 server", v: vHMAC, token: mint(t, ed, claims(), map[string]any{"kid": nil}), want: auth.ReasonAlgorithm, detail: []string{`accepts ["HS256"]`}},

		// Keys and signatures.
		{name: "unknown kid", v: vPEM, token: mint(t, ed, claims(), map[string]any{"kid": "abc"}), want: auth.ReasonUnknownKey, detail: []string{`key "abc"`, "does not trust"}},
		{name: "another key pair with its kid", v: vPEM, token: issued(otherEd, auth.IssueRequest{}), want: auth.ReasonUnknownKey, wantTunnel: "acme"},
		{name: "another key pair without kid", v: vPEM, token: mint(t, otherEd, claims(), map[string]any{"kid": nil}), want: auth.ReasonSignature},
		{name: "another RSA key pair claiming a trusted kid", v: vPEM, token: mint(t, otherRS, claims(), map[string]any{"kid": rs.kid()}), want: auth.ReasonSignature},
		{name: "another HMAC secret", v: vHMAC, token: mint(t, newHMACPair(t), claims(), map[string]any{"kid": nil}), want: auth.ReasonSignature},
		{name: "altered claims", v: vPEM, token: tampered(issued(ed, auth.IssueRequest{})), want: auth.ReasonSignature, wantTunnel: "other"},
		{name: "empty signature", v: vPEM, token: strings.TrimRightFunc(issued(ed, auth.IssueRequest{}), func(r rune) bool { return r != '.' }), want: auth.ReasonSignature},
		{name: "expired and badly signed", v: vPEM, token: mint(t, otherEd, with("exp", now.Add(-time.Hour).Unix()), map[string]any{"kid": ed.kid()}), want: auth.ReasonSignature},

		// Time.
		{name: "expired", v: vPEM, token: mint(t, ed, with("exp", now.Add(-time.Hour).Unix()), nil), want: auth.ReasonExpired,
			detail: []string{"token expired at 2026-11-23T02:00:00Z (now 2026-11-23T03:00:00Z)", "tether token issue"}, wantTunnel: "acme"},
		{name: "expired at the default leeway", v: vPEM, token: mint(t, ed, with("exp", now.Add(-30*time.Second).Unix()), nil), want: auth.ReasonExpired},
		{name: "expired at leeway 5s", v: vLeeway5, token: mint(t, ed, with("exp", now.Add(-5*time.Second).Unix()), nil), want: auth.ReasonExpired},
		{name: "expired now without leeway", v: vNoLeeway, token: mint(t, ed, with("exp", now.Unix()), nil), want: auth.ReasonExpired},
		{name: "nbf beyond leeway", v: vPEM, token: mint(t, ed, with("nbf", now.Add(31*time.Second).Unix()), nil), want: auth.ReasonNotYetValid, detail: []string{"2026-11-23T03:00:31Z"}},
		{name: "iat beyond leeway", v: vPEM, token: mint(t, ed, with("iat", now.Add(31*time.Second).Unix()), nil), want: auth.ReasonNotYetValid, detail: []string{"issued in the future"}},
		{name: "no exp", v: vPEM, token: mint(t, ed, with("exp", nil), nil), want: auth.ReasonNoExpiry},

		// Issuer and audience.
		{name: "wrong issuer", v: vIssAud, token: mint(t, ed, with("iss", "https://evil.example", "aud", "tether"), nil), want: auth.ReasonIssuer,
			detail: []string{`issuer "https://evil.example" not accepted; want "https://platform.example"`}},
		{name: "no issuer", v: vIssAud, token: mint(t, ed, with("aud", "tether"), nil), want: auth.ReasonIssuer, detail: []string{`want "https://platform.example"`}},
		{name: "wrong audience", v: vIssAud, token: mint(t, ed, with("iss", "https://platform.example", "aud", []string{"x"}), nil), want: auth.ReasonAudience,
			detail: []string{`audience ["x"] not accepted; want "tether"`}},
		{name: "no audience", v: vIssAud, token: mint(t, ed, with("iss", "https://platform.example"), nil), want: auth.ReasonAudience, detail: []string{`want "tether"`}},

		// Subject.
		{name: "uppercase sub", v: vPEM, token: mint(t, ed, with("sub", "Acme"), nil), want: auth.ReasonSubject, detail: []string{"uppercase"}, wantTunnel: "Acme"},
		{name: "too long sub", v: vPEM, token: mint(t, ed, with("sub", strings.Repeat("a", 64)), nil), want: auth.ReasonSubject, detail: []string{"64 characters"}},
		{name: "leading dash", v: vPEM, token: mint(t, ed, with("sub", "-acme"), nil), want: auth.ReasonSubject},
		{name: "trailing dash", v: vPEM, token: mint(t, ed, with("sub", "acme-"), nil), want: auth.ReasonSubject},
		{name: "dotted sub", v: vPEM, token: mint(t, ed, with("sub", "acme.evil"), nil), want: auth.ReasonSubject},
		{name: "empty sub", v: vPEM, token: mint(t, ed, with("sub", ""), nil), want: auth.ReasonSubject, detail: []string{"no subject"}},
		{name: "missing sub", v: vPEM, token: mint(t, ed, with("sub", nil), nil), want: auth.ReasonSubject},
		{name: "unicode sub", v: vPEM, token: mint(t, ed, with("sub", "acmé"), nil), want: auth.ReasonSubject},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.v.Verify(tc.token)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if got.Tunnel != tc.wantTunnel {
					t.Errorf("Tunnel = %q, want %q", got.Tunnel, tc.wantTunnel)
				}
				if got.ExpiresAt.IsZero() {
					t.Error("ExpiresAt is zero after Verify")
				}
				return
			}
			if got != nil {
				t.Errorf("Verify returned claims %+v with an error", got)
			}
			var rej *auth.RejectError
			if !errors.As(err, &rej) {
				t.Fatalf("Verify error = %T %v, want *auth.RejectError", err, err)
			}
			if rej.Reason != tc.want {
				t.Errorf("Reason = %q, want %q (detail: %s)", rej.Reason, tc.want, rej.Detail)
			}
			if rej.Detail == "" {
				t.Error("Detail is empty")
			}
			if tok := strings.TrimSpace(tc.token); tok != "" && strings.Contains(err.Error(), tok) {
				t.Errorf("error %q contains the token", err)
			}
			for _, seg := range strings.Split(strings.TrimSpace(tc.token), ".") {
				if len(seg) >= 16 && strings.Contains(err.Error(), seg) {
					t.Errorf("error %q contains token segment %q", err, seg)
				}
			}
			for _, want := range tc.detail {
				if !strings.Contains(rej.Detail, want) {
					t.Errorf("Detail = %q, want it to contain %q", rej.Detail, want)
				}
			}
			if tc.wantTunnel != "" && rej.ClaimedTunnel != tc.wantTunnel {
				t.Errorf("ClaimedTunnel = %q, want %q", rej.ClaimedTunnel, tc.wantTunnel)
			}
		})
	}
}

// mintWith signs c with k's key under another method of the same key type.
func mintWith(t testing.TB, k *keyPair, m jwt.SigningMethod, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, c)
	tok.Header["kid"] = k.kid()
	s, err := tok.SignedString(k.priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestVerifyClaims(t *testing.T) {
	k := newKeyPair(t, auth.EdDSA, 0)
	v := verifier(t, auth.NewStaticKeySource(keySet(t, k.pubPEM)), nil)
	tok, err := k.signer.Issue(auth.IssueRequest{
		Tunnel:   "acme",
		Account:  "acct-1",
		Runtime:  "rt-1",
		Issuer:   "https://platform.example",
		Audience: []string{"tether"},
		TTL:      time.Hour,
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(tok)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	want := auth.Claims{
		Tunnel: "acme", Account: "acct-1", Runtime: "rt-1", Issuer: "https://platform.example",
		Audience: []string{"tether"}, IssuedAt: now, NotBefore: now, ExpiresAt: now.Add(time.Hour),
		KeyID: k.kid(),
	}
	if len(c.ID) != 32 {
		t.Errorf("ID = %q, want 32 hex digits", c.ID)
	}
	c.ID = ""
	if fmt.Sprint(*c) != fmt.Sprint(want) {
		t.Errorf("claims = %+v\nwant %+v", *c, want)
	}
}

func TestNewVerifierNeedsKeys(t *testing.T) {
	if _, err := auth.NewVerifier(auth.VerifierConfig{}); err == nil {
		t.Fatal("NewVerifier without keys: got nil error")
	}
}

func TestVerifyWithoutKeys(t *testing.T) {
	v := verifier(t, auth.NewStaticKeySource(nil), nil)
	k := newKeyPair(t, auth.EdDSA, 0)
	_, err := v.Verify(mint(t, k, claims(), nil))
	var rej *auth.RejectError
	if !errors.As(err, &rej) || rej.Reason != auth.ReasonUnknownKey {
		t.Fatalf("Verify = %v, want reason %q", err, auth.ReasonUnknownKey)
	}
}

// failingSource returns good keys and a reload error.
type failingSource struct{ ks *auth.KeySet }

func (s failingSource) Keys() (*auth.KeySet, error) { return s.ks, errors.New("reload: boom") }

func TestVerifyReportsKeyErrors(t *testing.T) {
	k := newKeyPair(t, auth.EdDSA, 0)
	var got []error
	v := verifier(t, failingSource{keySet(t, k.pubPEM)}, func(c *auth.VerifierConfig) {
		c.OnKeyError = func(err error) { got = append(got, err) }
	})
	if _, err := v.Verify(mint(t, k, claims(), nil)); err != nil {
		t.Fatalf("Verify with the last good keys: %v", err)
	}
	if len(got) != 1 || got[0].Error() != "reload: boom" {
		t.Errorf("OnKeyError got %v, want [reload: boom]", got)
	}
}

func TestRejectErrorText(t *testing.T) {
	e := &auth.RejectError{Reason: auth.ReasonExpired, Detail: "token expired at X"}
	if got, want := e.Error(), "expired: token expired at X"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got, want := (&auth.RejectError{Reason: auth.ReasonProxy}).Error(), "proxy"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestVerifyBoundsClaimedTunnel(t *testing.T) {
	k := newKeyPair(t, auth.EdDSA, 0)
	v := verifier(t, auth.NewStaticKeySource(keySet(t, k.pubPEM)), nil)
	_, err := v.Verify(mint(t, k, with("sub", strings.Repeat("A", 500)), nil))
	var rej *auth.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("Verify = %v, want a rejection", err)
	}
	if len(rej.ClaimedTunnel) > 70 || len(rej.Detail) > 300 {
		t.Errorf("unbounded echo: ClaimedTunnel %d bytes, Detail %d bytes", len(rej.ClaimedTunnel), len(rej.Detail))
	}
}
