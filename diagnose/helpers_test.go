package diagnose

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/client"
	"github.com/tether-dev/tether/tunnel/server"
)

// testDomain makes public URLs like http://acme.localhost:PORT, which
// the end-to-end check dials on loopback.
const testDomain = "localhost"

// keys signs test tokens with a fresh Ed25519 key.
type keys struct {
	signer  *auth.Signer
	pubPath string
}

func newKeys(t *testing.T) *keys {
	t.Helper()
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub.pem")
	if err := auth.GenerateKeyPair(auth.EdDSA, priv, pub); err != nil {
		t.Fatal(err)
	}
	signer, err := auth.LoadSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	return &keys{signer: signer, pubPath: pub}
}

// tokenFile writes a token for tunnel name, issued at issued with ttl.
func (k *keys) tokenFile(t *testing.T, name string, issued time.Time, ttl time.Duration) string {
	t.Helper()
	tok, err := k.signer.Issue(auth.IssueRequest{Tunnel: name, Account: "acct-" + name, Runtime: "rt-" + name, TTL: ttl}, issued)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, "token", tok)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// testServer is a real tether server on loopback.
type testServer struct {
	*server.Server
	keys   *keys
	tunnel string // tunnel listener address
	entry  string // public HTTP entry, host:port
}

func startServer(t *testing.T, mutate ...func(*server.Config)) *testServer {
	t.Helper()
	k := newKeys(t)
	ks, err := auth.NewFileKeySource(k.pubPath)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewVerifier(auth.VerifierConfig{Keys: ks})
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{TunnelAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", Domain: testDomain}
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := server.New(cfg, v, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	ls := server.Listeners{Tunnel: listen(t), HTTP: listen(t), Admin: listen(t)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ls) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server Serve: %v", err)
		}
	})
	return &testServer{Server: srv, keys: k, tunnel: ls.Tunnel.Addr().String(), entry: ls.HTTP.Addr().String()}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// backend is an upstream that answers 200 to everything.
func backend(t *testing.T) string {
	t.Helper()
	return backendFunc(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
}

// backendFunc is an upstream that answers with h.
func backendFunc(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ln := listen(t)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func routes(t *testing.T, specs ...string) []proxy.Route {
	t.Helper()
	var out []proxy.Route
	for _, s := range specs {
		r, err := proxy.ParseRoute(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// clientConfig is the configuration of a client of s whose "/" route goes
// to upstream.
func (s *testServer) clientConfig(tokenFile, upstream string, t *testing.T) client.Config {
	return client.Config{
		Server: s.tunnel, TokenFile: tokenFile, Routes: routes(t, "/="+upstream),
		TLSFingerprint: s.Fingerprint(), Proxy: "direct",
	}
}

// run diagnoses with o and a short timeout.
func diagnoseWith(t *testing.T, o Options) Report {
	t.Helper()
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Requests == 0 {
		o.Requests = 3
	}
	return Run(t.Context(), o)
}

// check returns the report's check called name.
func check(t *testing.T, r Report, name string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, r.Checks)
	return Check{}
}

// wantCheck asserts a check's status and that its detail and hint hold the
// given phrases.
func wantCheck(t *testing.T, r Report, name string, status Status, detail, hint string) {
	t.Helper()
	c := check(t, r, name)
	if c.Status != status {
		t.Errorf("check %s = %s, want %s\ndetail: %s\nhint: %s", name, c.Status, status, c.Detail, c.Hint)
	}
	if !strings.Contains(c.Detail, detail) {
		t.Errorf("check %s detail %q does not mention %q", name, c.Detail, detail)
	}
	if !strings.Contains(c.Hint, hint) {
		t.Errorf("check %s hint %q does not mention %q", name, c.Hint, hint)
	}
	if (status == Fail || status == Warn) && c.Hint == "" {
		t.Errorf("check %s is %s without a hint", name, status)
	}
}

// certs is a CA and the files of a server certificate it issued.
type certs struct {
	caFile, certFile, keyFile string
}

// newCerts makes a CA called caName and a certificate for names.
func newCerts(t *testing.T, caName string, names ...string) certs {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: caName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(90 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(90 * 24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return certs{
		caFile:   writeFile(t, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))),
		certFile: writeFile(t, "tls.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))),
		keyFile:  writeFile(t, "tls.key", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))),
	}
}
