package auth

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"

	"github.com/golang-jwt/jwt/v5"
)

// The JWS algorithms tether accepts, one per key type. The key decides the
// algorithm, never the token: that is what rules out alg=none and RSA/HMAC
// confusion (a token that says HS256 is never checked against a public key).
const (
	algEdDSA = "EdDSA"
	algES256 = "ES256"
	algRS256 = "RS256"
	algHS256 = "HS256"
)

// minRSABits is the smallest RSA modulus accepted for signing or verifying.
const minRSABits = 2048

// minHMACSecret is the smallest HS256 secret accepted, in bytes: the output
// size of SHA-256 (RFC 7518, section 3.2).
const minHMACSecret = 32

// acceptedKeys says, in errors, what a key file may hold.
const acceptedKeys = "want PEM PUBLIC KEY or CERTIFICATE blocks, or a JWKS JSON document, " +
	"with Ed25519 (EdDSA), EC P-256 (ES256) or RSA >= 2048-bit (RS256) keys"

// KeySet is an immutable set of verification keys, each with its key ID (kid)
// and the one algorithm it verifies. Several keys are normal during a key
// rotation. The zero value holds no keys.
type KeySet struct {
	keys []verifyKey
}

// verifyKey is one trusted key.
type verifyKey struct {
	kid    string
	alg    string
	method jwt.SigningMethod
	// key is ed25519.PublicKey, *ecdsa.PublicKey, *rsa.PublicKey, or []byte
	// for an HS256 secret: the types golang-jwt's methods verify with, so a
	// key can only ever be used by the method of its own type.
	key any
}

// Len returns the number of keys.
func (ks *KeySet) Len() int {
	if ks == nil {
		return 0
	}
	return len(ks.keys)
}

// KeyIDs returns the key IDs in the set, in file order, for logs.
func (ks *KeySet) KeyIDs() []string {
	if ks == nil {
		return nil
	}
	ids := make([]string, len(ks.keys))
	for i, k := range ks.keys {
		ids[i] = k.kid
	}
	return ids
}

// algorithms returns the distinct algorithms of the set, sorted.
func (ks *KeySet) algorithms() []string {
	var algs []string
	for _, k := range ks.keys {
		if !slices.Contains(algs, k.alg) {
			algs = append(algs, k.alg)
		}
	}
	slices.Sort(algs)
	return algs
}

// add appends k, refusing a second, different key with the same kid. The same
// key twice (a PEM bundle that repeats a certificate) is kept once.
func (ks *KeySet) add(k verifyKey) error {
	for _, old := range ks.keys {
		if old.kid != k.kid {
			continue
		}
		if sameKey(old.key, k.key) {
			return nil
		}
		return fmt.Errorf("two different keys have kid %s; give each key its own kid", quote(k.kid))
	}
	ks.keys = append(ks.keys, k)
	return nil
}

// sameKey reports whether a and b are the same key.
func sameKey(a, b any) bool {
	if ab, ok := a.([]byte); ok {
		bb, ok := b.([]byte)
		return ok && bytes.Equal(ab, bb)
	}
	if ae, ok := a.(interface{ Equal(x crypto.PublicKey) bool }); ok {
		return ae.Equal(b)
	}
	return false
}

// ParseKeySet parses verification keys from PEM or from a JWKS document. A
// document whose first non-space byte is '{' is read as JWKS (RFC 7517; a
// single JWK is also accepted); anything else as PEM, which may hold several
// PUBLIC KEY, RSA PUBLIC KEY and CERTIFICATE blocks. Keys from PEM get their
// RFC 7638 JWK thumbprint as kid, which is what [Signer] puts in the tokens it
// issues; JWKS keys keep their own kid, or get the thumbprint when they have
// none. HS256 secrets are not accepted here: see [NewHMACKeySource].
func ParseKeySet(data []byte) (*KeySet, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, errors.New("parse keys: no data; " + acceptedKeys)
	}
	if trimmed[0] == '{' {
		ks, err := parseJWKS(trimmed)
		if err != nil {
			return nil, fmt.Errorf("parse JWKS: %w", err)
		}
		return ks, nil
	}
	ks, err := parsePEMKeys(trimmed)
	if err != nil {
		return nil, fmt.Errorf("parse PEM keys: %w", err)
	}
	return ks, nil
}

// parsePEMKeys reads every PEM block of data as a public key.
func parsePEMKeys(data []byte) (*KeySet, error) {
	ks := &KeySet{}
	rest := data
	for n := 1; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		pub, err := pemPublicKey(block)
		if err != nil {
			return nil, fmt.Errorf("block %d (%s): %w", n, block.Type, err)
		}
		k, err := newVerifyKey(pub, "")
		if err != nil {
			return nil, fmt.Errorf("block %d (%s): %w", n, block.Type, err)
		}
		if err := ks.add(k); err != nil {
			return nil, fmt.Errorf("block %d (%s): %w", n, block.Type, err)
		}
	}
	if ks.Len() == 0 {
		return nil, errors.New("found no PEM block; " + acceptedKeys)
	}
	return ks, nil
}

// pemPublicKey extracts the public key of one PEM block.
func pemPublicKey(block *pem.Block) (any, error) {
	switch block.Type {
	case "PUBLIC KEY":
		return x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		return x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		return cert.PublicKey, nil
	case "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "OPENSSH PRIVATE KEY":
		return nil, errors.New("this is a private key; the server needs only the public key " +
			`("tether token keygen" writes it to the --public-key file)`)
	default:
		return nil, errors.New("unsupported PEM block type; " + acceptedKeys)
	}
}

// newVerifyKey classifies pub and binds it to its algorithm. An empty kid is
// replaced by the key's RFC 7638 thumbprint.
func newVerifyKey(pub any, kid string) (verifyKey, error) {
	var k verifyKey
	switch p := pub.(type) {
	case ed25519.PublicKey:
		if len(p) != ed25519.PublicKeySize {
			return k, fmt.Errorf("Ed25519 key is %d bytes; want %d", len(p), ed25519.PublicKeySize)
		}
		k = verifyKey{alg: algEdDSA, method: jwt.SigningMethodEdDSA, key: p}
	case *ecdsa.PublicKey:
		if p.Curve != elliptic.P256() {
			return k, fmt.Errorf("EC key on curve %s is not accepted; want P-256 (ES256)", p.Curve.Params().Name)
		}
		k = verifyKey{alg: algES256, method: jwt.SigningMethodES256, key: p}
	case *rsa.PublicKey:
		if p.N.BitLen() < minRSABits {
			return k, fmt.Errorf("RSA key is %d bits; want at least %d", p.N.BitLen(), minRSABits)
		}
		k = verifyKey{alg: algRS256, method: jwt.SigningMethodRS256, key: p}
	default:
		return k, fmt.Errorf("%T keys are not accepted; want Ed25519, EC P-256 or RSA", pub)
	}
	if kid == "" {
		tp, err := thumbprint(pub)
		if err != nil {
			return k, err
		}
		kid = tp
	}
	k.kid = kid
	return k, nil
}

// newHMACKey wraps an HS256 secret. Its kid is the RFC 7638 thumbprint of the
// secret as an "oct" JWK: a SHA-256 of a secret of at least 256 bits, which
// names the key without revealing it.
func newHMACKey(secret []byte) (verifyKey, error) {
	if len(secret) < minHMACSecret {
		return verifyKey{}, fmt.Errorf("HS256 secret is %d bytes; want at least %d", len(secret), minHMACSecret)
	}
	s := bytes.Clone(secret)
	return verifyKey{kid: octThumbprint(s), alg: algHS256, method: jwt.SigningMethodHS256, key: s}, nil
}
