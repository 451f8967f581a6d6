package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
)

// jwk is the subset of RFC 7517/7518 members tether reads.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	N   string `json:"n"`
	E   string `json:"e"`
	// D is present only in private keys; it is read to refuse them.
	D string `json:"d"`
}

// parseJWKS reads a JWK Set (or a single JWK). Following RFC 7517 section 5,
// keys of a type or algorithm tether does not use, and keys for encryption,
// are skipped; the set must keep at least one usable key. Private keys and
// symmetric keys are refused: a JWKS published for verifiers never holds them.
func parseJWKS(data []byte) (*KeySet, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
		Kty  string            `json:"kty"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("decode JSON: %w", err)
	}
	raws := set.Keys
	if raws == nil {
		if set.Kty == "" {
			return nil, errors.New(`found no "keys" array; want a JWKS document {"keys":[...]}`)
		}
		raws = []json.RawMessage{data}
	}
	ks := &KeySet{}
	var skipped []string
	for i, raw := range raws {
		var j jwk
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, fmt.Errorf("key %d: decode JSON: %w", i, err)
		}
		k, skip, err := j.verifyKey()
		if err != nil {
			return nil, fmt.Errorf("key %d (kid %s): %w", i, quote(j.Kid), err)
		}
		if skip != "" {
			skipped = append(skipped, fmt.Sprintf("key %d (kid %s) %s", i, quote(j.Kid), skip))
			continue
		}
		if err := ks.add(k); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
	}
	if ks.Len() == 0 {
		msg := "found no usable key"
		if len(skipped) > 0 {
			msg += " (" + strings.Join(skipped, "; ") + ")"
		}
		return nil, errors.New(msg + "; " + acceptedKeys)
	}
	return ks, nil
}

// verifyKey converts j into a trusted key. A non-empty skip says why j is not
// a key tether uses and is ignored; err says why j is unacceptable.
func (j *jwk) verifyKey() (k verifyKey, skip string, err error) {
	if j.Use != "" && j.Use != "sig" {
		return k, fmt.Sprintf("has use %s, not \"sig\"", quote(j.Use)), nil
	}
	if j.D != "" {
		return k, "", errors.New(`holds private key material ("d"); publish only public keys`)
	}
	var pub any
	var wantAlg []string
	switch j.Kty {
	case "OKP":
		if j.Crv != "Ed25519" {
			return k, fmt.Sprintf("is an OKP key on curve %s, not Ed25519", quote(j.Crv)), nil
		}
		wantAlg = []string{algEdDSA, "Ed25519"}
		x, err := decodeB64(j.X, "x")
		if err != nil {
			return k, "", err
		}
		if len(x) != ed25519.PublicKeySize {
			return k, "", fmt.Errorf(`Ed25519 "x" is %d bytes; want %d`, len(x), ed25519.PublicKeySize)
		}
		pub = ed25519.PublicKey(x)
	case "EC":
		if j.Crv != "P-256" {
			return k, fmt.Sprintf("is an EC key on curve %s, not P-256", quote(j.Crv)), nil
		}
		wantAlg = []string{algES256}
		p, err := j.ecPublicKey()
		if err != nil {
			return k, "", err
		}
		pub = p
	case "RSA":
		wantAlg = []string{algRS256}
		if j.Alg != "" && j.Alg != algRS256 {
			return k, fmt.Sprintf("is an RSA key for alg %s, not RS256", quote(j.Alg)), nil
		}
		p, err := j.rsaPublicKey()
		if err != nil {
			return k, "", err
		}
		pub = p
	case "oct":
		return k, "", errors.New(`is a symmetric ("oct") key; HS256 secrets are configured with a secret file, not in a JWKS`)
	default:
		return k, fmt.Sprintf("has key type %s, not OKP, EC or RSA", quote(j.Kty)), nil
	}
	if j.Alg != "" && !slices.Contains(wantAlg, j.Alg) {
		return k, "", fmt.Errorf("alg %s does not fit a %s key; want %s", quote(j.Alg), j.Kty, wantAlg[0])
	}
	k, err = newVerifyKey(pub, j.Kid)
	return k, "", err
}

// ecPublicKey decodes a P-256 point and checks that it is on the curve.
func (j *jwk) ecPublicKey() (*ecdsa.PublicKey, error) {
	x, err := decodeB64(j.X, "x")
	if err != nil {
		return nil, err
	}
	y, err := decodeB64(j.Y, "y")
	if err != nil {
		return nil, err
	}
	const size = 32
	if len(x) != size || len(y) != size {
		return nil, fmt.Errorf(`P-256 "x" and "y" are %d and %d bytes; want %d each`, len(x), len(y), size)
	}
	point := append(append([]byte{4}, x...), y...)
	p, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), point)
	if err != nil {
		return nil, fmt.Errorf("decode P-256 point: %w", err)
	}
	return p, nil
}

// rsaPublicKey decodes an RSA modulus and exponent.
func (j *jwk) rsaPublicKey() (*rsa.PublicKey, error) {
	n, err := decodeB64(j.N, "n")
	if err != nil {
		return nil, err
	}
	e, err := decodeB64(j.E, "e")
	if err != nil {
		return nil, err
	}
	eInt := new(big.Int).SetBytes(e)
	if !eInt.IsInt64() || eInt.Int64() < 3 || eInt.Int64() > 1<<31-1 || eInt.Bit(0) == 0 {
		return nil, errors.New(`RSA exponent "e" is not an odd number between 3 and 2^31-1`)
	}
	return &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(eInt.Int64())}, nil
}

// decodeB64 decodes a base64url member (RFC 7515: no padding).
func decodeB64(s, member string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("member %q is missing", member)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("member %q is not base64url without padding: %w", member, err)
	}
	return b, nil
}

// thumbprint returns the RFC 7638 JWK thumbprint of a public key: the
// base64url SHA-256 of its required JWK members, in lexicographic order,
// without whitespace. Any implementation of RFC 7638 (e.g. "step crypto jwk
// thumbprint") computes the same kid from the same key.
func thumbprint(pub any) (string, error) {
	b64 := base64.RawURLEncoding.EncodeToString
	var canonical string
	switch p := pub.(type) {
	case ed25519.PublicKey:
		canonical = fmt.Sprintf(`{"crv":"Ed25519","kty":"OKP","x":"%s"}`, b64(p))
	case *ecdsa.PublicKey:
		if p.Curve != elliptic.P256() {
			return "", fmt.Errorf("thumbprint of EC key on curve %s: want P-256", p.Curve.Params().Name)
		}
		point, err := p.Bytes()
		if err != nil {
			return "", fmt.Errorf("encode P-256 key: %w", err)
		}
		canonical = fmt.Sprintf(`{"crv":"P-256","kty":"EC","x":"%s","y":"%s"}`, b64(point[1:33]), b64(point[33:]))
	case *rsa.PublicKey:
		e := big.NewInt(int64(p.E)).Bytes()
		canonical = fmt.Sprintf(`{"e":"%s","kty":"RSA","n":"%s"}`, b64(e), b64(p.N.Bytes()))
	default:
		return "", fmt.Errorf("thumbprint of %T: not an Ed25519, EC or RSA public key", pub)
	}
	sum := sha256.Sum256([]byte(canonical))
	return b64(sum[:]), nil
}

// octThumbprint is the RFC 7638 thumbprint of a symmetric key.
func octThumbprint(secret []byte) string {
	b64 := base64.RawURLEncoding.EncodeToString
	sum := sha256.Sum256([]byte(fmt.Sprintf(`{"k":"%s","kty":"oct"}`, b64(secret))))
	return b64(sum[:])
}
