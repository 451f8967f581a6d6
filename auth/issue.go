package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Algorithm is a token signing algorithm, named as in the JWT alg header.
type Algorithm string

// The algorithms a [Signer] signs with.
const (
	// EdDSA signs with Ed25519: small keys, fast, no parameters to get
	// wrong. The default.
	EdDSA Algorithm = algEdDSA
	// ES256 signs with ECDSA on P-256 and SHA-256.
	ES256 Algorithm = algES256
	// RS256 signs with RSA PKCS#1 v1.5 and SHA-256 (2048-bit keys).
	RS256 Algorithm = algRS256
	// HS256 signs with an HMAC-SHA-256 secret: see [NewHMACSigner].
	// GenerateKeyPair does not make secrets.
	HS256 Algorithm = algHS256
)

// rsaKeyBits is the size of RSA keys made by GenerateKeyPair.
const rsaKeyBits = 2048

// GenerateKeyPair makes a new signing key pair for alg ("" means EdDSA). It
// writes the private key as PKCS#8 PEM to privateKeyPath with mode 0600 and
// the public key as PKIX PEM to publicKeyPath with mode 0644. It refuses to
// overwrite an existing file, and leaves no file behind when it fails.
func GenerateKeyPair(alg Algorithm, privateKeyPath, publicKeyPath string) error {
	if privateKeyPath == "" || publicKeyPath == "" {
		return errors.New("generate key pair: both a private and a public key path are required")
	}
	if privateKeyPath == publicKeyPath {
		return fmt.Errorf("generate key pair: private and public key paths are both %s; want two files", privateKeyPath)
	}
	var priv crypto.Signer
	var err error
	switch alg {
	case "", EdDSA:
		alg = EdDSA
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	case ES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case RS256:
		priv, err = rsa.GenerateKey(rand.Reader, rsaKeyBits)
	default:
		return fmt.Errorf("generate key pair: algorithm %s is not supported; want %q, %q or %q", quote(string(alg)), EdDSA, ES256, RS256)
	}
	if err != nil {
		return fmt.Errorf("generate %s key: %w", alg, err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("encode private key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		return fmt.Errorf("encode public key: %w", err)
	}
	for _, path := range []string{privateKeyPath, publicKeyPath} {
		if _, err := os.Lstat(path); err == nil {
			return fmt.Errorf("generate key pair: %s already exists; refusing to overwrite it (move it away or pick another path)", path)
		}
	}
	if err := writeNewFile(privateKeyPath, 0o600, &pem.Block{Type: "PRIVATE KEY", Bytes: privDER}); err != nil {
		return err
	}
	if err := writeNewFile(publicKeyPath, 0o644, &pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}); err != nil {
		_ = os.Remove(privateKeyPath)
		return err
	}
	return nil
}

// writeNewFile creates path, which must not exist, with exactly mode perm,
// and writes block to it. On failure it removes what it created.
func writeNewFile(path string, perm os.FileMode, block *pem.Block) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("write key: %s already exists; refusing to overwrite it", path)
		}
		return fmt.Errorf("write key: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write key %s: %w", path, cerr)
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	// The umask may have narrowed perm; the modes are part of the contract.
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("write key %s: %w", path, err)
	}
	if err := pem.Encode(f, block); err != nil {
		return fmt.Errorf("write key %s: %w", path, err)
	}
	return nil
}

// Signer issues tunnel tokens with one private key (or HS256 secret). It is
// safe for concurrent use.
type Signer struct {
	key    any // crypto.Signer, or []byte for HS256
	method jwt.SigningMethod
	alg    Algorithm
	kid    string
}

// LoadSigner reads a private key from a PEM file: PKCS#8 ("PRIVATE KEY", as
// written by [GenerateKeyPair]), or the legacy "EC PRIVATE KEY" and
// "RSA PRIVATE KEY" forms. Ed25519 signs EdDSA, EC P-256 signs ES256 and RSA
// (at least 2048 bits) signs RS256. The error names the file and says what
// was found.
func LoadSigner(path string) (*Signer, error) {
	data, err := readKeyFile(path)
	if err != nil {
		return nil, fmt.Errorf("load signing key: %w", err)
	}
	s, err := parseSigner(data)
	if err != nil {
		return nil, fmt.Errorf("load signing key %s: %w", path, err)
	}
	return s, nil
}

// parseSigner reads the first PEM block of data as a private key.
func parseSigner(data []byte) (*Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New(`found no PEM block; want a "PRIVATE KEY" PEM file as written by "tether token keygen"`)
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "PUBLIC KEY", "CERTIFICATE", "RSA PUBLIC KEY":
		return nil, fmt.Errorf("found a %s; want the private key (the --private-key file of \"tether token keygen\")", block.Type)
	case "ENCRYPTED PRIVATE KEY":
		return nil, errors.New("found an encrypted private key; want an unencrypted PKCS#8 key (decrypt it with openssl pkcs8)")
	default:
		return nil, fmt.Errorf("found a PEM block of type %s; want \"PRIVATE KEY\"", quote(block.Type))
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", block.Type, err)
	}
	return newSigner(key)
}

// newSigner binds a private key to its algorithm and kid.
func newSigner(key any) (*Signer, error) {
	var s Signer
	switch k := key.(type) {
	case ed25519.PrivateKey:
		s = Signer{key: k, method: jwt.SigningMethodEdDSA, alg: EdDSA}
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("found an EC key on curve %s; want P-256 (ES256)", k.Curve.Params().Name)
		}
		s = Signer{key: k, method: jwt.SigningMethodES256, alg: ES256}
	case *rsa.PrivateKey:
		if k.N.BitLen() < minRSABits {
			return nil, fmt.Errorf("found a %d-bit RSA key; want at least %d bits", k.N.BitLen(), minRSABits)
		}
		s = Signer{key: k, method: jwt.SigningMethodRS256, alg: RS256}
	default:
		return nil, fmt.Errorf("found a %T key; want Ed25519, EC P-256 or RSA", key)
	}
	kid, err := thumbprint(s.key.(crypto.Signer).Public())
	if err != nil {
		return nil, err
	}
	s.kid = kid
	return &s, nil
}

// NewHMACSigner returns a Signer for HS256 with secret, which must be at least
// 32 bytes. Read the secret with [ReadHMACSecret] so that it matches what
// [NewHMACKeySource] verifies with.
func NewHMACSigner(secret []byte) (*Signer, error) {
	k, err := newHMACKey(secret)
	if err != nil {
		return nil, fmt.Errorf("new HMAC signer: %w", err)
	}
	return &Signer{key: k.key, method: k.method, alg: HS256, kid: k.kid}, nil
}

// Algorithm returns the signing algorithm: "EdDSA", "ES256", "RS256" or "HS256".
func (s *Signer) Algorithm() Algorithm { return s.alg }

// KeyID returns the kid the Signer puts in its tokens: the RFC 7638
// thumbprint of the public key, which verifiers compute from the same key.
func (s *Signer) KeyID() string { return s.kid }

// PublicKey returns the public key of an asymmetric Signer, nil for HS256.
func (s *Signer) PublicKey() crypto.PublicKey {
	if k, ok := s.key.(crypto.Signer); ok {
		return k.Public()
	}
	return nil
}

// IssueRequest describes a token to issue.
type IssueRequest struct {
	// Tunnel is the tunnel name (sub). Required; see [ValidTunnelName].
	Tunnel string
	// Account is the platform account (account claim). Optional.
	Account string
	// Runtime is the platform runtime (runtime claim). Optional.
	Runtime string
	// Issuer is iss. Optional.
	Issuer string
	// Audience is aud. Optional.
	Audience []string
	// TTL is how long the token is valid, counted from NotBefore. Required.
	TTL time.Duration
	// NotBefore is nbf. Zero means the issue time.
	NotBefore time.Time
}

// Issue returns a signed token for req, issued at now: iat is now, nbf is
// req.NotBefore (or now), exp is nbf + TTL, jti is 128 random bits in hex,
// and the header carries the Signer's kid. Times are whole seconds.
func (s *Signer) Issue(req IssueRequest, now time.Time) (string, error) {
	if err := ValidTunnelName(req.Tunnel); err != nil {
		return "", fmt.Errorf("issue token: %w", err)
	}
	if req.TTL <= 0 {
		return "", fmt.Errorf("issue token: TTL is %v; want a positive duration", req.TTL)
	}
	nbf := req.NotBefore
	if nbf.IsZero() {
		nbf = now
	}
	jti, err := newTokenID()
	if err != nil {
		return "", fmt.Errorf("issue token: %w", err)
	}
	return s.sign(wireClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   req.Tunnel,
			Issuer:    req.Issuer,
			Audience:  jwt.ClaimStrings(req.Audience),
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(nbf),
			ExpiresAt: jwt.NewNumericDate(nbf.Add(req.TTL)),
			ID:        jti,
		},
		Account: req.Account,
		Runtime: req.Runtime,
	})
}

// newTokenID returns a jti: 128 random bits in hex.
func newTokenID() (string, error) {
	var jti [16]byte
	if _, err := rand.Read(jti[:]); err != nil {
		return "", fmt.Errorf("make jti: %w", err)
	}
	return hex.EncodeToString(jti[:]), nil
}

// sign signs claims, with the Signer's kid in the header.
func (s *Signer) sign(claims wireClaims) (string, error) {
	tok := jwt.NewWithClaims(s.method, claims)
	tok.Header["kid"] = s.kid
	signed, err := tok.SignedString(s.key)
	if err != nil {
		return "", fmt.Errorf("issue token: sign with %s: %w", s.alg, err)
	}
	// A token Verify would refuse is no token: say so now, not at the
	// client's first login.
	if len(signed) > maxTokenSize {
		return "", fmt.Errorf("issue token: the token is %d bytes, and servers accept at most %d: shorten the account, runtime, issuer or audience claims", len(signed), maxTokenSize)
	}
	return signed, nil
}
