package server

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
)

// What one replica forwards to another crosses the cluster network
// encrypted and bound to its connection: a tap between the two sees no
// caller's cookie, token or body, and the bytes it recorded, sent again to
// the peer port as they were or altered, reach no tunnel.
func TestPeerTapSeesNothingAndReplaysNothing(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	peerA := listen(t)
	tp := newRelay(t, peerA.Addr().String())
	a := startReplicaAt(t, f, k, "a", peerA, tp.addr())
	b := startReplica(t, f, k, "b")
	var reached atomic.Int32
	var bodies sync.Map
	be := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := reached.Add(1)
		bodies.Store(n, fmt.Sprintf("%s %s cookie=%q authorization=%q body=%q", r.Method, r.URL.Path,
			r.Header.Get("Cookie"), r.Header.Get("Authorization"), body))
		_, _ = io.WriteString(w, "answer-for-the-caller")
	}))
	a.runClient(t, "alpha", a.tunnel, 1, be.URL)
	a.waitSessions(t, "alpha", 1)
	b.waitHolders(t, "alpha", 1)

	const (
		cookie = "session=cookie-of-the-caller"
		token  = "Bearer token-of-the-caller"
		body   = "body-of-the-caller"
	)
	req, _ := http.NewRequest(http.MethodPost, b.entry+"/orders", strings.NewReader(body))
	req.Host = "alpha." + testDomain
	req.Header.Set("Cookie", cookie)
	req.Header.Set("Authorization", token)
	req.Header.Set("Connection", "close") // the tap sees one connection, whole
	code, answer, _ := do(t, req)
	if code != http.StatusOK || answer != "answer-for-the-caller" || reached.Load() != 1 {
		t.Fatalf("through replica b: %d %q, the upstream reached %d times; want 200 from alpha's upstream once", code, answer, reached.Load())
	}
	sent, received := tp.recorded()
	if len(sent) == 0 || len(received) == 0 {
		t.Fatalf("the tap saw %d bytes sent and %d received; want the forwarded exchange", len(sent), len(received))
	}
	for _, secret := range []string{"cookie-of-the-caller", "token-of-the-caller", "body-of-the-caller", "/orders", "alpha." + testDomain} {
		if bytes.Contains(sent, []byte(secret)) {
			t.Errorf("the tap read %q in the forwarded request", secret)
		}
	}
	if bytes.Contains(received, []byte("answer-for-the-caller")) {
		t.Error("the tap read the upstream's answer")
	}

	altered := bytes.ReplaceAll(sent, []byte(body), []byte("body-of-the-forger"))
	altered = bytes.ReplaceAll(altered, []byte(token), []byte("Bearer token-of-the-forger"))
	flipped := bytes.Clone(sent)
	flipped[len(flipped)/2] ^= 0xff
	for _, replay := range []struct {
		name  string
		bytes []byte
	}{{"as recorded", sent}, {"altered", altered}, {"with a byte flipped", flipped}} {
		conn, err := net.Dial("tcp", peerA.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write(replay.bytes)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		back, _ := io.ReadAll(conn)
		_ = conn.Close()
		if bytes.Contains(back, []byte("answer-for-the-caller")) {
			t.Errorf("replayed %s: the peer port answered with the upstream's answer", replay.name)
		}
	}
	if n := reached.Load(); n != 1 {
		var seen []string
		bodies.Range(func(_, v any) bool { seen = append(seen, v.(string)); return true })
		t.Errorf("the upstream was reached %d times, want once: the replays reached the tunnel: %q", n, seen)
	}
}

// The peer port serves replicas only: a plain-HTTP client (even one that
// sends the signature header of earlier versions), a TLS client without a
// certificate, with a certificate of its own making, or with one made from
// another secret, and garbage, reach no tunnel and are counted; a replica
// with another secret cannot forward into it either. A client with a
// certificate made from the fleet's secret is served.
func TestPeerPortAdmitsOnlyReplicas(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	var reached atomic.Int32
	be := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { reached.Add(1) }))
	a.runClient(t, "alpha", a.tunnel, 1, be.URL)
	a.waitSessions(t, "alpha", 1)
	peer := a.cfg.PeerAdvertiseAddr
	host := "alpha." + testDomain

	plain := []struct{ name, raw string }{
		{"plain HTTP", "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
		{"plain HTTP signed as earlier versions did", "GET / HTTP/1.1\r\nHost: " + host + "\r\nX-Tether-Peer-Auth: v1 1 00\r\n\r\n"},
		{"garbage", "\x16\x03\x01garbage that is no handshake\r\n\r\n"},
	}
	for _, c := range plain {
		conn, err := net.Dial("tcp", peer)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(conn, c.raw)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		answer, _ := io.ReadAll(conn)
		_ = conn.Close()
		if bytes.Contains(answer, []byte("HTTP/1.1 200")) {
			t.Errorf("%s: answered %q", c.name, answer)
		}
	}
	other, err := credentialsFromSecrets([][]byte{[]byte("another-secret-0123456789")}, "stranger", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	own, err := credentialsFromSecrets([][]byte{[]byte(peerSecretForTests)}, "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	selfMade, err := selfSigned(nil)
	if err != nil {
		t.Fatal(err)
	}
	get := func(cert *tls.Certificate) (int, error) {
		cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the client's trust is not under test
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, "https://"+peer+"/", nil)
		req.Host = host
		res, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		_ = res.Body.Close()
		return res.StatusCode, nil
	}
	for _, c := range []struct {
		name string
		cert *tls.Certificate
	}{{"TLS without a certificate", nil}, {"TLS with a self-made certificate", &selfMade}, {"TLS with a certificate made from another secret", other.cert}} {
		if code, err := get(c.cert); err == nil {
			t.Errorf("%s: answered %d, want the connection refused", c.name, code)
		}
	}
	// The server counts a refusal as its handshake fails, which may be
	// after the client has seen the connection end.
	want := float64(len(plain) + 3)
	testutil.WaitFor(t, 5*time.Second, func() error {
		if got := promtest.ToFloat64(a.metrics.peerRefused); got < want {
			return fmt.Errorf("tether_peer_refused_total = %v, want %v: one per connection refused", got, want)
		}
		return nil
	})
	if got := promtest.ToFloat64(a.metrics.peerRefused); got != want {
		t.Errorf("tether_peer_refused_total = %v, want %v: one per connection refused", got, want)
	}

	stranger := startReplica(t, f, k, "stranger", func(c *Config) {
		c.PeerSecretFile = filepath.Join(t.TempDir(), "another-secret")
		writeFile(t, c.PeerSecretFile, "another-secret-0123456789")
	})
	if code, _, h := stranger.get(t, "alpha", "/"); code == http.StatusOK {
		t.Errorf("through a replica with another secret: %d %s, want the request refused by the peer port", code, h.Get(proxy.ErrorHeader))
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d requests from strangers reached the tunnel", n)
	}

	if code, err := get(own.cert); err != nil || code != http.StatusOK || reached.Load() != 1 {
		t.Errorf("with a certificate made from the fleet's secret: %d, %v, reached %d; want 200 from the tunnel", code, err, reached.Load())
	}
}

// An upstream cannot pass its answer off as a replica's miss: a 503 with
// the miss header from alpha's upstream reaches the caller as it is, and
// the request is not sent to alpha's other replica too.
func TestUpstreamCannotFakeAPeerMiss(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	c := startReplica(t, f, k, "c")
	b := startReplica(t, f, k, "b")
	var reached atomic.Int32
	be := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached.Add(1)
		w.Header().Set(peerMissHeader, "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	a.runClient(t, "alpha", a.tunnel, 1, be.URL)
	c.runClient(t, "alpha", c.tunnel, 1, be.URL)
	a.waitSessions(t, "alpha", 1)
	c.waitSessions(t, "alpha", 1)
	b.waitHolders(t, "alpha", 2)
	for i := range 4 { // b takes the holders in turn: each is first at least once
		req, _ := http.NewRequest(http.MethodDelete, b.entry+"/item", nil)
		req.Host = "alpha." + testDomain
		code, _, h := do(t, req)
		if code != http.StatusServiceUnavailable || h.Get(proxy.ErrorHeader) != "" {
			t.Errorf("DELETE %d: %d %s, want the upstream's own 503", i, code, h.Get(proxy.ErrorHeader))
		}
		if n := reached.Load(); n != int32(i+1) {
			t.Fatalf("after %d DELETEs the upstreams were reached %d times: a request was delivered twice", i+1, n)
		}
	}
}

// testCA is a CA that issues peer certificates into files, as cert-manager
// does.
type testCA struct {
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	pem  []byte
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{key: key, cert: cert, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a certificate for usages, its key and the CA into dir, and
// returns their paths.
func (ca *testCA) issue(t testing.TB, dir string, usages ...x509.ExtKeyUsage) (certFile, keyFile, caFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "replica"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	// Replaced the way a kubelet replaces a Secret's files: written aside,
	// then renamed.
	for path, data := range map[string][]byte{
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		caFile:   ca.pem,
	} {
		if err := os.WriteFile(path+".new", data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile, caFile
}

// Replicas can take their peer certificates from files (cert-manager's)
// instead of the secret: they forward to each other when their
// certificates come from one CA, not when they come from two, and a
// replica takes up renewed files without a restart.
func TestPeerCertificatesFromFiles(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	ca, otherCA := newTestCA(t, "peer CA"), newTestCA(t, "another CA")
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	fromFiles := func(ca *testCA, dir string) func(*Config) {
		return func(c *Config) {
			c.PeerSecretFile = ""
			c.PeerTLSCertFile, c.PeerTLSKeyFile, c.PeerTLSCAFile = ca.issue(t, dir, both...)
		}
	}
	dirB := t.TempDir()
	a := startReplica(t, f, k, "a", fromFiles(ca, t.TempDir()))
	b := startReplica(t, f, k, "b", fromFiles(otherCA, dirB))
	a.runClient(t, "alpha", a.tunnel, 1, backend(t, "alpha").URL)
	a.waitSessions(t, "alpha", 1)
	b.waitHolders(t, "alpha", 1)
	if code, body, h := b.get(t, "alpha", "/"); code != http.StatusBadGateway || h.Get(proxy.ErrorHeader) != "replica_unreachable" {
		t.Errorf("from a replica whose certificate another CA issued: %d %q, want 502 replica_unreachable", code, body)
	}

	ca.issue(t, dirB, both...) // b's certificate renewed, by the fleet's CA
	testutil.WaitFor(t, 3*peerCredentialsRecheck, func() error {
		if code, body, _ := b.get(t, "alpha", "/"); code != http.StatusOK || !strings.HasPrefix(body, "alpha /") {
			return fmt.Errorf("through replica b: %d %q", code, body)
		}
		return nil
	})
}

// The files are checked at start: a certificate that does not verify
// against the CA for both uses, or a missing file, stops the server with
// the flags to fix.
func TestPeerCertificateFilesChecked(t *testing.T) {
	ca, otherCA := newTestCA(t, "peer CA"), newTestCA(t, "another CA")
	cert, key, caFile := ca.issue(t, t.TempDir(), x509.ExtKeyUsageServerAuth) // no client auth
	_, _, otherCAFile := otherCA.issue(t, t.TempDir(), x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	goodCert, goodKey, _ := ca.issue(t, t.TempDir(), x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	for _, c := range []struct {
		name          string
		cert, key, ca string
		want          string
	}{
		{"server auth only", cert, key, caFile, "usages: [server auth, client auth]"},
		{"another CA", goodCert, goodKey, otherCAFile, "does not verify against --peer-tls-ca"},
		{"no CA file", goodCert, goodKey, filepath.Join(t.TempDir(), "missing"), "--peer-tls-"},
	} {
		_, err := newPeerTLS(Config{PeerTLSCertFile: c.cert, PeerTLSKeyFile: c.key, PeerTLSCAFile: c.ca}, zap.NewNop())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error that says %q", c.name, err, c.want)
		}
	}
}

// A peer secret can be rotated without a moment in which two replicas
// refuse each other: each step of the rotation (the new secret added on a
// second line, then moved to the first, then the old one removed) keeps
// working with the step before it, while replicas with only the old and
// only the new secret refuse each other. A replica takes up its changed
// secret file without a restart.
func TestPeerSecretRotation(t *testing.T) {
	const oldSecret, newSecret = "old-secret-0123456789abcdef", "new-secret-0123456789abcdef"
	steps := []string{oldSecret, oldSecret + "\n" + newSecret, newSecret + "\n" + oldSecret, newSecret}
	peerOf := func(secrets string) *peerTLS {
		path := filepath.Join(t.TempDir(), "peer-secret")
		writeFile(t, path, secrets)
		p, err := newPeerTLS(Config{PeerSecretFile: path, ReplicaID: "r"}, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for i := range steps {
		for j := range steps {
			want := i-j <= 1 && j-i <= 1
			if err := peerHandshake(peerOf(steps[i]), peerOf(steps[j])); (err == nil) != want {
				t.Errorf("step %d dialing step %d: %v, want success %v", i, j, err, want)
			}
		}
	}

	path := filepath.Join(t.TempDir(), "peer-secret")
	writeFile(t, path, oldSecret)
	p, err := newPeerTLS(Config{PeerSecretFile: path, ReplicaID: "r"}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rotated := peerOf(newSecret)
	if err := peerHandshake(p, rotated); err == nil {
		t.Fatal("old and new secrets worked together")
	}
	writeFile(t, path, newSecret+"\n"+oldSecret)
	testutil.WaitFor(t, 3*peerCredentialsRecheck, func() error {
		if err := peerHandshake(p, rotated); err != nil {
			return fmt.Errorf("after the file changed: %w", err)
		}
		return peerHandshake(rotated, p)
	})
}

// peerHandshake connects client to server over loopback and reports
// whether each accepted the other.
func peerHandshake(client, server *peerTLS) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer s.Close()
		_ = s.SetDeadline(time.Now().Add(10 * time.Second))
		srv := tls.Server(s, server.serverConfig())
		err = srv.Handshake()
		if err == nil {
			_, err = srv.Write([]byte{1}) // TLS 1.3: the client learns of a refusal at its first read
		}
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	cli := tls.Client(c, client.clientConfig())
	err = cli.Handshake()
	if err == nil {
		_, err = cli.Read(make([]byte, 1))
	}
	_ = c.Close()
	if serr := <-done; serr != nil {
		return fmt.Errorf("server: %w", serr)
	}
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return nil
}

// Peer secrets are checked at start: too short, or none at all.
func TestPeerSecretChecked(t *testing.T) {
	for _, c := range []struct{ name, content, want string }{
		{"too short", "short-secret", "want at least 16 random bytes"},
		{"a short second line", "a-long-enough-secret-0123\nshort", "line 2"},
		{"empty", "\n\n", "is empty"},
	} {
		path := filepath.Join(t.TempDir(), "peer-secret")
		writeFile(t, path, c.content)
		_, err := newPeerTLS(Config{PeerSecretFile: path}, zap.NewNop())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error that says %q", c.name, err, c.want)
		}
	}
}

// replicaOf makes c one of several replicas, without peer credentials.
func replicaOf(c *Config) {
	c.Registry, c.ReplicaID, c.PeerAddr = "redis://redis:6379/0", "a", "10.0.0.1:7443"
}

// peerFiles gives c peer certificate files.
func peerFiles(c *Config) {
	c.PeerTLSCertFile, c.PeerTLSKeyFile, c.PeerTLSCAFile = "tls.crt", "tls.key", "ca.crt"
}

// A response head read from another replica is bounded: a forwarding
// replica does not read a head past maxPeerResponseHeaderBytes (Go's
// default would take 10 MiB), and answers 502.
func TestPeerResponseHeadBounded(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	b := startReplica(t, f, k, "b")
	be := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for i := range 10 {
			w.Header().Set(fmt.Sprintf("X-Large-%d", i), strings.Repeat("h", maxPeerResponseHeaderBytes/8))
		}
	}))
	a.runClient(t, "alpha", a.tunnel, 1, be.URL)
	a.waitSessions(t, "alpha", 1)
	b.waitHolders(t, "alpha", 1)
	if code, body, _ := b.get(t, "alpha", "/"); code != http.StatusBadGateway {
		t.Errorf("a head of %d KiB through replica b: %d %q, want 502", 10*maxPeerResponseHeaderBytes/8>>10, code, body)
	}
}
