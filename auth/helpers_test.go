package auth_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tether-dev/tether/auth"
)

// now is the fixed clock of the tests: whole seconds, as JWT times are.
var now = time.Date(2026, 11, 23, 3, 0, 0, 0, time.UTC)

func clock() time.Time { return now }

// keyPair is a test signing key with everything a test needs to mint tokens
// by hand (including bad ones the Signer refuses to make).
type keyPair struct {
	priv   any // crypto.Signer, or []byte for HS256
	pub    crypto.PublicKey
	pubPEM []byte
	method jwt.SigningMethod
	signer *auth.Signer
}

// kid is the key ID the verifier computes for the key when loaded from PEM.
func (k *keyPair) kid() string { return k.signer.KeyID() }

// rsaKeys caches RSA keys: generating them is slow under the race detector.
var rsaKeys = struct {
	sync.Mutex
	keys []*rsa.PrivateKey
}{}

func rsaKey(t testing.TB, i int) *rsa.PrivateKey {
	t.Helper()
	rsaKeys.Lock()
	defer rsaKeys.Unlock()
	for len(rsaKeys.keys) <= i {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatalf("generate RSA key: %v", err)
		}
		rsaKeys.keys = append(rsaKeys.keys, k)
	}
	return rsaKeys.keys[i]
}

// newKeyPair makes a fresh key for alg ("EdDSA", "ES256", "RS256"; RS256 keys
// are numbered by variant so that two distinct ones can be had cheaply).
func newKeyPair(t testing.TB, alg auth.Algorithm, variant int) *keyPair {
	t.Helper()
	var priv crypto.Signer
	var method jwt.SigningMethod
	switch alg {
	case auth.EdDSA:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		priv, method = k, jwt.SigningMethodEdDSA
	case auth.ES256:
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		priv, method = k, jwt.SigningMethodES256
	case auth.RS256:
		priv, method = rsaKey(t, variant), jwt.SigningMethodRS256
	default:
		t.Fatalf("no test key for %q", alg)
	}
	der, err := x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	s, err := auth.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return &keyPair{
		priv:   priv,
		pub:    priv.Public(),
		pubPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}),
		method: method,
		signer: s,
	}
}

// newHMACPair makes an HS256 test key.
func newHMACPair(t testing.TB) *keyPair {
	t.Helper()
	// Hex, as a platform makes one (openssl rand -hex 32): raw random bytes
	// may end in "\r" or "\n", which a secret file's reader trims.
	random := make([]byte, 32)
	if _, err := rand.Read(random); err != nil {
		t.Fatal(err)
	}
	secret := []byte(hex.EncodeToString(random))
	s, err := auth.NewHMACSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	return &keyPair{priv: secret, method: jwt.SigningMethodHS256, signer: s}
}

// claims returns valid claims for tunnel "acme" at now, to be modified.
func claims() jwt.MapClaims {
	return jwt.MapClaims{
		"sub":     "acme",
		"account": "acct-1",
		"runtime": "rt-1",
		"jti":     "0123456789abcdef0123456789abcdef",
		"iat":     now.Add(-time.Minute).Unix(),
		"nbf":     now.Add(-time.Minute).Unix(),
		"exp":     now.Add(time.Hour).Unix(),
	}
}

// mint signs c with k, with the key's kid unless header overrides it; a nil
// header value removes that header member.
func mint(t testing.TB, k *keyPair, c jwt.MapClaims, header map[string]any) string {
	t.Helper()
	tok := jwt.NewWithClaims(k.method, c)
	tok.Header["kid"] = k.kid()
	for name, v := range header {
		if v == nil {
			delete(tok.Header, name)
			continue
		}
		tok.Header[name] = v
	}
	s, err := tok.SignedString(k.priv)
	if err != nil {
		t.Fatalf("sign test token: %v", err)
	}
	return s
}

// mintHMAC signs c as HS256 with an arbitrary secret: the confusion attack,
// when the secret is a public key's bytes.
func mintHMAC(t testing.TB, secret []byte, c jwt.MapClaims, header map[string]any) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, c)
	for name, v := range header {
		tok.Header[name] = v
	}
	s, err := tok.SignedString(secret)
	if err != nil {
		t.Fatalf("sign test token: %v", err)
	}
	return s
}

// rawToken builds a token from arbitrary header and claims values and
// signature bytes, bypassing every check of a JWT library.
func rawToken(t testing.TB, header, claims any, sig []byte) string {
	t.Helper()
	enc := func(v any) string {
		if b, ok := v.([]byte); ok {
			return base64.RawURLEncoding.EncodeToString(b)
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(header) + "." + enc(claims) + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// keySet parses PEM or JWKS data.
func keySet(t testing.TB, data ...[]byte) *auth.KeySet {
	t.Helper()
	var all []byte
	for _, d := range data {
		all = append(all, d...)
	}
	ks, err := auth.ParseKeySet(all)
	if err != nil {
		t.Fatalf("ParseKeySet: %v", err)
	}
	return ks
}

// verifier returns a verifier over ks at the test clock.
func verifier(t testing.TB, ks auth.KeySource, mod func(*auth.VerifierConfig)) *auth.Verifier {
	t.Helper()
	cfg := auth.VerifierConfig{Keys: ks, Now: clock}
	if mod != nil {
		mod(&cfg)
	}
	v, err := auth.NewVerifier(cfg)
	if err != nil {
		t.Fatalf("NewVerifier: %v", err)
	}
	return v
}

// writeFile writes data to name in dir and returns the path.
func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
