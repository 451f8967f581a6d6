package auth_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
)

// The RFC 7638 section 3.1 example key and thumbprint.
const (
	rfc7638N          = "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw"
	rfc7638Thumbprint = "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"
	// RFC 8037 appendix A.2 and A.3: an Ed25519 public key and its thumbprint.
	rfc8037X          = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
	rfc8037Thumbprint = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
)

func TestThumbprintVectors(t *testing.T) {
	tests := []struct {
		name string
		jwk  string
		want string
	}{
		{"RFC 7638 RSA", `{"kty":"RSA","n":"` + rfc7638N + `","e":"AQAB"}`, rfc7638Thumbprint},
		{"RFC 8037 Ed25519", `{"kty":"OKP","crv":"Ed25519","x":"` + rfc8037X + `"}`, rfc8037Thumbprint},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ks := keySet(t, []byte(`{"keys":[`+tc.jwk+`]}`))
			if got := ks.KeyIDs(); !slices.Equal(got, []string{tc.want}) {
				t.Errorf("KeyIDs() = %q, want [%q]", got, tc.want)
			}
		})
	}
}

// jwkOf renders the public JWK of k, with kid when not empty.
func jwkOf(t testing.TB, k *keyPair, kid string) map[string]any {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	m := map[string]any{}
	switch p := k.pub.(type) {
	case ed25519.PublicKey:
		m = map[string]any{"kty": "OKP", "crv": "Ed25519", "x": b64(p), "alg": "EdDSA"}
	case *ecdsa.PublicKey:
		b, err := p.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		m = map[string]any{"kty": "EC", "crv": "P-256", "x": b64(b[1:33]), "y": b64(b[33:]), "use": "sig"}
	case *rsa.PublicKey:
		m = map[string]any{"kty": "RSA", "n": b64(p.N.Bytes()), "e": b64(big.NewInt(int64(p.E)).Bytes()), "alg": "RS256"}
	default:
		t.Fatalf("no JWK for %T", k.pub)
	}
	if kid != "" {
		m["kid"] = kid
	}
	return m
}

func jwks(t testing.TB, keys ...map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The verifier computes the same kid from a PEM or kid-less JWKS key as the
// Signer puts in its tokens, for every algorithm.
func TestKeyIDsMatchSigner(t *testing.T) {
	for _, alg := range []auth.Algorithm{auth.EdDSA, auth.ES256, auth.RS256} {
		t.Run(string(alg), func(t *testing.T) {
			k := newKeyPair(t, alg, 0)
			for name, data := range map[string][]byte{
				"PEM":  k.pubPEM,
				"JWKS": jwks(t, jwkOf(t, k, "")),
				"JWK":  mustJSON(t, jwkOf(t, k, "")),
			} {
				ks := keySet(t, data)
				if got := ks.KeyIDs(); !slices.Equal(got, []string{k.signer.KeyID()}) {
					t.Errorf("%s: KeyIDs() = %q, want [%q]", name, got, k.signer.KeyID())
				}
				tok, err := k.signer.Issue(auth.IssueRequest{Tunnel: "acme", TTL: time.Hour}, now)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := verifier(t, auth.NewStaticKeySource(ks), nil).Verify(tok); err != nil {
					t.Errorf("%s: Verify: %v", name, err)
				}
			}
		})
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A JWKS with the old and the new key during a rotation: tokens of both
// verify, each checked only against the key its kid names.
func TestJWKSRotation(t *testing.T) {
	oldKey := newKeyPair(t, auth.RS256, 0)
	newKey := newKeyPair(t, auth.EdDSA, 0)
	ks := keySet(t, jwks(t, jwkOf(t, oldKey, "2026-01"), jwkOf(t, newKey, "2026-06")))
	if got, want := ks.KeyIDs(), []string{"2026-01", "2026-06"}; !slices.Equal(got, want) {
		t.Fatalf("KeyIDs() = %q, want %q", got, want)
	}
	v := verifier(t, auth.NewStaticKeySource(ks), nil)
	for _, tc := range []struct {
		name string
		tok  string
		want auth.Reason
	}{
		{"old key", mint(t, oldKey, claims(), map[string]any{"kid": "2026-01"}), ""},
		{"new key", mint(t, newKey, claims(), map[string]any{"kid": "2026-06"}), ""},
		{"new key without kid", mint(t, newKey, claims(), map[string]any{"kid": nil}), ""},
		{"new key under the old kid", mint(t, newKey, claims(), map[string]any{"kid": "2026-01"}), auth.ReasonAlgorithm},
		{"thumbprint kid of a JWKS key with its own kid", mint(t, newKey, claims(), nil), auth.ReasonUnknownKey},
		{"retired kid", mint(t, newKey, claims(), map[string]any{"kid": "2025-06"}), auth.ReasonUnknownKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(tc.tok)
			if got := reasonOf(err); got != tc.want {
				t.Errorf("reason = %q, want %q (err: %v)", got, tc.want, err)
			}
		})
	}
}

// reasonOf returns the Reason of a *RejectError, "" for nil.
func reasonOf(err error) auth.Reason {
	if err == nil {
		return ""
	}
	if rej, ok := err.(*auth.RejectError); ok {
		return rej.Reason
	}
	return "not a RejectError: " + auth.Reason(err.Error())
}

func TestParseKeySetPEM(t *testing.T) {
	ed := newKeyPair(t, auth.EdDSA, 0)
	ec := newKeyPair(t, auth.ES256, 0)
	rs := newKeyPair(t, auth.RS256, 0)
	rsDER := x509.MarshalPKCS1PublicKey(rs.pub.(*rsa.PublicKey))
	rsPKCS1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: rsDER})

	// A self-signed certificate for the Ed25519 key, with text around it
	// as in a CA bundle.
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "issuer"}, NotBefore: now, NotAfter: now.Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, ed.pub, ed.priv)
	if err != nil {
		t.Fatal(err)
	}
	cert := append([]byte("# issuer certificate\n"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)

	tests := []struct {
		name string
		data []byte
		want []string
	}{
		{"three keys", concat(ed.pubPEM, ec.pubPEM, rs.pubPEM), []string{ed.kid(), ec.kid(), rs.kid()}},
		{"certificate", cert, []string{ed.kid()}},
		{"certificate and its key, deduplicated", concat(cert, ed.pubPEM), []string{ed.kid()}},
		{"PKCS#1 RSA", rsPKCS1, []string{rs.kid()}},
		{"leading whitespace", concat([]byte("\n\n  "), ed.pubPEM), []string{ed.kid()}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ks, err := auth.ParseKeySet(tc.data)
			if err != nil {
				t.Fatalf("ParseKeySet: %v", err)
			}
			if got := ks.KeyIDs(); !slices.Equal(got, tc.want) {
				t.Errorf("KeyIDs() = %q, want %q", got, tc.want)
			}
			if ks.Len() != len(tc.want) {
				t.Errorf("Len() = %d, want %d", ks.Len(), len(tc.want))
			}
		})
	}
}

func concat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

func TestParseKeySetErrors(t *testing.T) {
	ed := newKeyPair(t, auth.EdDSA, 0)
	ec := newKeyPair(t, auth.ES256, 0)
	rs := newKeyPair(t, auth.RS256, 0)

	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384DER, _ := x509.MarshalPKIXPublicKey(p384.Public())
	rsaSmall, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	rsaSmallDER, _ := x509.MarshalPKIXPublicKey(rsaSmall.Public())
	privDER, _ := x509.MarshalPKCS8PrivateKey(ed.priv)

	edJWK := jwkOf(t, ed, "a")
	withMember := func(m map[string]any, kv ...any) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}

	tests := []struct {
		name string
		data []byte
		want []string // substrings of the error
	}{
		{"empty", nil, []string{"no data", "want PEM"}},
		{"text", []byte("hello"), []string{"no PEM block", "want PEM"}},
		{"private key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), []string{"private key", "public key"}},
		{"unknown block", pem.EncodeToMemory(&pem.Block{Type: "DH PARAMETERS", Bytes: []byte{1}}), []string{"DH PARAMETERS", "unsupported"}},
		{"bad DER", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2, 3}}), []string{"block 1"}},
		{"P-384", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: p384DER}), []string{"P-384", "want P-256"}},
		{"RSA 1024", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: rsaSmallDER}), []string{"1024 bits", "2048"}},
		{"second block bad", concat(ed.pubPEM, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: p384DER})), []string{"block 2"}},
		{"JWKS not JSON", []byte(`{"keys":`), []string{"JWKS", "JSON"}},
		{"JWKS without keys", []byte(`{"foo":1}`), []string{`no "keys"`}},
		{"JWKS empty", []byte(`{"keys":[]}`), []string{"no usable key"}},
		{"JWKS private key", jwks(t, withMember(edJWK, "d", "AAAA")), []string{"private key material"}},
		{"JWKS oct", jwks(t, map[string]any{"kty": "oct", "k": "c2VjcmV0"}), []string{"oct", "secret file"}},
		{"JWKS only enc keys", jwks(t, withMember(edJWK, "use", "enc")), []string{"no usable key", `use "enc"`}},
		{"JWKS alg mismatch", jwks(t, withMember(edJWK, "alg", "RS256")), []string{`alg "RS256"`, "EdDSA"}},
		{"JWKS unknown kty only", jwks(t, map[string]any{"kty": "XYZ"}), []string{"no usable key", `"XYZ"`}},
		{"JWKS duplicate kid", jwks(t, jwkOf(t, ed, "same"), jwkOf(t, ec, "same")), []string{`kid "same"`}},
		{"JWKS bad base64", jwks(t, withMember(edJWK, "x", "not base64!")), []string{`"x"`, "base64url"}},
		{"JWKS short Ed25519", jwks(t, withMember(edJWK, "x", "AAAA")), []string{"3 bytes"}},
		{"JWKS EC point off curve", jwks(t, withMember(jwkOf(t, ec, "e"), "y", base64.RawURLEncoding.EncodeToString(make([]byte, 32)))), []string{"P-256 point"}},
		{"JWKS RSA even exponent", jwks(t, withMember(jwkOf(t, rs, "r"), "e", "Ag")), []string{"exponent"}},
		{"JWKS RSA missing n", jwks(t, map[string]any{"kty": "RSA", "e": "AQAB"}), []string{`"n" is missing`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ks, err := auth.ParseKeySet(tc.data)
			if err == nil {
				t.Fatalf("ParseKeySet = %d keys, want an error", ks.Len())
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// Keys that tether does not use are skipped when a usable key remains, as
// RFC 7517 section 5 asks.
func TestParseKeySetSkipsForeignKeys(t *testing.T) {
	ed := newKeyPair(t, auth.EdDSA, 0)
	data := jwks(t,
		map[string]any{"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA", "kid": "p384"},
		map[string]any{"kty": "RSA", "alg": "RSA-OAEP", "n": "AA", "e": "AQAB", "kid": "enc"},
		map[string]any{"kty": "OKP", "crv": "X25519", "x": "AA", "kid": "x25519"},
		jwkOf(t, ed, "mine"),
	)
	ks := keySet(t, data)
	if got := ks.KeyIDs(); !slices.Equal(got, []string{"mine"}) {
		t.Errorf("KeyIDs() = %q, want [mine]", got)
	}
}
