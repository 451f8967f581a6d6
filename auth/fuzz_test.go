package auth_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tether-dev/tether/auth"
)

// fuzzKey is a fixed Ed25519 key, so that seed tokens are the same at every
// run (Ed25519 signatures are deterministic).
var fuzzKey = ed25519.NewKeyFromSeed([]byte("tether fuzz key, not a secret!!!"))

var knownReasons = map[auth.Reason]bool{
	auth.ReasonMissingToken: true, auth.ReasonMalformed: true, auth.ReasonAlgorithm: true,
	auth.ReasonUnknownKey: true, auth.ReasonSignature: true, auth.ReasonExpired: true,
	auth.ReasonNotYetValid: true, auth.ReasonNoExpiry: true, auth.ReasonIssuer: true,
	auth.ReasonAudience: true, auth.ReasonSubject: true,
}

// FuzzVerify checks that Verify never panics, refuses with a known reason and
// a detail that does not echo the token, and never accepts a token that is
// not signed by the trusted key: every accepted token is checked again here
// with crypto/ed25519 directly, independent of golang-jwt and of our parser.
func FuzzVerify(f *testing.F) {
	signer, err := auth.NewSignerFromKey(fuzzKey)
	if err != nil {
		f.Fatal(err)
	}
	pub := fuzzKey.Public().(ed25519.PublicKey)
	ks, err := auth.ParseKeySet(jwks(f, map[string]any{
		"kty": "OKP", "crv": "Ed25519", "x": base64.RawURLEncoding.EncodeToString(pub),
	}))
	if err != nil {
		f.Fatal(err)
	}
	v, err := auth.NewVerifier(auth.VerifierConfig{
		Keys: auth.NewStaticKeySource(ks), Now: clock, Audience: "tether",
	})
	if err != nil {
		f.Fatal(err)
	}
	key := &keyPair{priv: fuzzKey, pub: pub, method: jwt.SigningMethodEdDSA, signer: signer}

	good := mint(f, key, with("aud", "tether", "jti", "seed"), nil)
	f.Add(good)
	f.Add(mint(f, key, with("aud", "tether", "jti", "seed"), map[string]any{"kid": nil}))
	f.Add(mint(f, key, with("aud", []string{"a", "tether"}, "sub", "a-b-c"), nil))
	f.Add(mint(f, key, with("aud", "tether", "exp", now.Add(-time.Hour).Unix()), nil))
	f.Add(mint(f, key, with("aud", "tether", "sub", "Acme"), nil))
	f.Add(mint(f, key, with("aud", "tether", "exp", nil), nil))
	f.Add(mint(f, key, with("aud", "other"), nil))
	f.Add(mintHMAC(f, pub, with("aud", "tether"), map[string]any{"kid": signer.KeyID()}))
	f.Add(rawToken(f, map[string]any{"alg": "none"}, with("aud", "tether"), nil))
	f.Add(rawToken(f, map[string]any{"alg": "EdDSA", "crit": []string{"x"}}, with("aud", "tether"), []byte("sig")))
	f.Add(good + "==")
	f.Add(strings.ReplaceAll(good, ".", ".."))
	f.Add("")
	f.Add("...")
	f.Add("eyJ9.eyJ9.e30")
	f.Add(`{"alg":"none"}`)

	f.Fuzz(func(t *testing.T, token string) {
		claims, err := v.Verify(token)
		if err != nil {
			var rej *auth.RejectError
			if !errors.As(err, &rej) {
				t.Fatalf("Verify error %T %v, want *auth.RejectError", err, err)
			}
			if !knownReasons[rej.Reason] {
				t.Fatalf("unknown reason %q", rej.Reason)
			}
			if rej.Detail == "" {
				t.Fatal("empty detail")
			}
			if tok := strings.TrimSpace(token); len(tok) >= 24 && strings.Contains(rej.Error(), tok) {
				t.Fatalf("rejection %q echoes the token", rej.Error())
			}
			return
		}
		if claims == nil || claims.ExpiresAt.IsZero() || auth.ValidTunnelName(claims.Tunnel) != nil {
			t.Fatalf("accepted claims %+v: want an expiry and a valid tunnel name", claims)
		}
		parts := strings.Split(strings.TrimSpace(token), ".")
		if len(parts) != 3 {
			t.Fatalf("accepted a token of %d parts", len(parts))
		}
		var h struct {
			Alg string `json:"alg"`
		}
		hb, err := base64.RawURLEncoding.Strict().DecodeString(parts[0])
		if err != nil || json.Unmarshal(hb, &h) != nil || h.Alg != "EdDSA" {
			t.Fatalf("accepted a token whose header %q is not EdDSA", hb)
		}
		sig, err := base64.RawURLEncoding.Strict().DecodeString(parts[2])
		if err != nil || !ed25519.Verify(pub, []byte(parts[0]+"."+parts[1]), sig) {
			t.Fatalf("accepted a token not signed by the trusted key")
		}
	})
}
