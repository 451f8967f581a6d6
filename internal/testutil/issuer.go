package testutil

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
)

// Issuer is a fake token issuer for tests: a fresh Ed25519 key pair in the
// test's temporary directory and a Signer that mints tokens with it, the way
// the platform and "tether token issue" do.
type Issuer struct {
	// PublicKeyPath is the PEM public key, as given to "tether server
	// --jwt-public-key".
	PublicKeyPath string
	// PrivateKeyPath is the PKCS#8 PEM private key, as given to "tether token
	// issue --key".
	PrivateKeyPath string
	// Now is the issue time of minted tokens. Nil means time.Now. Set it
	// before the first Token call.
	Now func() time.Time

	t      testing.TB
	signer *auth.Signer
}

// NewIssuer generates a key pair in t.TempDir() and returns an Issuer for it.
// It fails the test on any error.
func NewIssuer(t testing.TB) *Issuer {
	t.Helper()
	dir := t.TempDir()
	iss := &Issuer{
		PublicKeyPath:  filepath.Join(dir, "jwt.pub"),
		PrivateKeyPath: filepath.Join(dir, "jwt.key"),
		t:              t,
	}
	if err := auth.GenerateKeyPair(auth.EdDSA, iss.PrivateKeyPath, iss.PublicKeyPath); err != nil {
		t.Fatalf("testutil: %v", err)
	}
	s, err := auth.LoadSigner(iss.PrivateKeyPath)
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	iss.signer = s
	return iss
}

// Token mints a token for tunnel, valid for ttl from now, with account
// "acct-<tunnel>" and runtime "rt-<tunnel>".
func (i *Issuer) Token(tunnel string, ttl time.Duration) string {
	i.t.Helper()
	return i.TokenWith(auth.IssueRequest{
		Tunnel:  tunnel,
		Account: "acct-" + tunnel,
		Runtime: "rt-" + tunnel,
		TTL:     ttl,
	})
}

// TokenWith mints a token for req as it is (TTL is required), issued at Now.
func (i *Issuer) TokenWith(req auth.IssueRequest) string {
	i.t.Helper()
	now := time.Now()
	if i.Now != nil {
		now = i.Now()
	}
	tok, err := i.signer.Issue(req, now)
	if err != nil {
		i.t.Fatalf("testutil: %v", err)
	}
	return tok
}

// KeySource returns a file KeySource over PublicKeyPath, as the server builds
// from --jwt-public-key.
func (i *Issuer) KeySource() auth.KeySource {
	i.t.Helper()
	ks, err := auth.NewFileKeySource(i.PublicKeyPath)
	if err != nil {
		i.t.Fatalf("testutil: %v", err)
	}
	return ks
}

// Verifier returns a Verifier over KeySource with the default settings.
func (i *Issuer) Verifier() *auth.Verifier {
	i.t.Helper()
	v, err := auth.NewVerifier(auth.VerifierConfig{Keys: i.KeySource(), Now: i.Now})
	if err != nil {
		i.t.Fatalf("testutil: %v", err)
	}
	return v
}

// KeyID returns the kid of the issuer's tokens.
func (i *Issuer) KeyID() string { return i.signer.KeyID() }
