package auth_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
)

func TestGenerateKeyPairRoundTrip(t *testing.T) {
	for _, alg := range []auth.Algorithm{"", auth.EdDSA, auth.ES256, auth.RS256} {
		name := string(alg)
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			priv, pub := filepath.Join(dir, "jwt.key"), filepath.Join(dir, "jwt.pub")
			if err := auth.GenerateKeyPair(alg, priv, pub); err != nil {
				t.Fatalf("GenerateKeyPair: %v", err)
			}
			for path, mode := range map[string]os.FileMode{priv: 0o600, pub: 0o644} {
				fi, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Perm() != mode {
					t.Errorf("%s mode = %v, want %v", filepath.Base(path), fi.Mode().Perm(), mode)
				}
			}
			assertPEMType(t, priv, "PRIVATE KEY")
			assertPEMType(t, pub, "PUBLIC KEY")

			s, err := auth.LoadSigner(priv)
			if err != nil {
				t.Fatalf("LoadSigner: %v", err)
			}
			wantAlg := alg
			if wantAlg == "" {
				wantAlg = auth.EdDSA
			}
			if s.Algorithm() != wantAlg {
				t.Errorf("Algorithm() = %q, want %q", s.Algorithm(), wantAlg)
			}
			tok, err := s.Issue(auth.IssueRequest{
				Tunnel: "acme", Account: "acct-1", Runtime: "rt-1", TTL: time.Hour,
			}, now)
			if err != nil {
				t.Fatalf("Issue: %v", err)
			}
			keys, err := auth.NewFileKeySource(pub)
			if err != nil {
				t.Fatalf("NewFileKeySource: %v", err)
			}
			c, err := verifier(t, keys, nil).Verify(tok)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if c.Tunnel != "acme" || c.Account != "acct-1" || c.Runtime != "rt-1" || c.KeyID != s.KeyID() {
				t.Errorf("claims = %+v, want acme/acct-1/rt-1 with kid %q", c, s.KeyID())
			}
			if !c.ExpiresAt.Equal(now.Add(time.Hour)) {
				t.Errorf("ExpiresAt = %v, want %v", c.ExpiresAt, now.Add(time.Hour))
			}
		})
	}
}

func assertPEMType(t *testing.T, path, want string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != want {
		t.Errorf("%s: PEM block %v, want type %q", filepath.Base(path), block, want)
	}
}

func TestGenerateKeyPairRefusesToOverwrite(t *testing.T) {
	for _, existing := range []string{"jwt.key", "jwt.pub"} {
		t.Run(existing, func(t *testing.T) {
			dir := t.TempDir()
			priv, pub := filepath.Join(dir, "jwt.key"), filepath.Join(dir, "jwt.pub")
			taken := writeFile(t, dir, existing, []byte("precious"))
			err := auth.GenerateKeyPair(auth.EdDSA, priv, pub)
			if err == nil || !strings.Contains(err.Error(), taken) || !strings.Contains(err.Error(), "already exists") {
				t.Fatalf("GenerateKeyPair error = %v, want one naming %s", err, taken)
			}
			if data, _ := os.ReadFile(taken); string(data) != "precious" {
				t.Errorf("%s was overwritten", existing)
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Errorf("directory has %d files, want only the existing one", len(entries))
			}
		})
	}
}

func TestGenerateKeyPairErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name      string
		alg       auth.Algorithm
		priv, pub string
		want      string
	}{
		{"unknown alg", "HS256", filepath.Join(dir, "a"), filepath.Join(dir, "b"), `"HS256" is not supported`},
		{"same path", auth.EdDSA, filepath.Join(dir, "a"), filepath.Join(dir, "a"), "want two files"},
		{"empty path", auth.EdDSA, "", filepath.Join(dir, "b"), "required"},
		{"missing directory", auth.EdDSA, filepath.Join(dir, "no", "a"), filepath.Join(dir, "b"), "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := auth.GenerateKeyPair(tc.alg, tc.priv, tc.pub)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed calls left %d files behind", len(entries))
	}
}

func TestLoadSigner(t *testing.T) {
	dir := t.TempDir()
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecDER, _ := x509.MarshalECPrivateKey(ecKey)
	rsKey := rsaKey(t, 0)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p384DER, _ := x509.MarshalPKCS8PrivateKey(p384)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	edPubDER, _ := x509.MarshalPKIXPublicKey(edKey.Public())

	pemFile := func(name, typ string, der []byte) string {
		return writeFile(t, dir, name, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	tests := []struct {
		name    string
		path    string
		wantAlg auth.Algorithm
		wantErr string
	}{
		{"legacy EC", pemFile("ec.key", "EC PRIVATE KEY", ecDER), auth.ES256, ""},
		{"legacy RSA", pemFile("rsa.key", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsKey)), auth.RS256, ""},
		{"public key", pemFile("ed.pub", "PUBLIC KEY", edPubDER), "", "found a PUBLIC KEY; want the private key"},
		{"P-384", pemFile("p384.key", "PRIVATE KEY", p384DER), "", "P-384"},
		{"encrypted", pemFile("enc.key", "ENCRYPTED PRIVATE KEY", []byte{1}), "", "encrypted"},
		{"not PEM", writeFile(t, dir, "text.key", []byte("hello")), "", "no PEM block"},
		{"bad DER", pemFile("bad.key", "PRIVATE KEY", []byte{1, 2}), "", "parse PRIVATE KEY"},
		{"missing", filepath.Join(dir, "missing.key"), "", "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := auth.LoadSigner(tc.path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tc.path) {
					t.Fatalf("LoadSigner error = %v, want one naming %s and containing %q", err, tc.path, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadSigner: %v", err)
			}
			if s.Algorithm() != tc.wantAlg {
				t.Errorf("Algorithm() = %q, want %q", s.Algorithm(), tc.wantAlg)
			}
		})
	}
}

func TestIssue(t *testing.T) {
	k := newKeyPair(t, auth.EdDSA, 0)
	v := verifier(t, auth.NewStaticKeySource(keySet(t, k.pubPEM)), nil)

	t.Run("future not-before", func(t *testing.T) {
		nbf := now.Add(2 * time.Hour)
		tok, err := k.signer.Issue(auth.IssueRequest{Tunnel: "acme", TTL: time.Hour, NotBefore: nbf}, now)
		if err != nil {
			t.Fatal(err)
		}
		if got := reasonOf(verifyErr(v, tok)); got != auth.ReasonNotYetValid {
			t.Errorf("reason = %q, want %q", got, auth.ReasonNotYetValid)
		}
		later := verifier(t, auth.NewStaticKeySource(keySet(t, k.pubPEM)), func(c *auth.VerifierConfig) {
			c.Now = func() time.Time { return nbf.Add(time.Minute) }
		})
		c, err := later.Verify(tok)
		if err != nil {
			t.Fatalf("Verify after nbf: %v", err)
		}
		if !c.IssuedAt.Equal(now) || !c.NotBefore.Equal(nbf) || !c.ExpiresAt.Equal(nbf.Add(time.Hour)) {
			t.Errorf("iat/nbf/exp = %v/%v/%v, want %v/%v/%v", c.IssuedAt, c.NotBefore, c.ExpiresAt, now, nbf, nbf.Add(time.Hour))
		}
	})

	t.Run("unique jti", func(t *testing.T) {
		seen := map[string]bool{}
		hex := regexp.MustCompile(`^[0-9a-f]{32}$`)
		for range 20 {
			tok, err := k.signer.Issue(auth.IssueRequest{Tunnel: "acme", TTL: time.Hour}, now)
			if err != nil {
				t.Fatal(err)
			}
			c, err := v.Verify(tok)
			if err != nil {
				t.Fatal(err)
			}
			if !hex.MatchString(c.ID) || seen[c.ID] {
				t.Fatalf("jti %q: want 32 fresh hex digits", c.ID)
			}
			seen[c.ID] = true
		}
	})

	// Issue gives only tokens Verify accepts: a client whose claims make
	// the token too long learns it from whoever issues it, not from its
	// first login.
	t.Run("longest token", func(t *testing.T) {
		issue := func(account int) (string, error) {
			return k.signer.Issue(auth.IssueRequest{Tunnel: "acme", Account: strings.Repeat("a", account), TTL: time.Hour}, now)
		}
		ok, refused := 0, 8<<10 // accounts of these lengths: issued, refused
		if _, err := issue(refused); err == nil {
			t.Fatalf("Issue with an account of %d bytes: no error", refused)
		}
		for refused-ok > 1 {
			mid := (ok + refused) / 2
			if _, err := issue(mid); err == nil {
				ok = mid
			} else {
				refused = mid
			}
		}
		tok, err := issue(ok)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(tok); err != nil {
			t.Errorf("the longest token Issue gives (%d bytes) does not verify: %v", len(tok), err)
		}
		_, err = issue(refused)
		if err == nil || !strings.Contains(err.Error(), "at most 8192") || !strings.Contains(err.Error(), "account") {
			t.Errorf("Issue with an account of %d bytes: %v; want the limit and the claims to shorten", refused, err)
		}
	})

	for _, tc := range []struct {
		name string
		req  auth.IssueRequest
		want string
	}{
		{"bad tunnel name", auth.IssueRequest{Tunnel: "Acme", TTL: time.Hour}, "uppercase"},
		{"empty tunnel name", auth.IssueRequest{TTL: time.Hour}, "empty"},
		{"no TTL", auth.IssueRequest{Tunnel: "acme"}, "TTL"},
		{"negative TTL", auth.IssueRequest{Tunnel: "acme", TTL: -time.Second}, "positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := k.signer.Issue(tc.req, now)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Issue error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestValidTunnelName(t *testing.T) {
	tests := []struct {
		name string
		want string // "" means valid
	}{
		{"acme", ""},
		{"a", ""},
		{"0", ""},
		{"acme-prod-2", ""},
		{strings.Repeat("x", 63), ""},
		{"", "empty"},
		{strings.Repeat("x", 64), "64 characters long; want at most 63"},
		{"Acme", "uppercase"},
		{"-acme", "starts or ends with '-'"},
		{"acme-", "starts or ends with '-'"},
		{"ac_me", `'_' at byte 2`},
		{"acme.example", `'.'`},
		{"acmé", `'é'`},
		{"ac me", `' '`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := auth.ValidTunnelName(tc.name)
			if tc.want == "" {
				if err != nil {
					t.Errorf("ValidTunnelName(%q) = %v, want nil", tc.name, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ValidTunnelName(%q) = %v, want an error containing %q", tc.name, err, tc.want)
			}
			if !errors.Is(err, auth.ErrInvalidTunnelName) {
				t.Errorf("error %v does not wrap ErrInvalidTunnelName", err)
			}
		})
	}
}
