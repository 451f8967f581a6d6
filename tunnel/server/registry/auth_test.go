package registry

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"

	"github.com/tether-dev/tether/internal/testutil"
)

func randomSecret(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestPasswordFromFile: replicas log in to a Redis that requires a password
// read from a file, and the password shows nowhere.
func TestPasswordFromFile(t *testing.T) {
	secret := randomSecret(t)
	srv := startRedis(t, "--requirepass", secret)
	file := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	password, err := ReadPassword(file)
	if err != nil {
		t.Fatalf("ReadPassword: %v", err)
	}
	if password != secret {
		t.Fatalf("ReadPassword: got %q, want the file's content without its newline", password)
	}

	a := newReplica(t, srv.URL(), "a", password).start(t)
	b := newReplica(t, srv.URL(), "b", password).start(t)
	a.Hold("t")
	testutil.WaitFor(t, 5*time.Second, all(
		func() error { return holdersAre(b, "t", a.holder(t, "t")) },
		func() error { return isUp(a) },
	))
	assertNoSecret(t, secret, a, b)
}

// TestWrongPassword: a wrong or missing password gives a clear error, in
// Status and at Warn, that does not contain the password.
func TestWrongPassword(t *testing.T) {
	secret := randomSecret(t)
	srv := startRedis(t, "--requirepass", secret)
	wrong := randomSecret(t)
	host := strings.TrimPrefix(srv.URL(), "redis://")
	for _, tc := range []struct {
		name, url, password string
	}{
		{"wrong password from a file", srv.URL(), wrong},
		{"wrong password in the URL", "redis://:" + wrong + "@" + host, ""},
		{"no password", srv.URL(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReplica(t, tc.url, "a", tc.password).start(t)
			r.Hold("t")
			testutil.WaitFor(t, 5*time.Second, func() error {
				if r.Status().LastError == "" {
					return errors.New("no error reported yet")
				}
				return nil
			})
			st := r.Status()
			if st.Up || !strings.Contains(st.LastError, "refused the login; check the password (--registry-password-file)") {
				t.Errorf("status: got %+v, want down, with an error that says to check the password", st)
			}
			if strings.Contains(st.Target, wrong) {
				t.Errorf("status target %q shows the password", st.Target)
			}
			warns := r.logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("unreachable").All()
			if len(warns) != 1 || !strings.Contains(warns[0].ContextMap()["error"].(string), "check the password (--registry-password-file)") {
				t.Errorf("got %d warnings %v, want one that says to check the password", len(warns), warns)
			}
			c := NewCollector(r)
			if up, errs := metric(t, c, "tether_registry_up"), metric(t, c, "tether_registry_errors_total"); up != 0 || errs < float64(max(st.Errors, 1)) {
				t.Errorf("metrics: got up %v and %v errors, want 0 and at least %d", up, errs, max(st.Errors, 1))
			}
			r.stop(t)
			assertNoSecret(t, wrong, r)
			assertNoSecret(t, secret, r)
		})
	}
}

// metric returns the value of the metric name that c collects.
func metric(t *testing.T, c prometheus.Collector, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			m := f.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// assertNoSecret fails if secret is in the status or the logs of rs.
func assertNoSecret(t *testing.T, secret string, rs ...*replica) {
	t.Helper()
	for _, r := range rs {
		st := r.Status()
		if strings.Contains(st.Target+st.LastError, secret) {
			t.Errorf("status of %s shows the password: %+v", r.cfg.Replica, st)
		}
		for _, e := range r.logs.All() {
			if line := e.Message + " " + stringify(e.ContextMap()); strings.Contains(line, secret) {
				t.Errorf("a log line of %s shows the password: %s", r.cfg.Replica, line)
			}
		}
	}
}

func stringify(m map[string]any) string {
	var b strings.Builder
	for k, v := range m {
		b.WriteString(k)
		b.WriteString("=")
		if s, ok := v.(string); ok {
			b.WriteString(s)
		} else if err, ok := v.(error); ok {
			b.WriteString(err.Error())
		}
		b.WriteString(" ")
	}
	return b.String()
}

// TestTLS: rediss:// URLs speak TLS, and verify the server's certificate.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	pool := writeCerts(t, dir)
	srv := testutil.NewRedisServer(t,
		"--tls-cert-file", filepath.Join(dir, "cert.pem"),
		"--tls-key-file", filepath.Join(dir, "key.pem"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"),
		"--tls-auth-clients", "no")
	srv.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	srv.Start()
	url := "rediss://" + srv.Addr + "/0"
	withCA := func(c *Config) { c.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12} }

	a := runReplica(t, url, "a", withCA)
	b := runReplica(t, url, "b", withCA)
	a.Hold("t")
	testutil.WaitFor(t, 5*time.Second, all(
		func() error { return holdersAre(b, "t", a.holder(t, "t")) },
		func() error { return isUp(a) },
	))
	if st := a.Status(); st.Target != url {
		t.Errorf("status: got %+v, want target %s", st, url)
	}

	// Without the CA, the server's certificate is not trusted.
	u := runReplica(t, url, "u")
	testutil.WaitFor(t, 5*time.Second, func() error {
		if err := u.Status().LastError; !strings.Contains(err, "certificate") {
			return errors.New("no certificate error reported yet: " + err)
		}
		return nil
	})
}

// writeCerts writes a CA and a certificate for 127.0.0.1 signed by it, and
// returns a pool with the CA.
func writeCerts(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "registry test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"ca.pem":   {Type: "CERTIFICATE", Bytes: caDER},
		"cert.pem": {Type: "CERTIFICATE", Bytes: der},
		"key.pem":  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool
}

// TestACLUser: the permissions that the package doc lists are enough, with
// the user in the URL and the password from a file.
func TestACLUser(t *testing.T) {
	srv := startRedis(t)
	secret := randomSecret(t)
	admin := srv.client()
	defer admin.Close()
	err := admin.Do(t.Context(), "ACL", "SETUSER", "tether", "on", ">"+secret,
		"resetkeys", "~tether:*", "resetchannels", "&tether:events", "-@all",
		"+get", "+set", "+pexpire", "+del", "+pttl", "+scan", "+publish", "+subscribe",
		"+ping", "+eval", "+evalsha", "+hello", "+client|setname").Err()
	if err != nil {
		t.Fatalf("create the ACL user: %v", err)
	}
	url := "redis://tether@" + srv.Addr + "/0"
	a := newReplica(t, url, "a", secret).start(t)
	b := newReplica(t, url, "b", secret).start(t)
	a.Hold("t")
	testutil.WaitFor(t, 5*time.Second, all(
		func() error { return holdersAre(b, "t", a.holder(t, "t")) },
		func() error { return isUp(a) },
		func() error { return isUp(b) },
	))
	a.Release("t")
	testutil.WaitFor(t, 5*time.Second, func() error { return holdersAre(b, "t") })
	for _, r := range []*replica{a, b} {
		if st := r.Status(); st.Errors != 0 {
			t.Errorf("status of %s: got %+v, want no error", r.cfg.Replica, st)
		}
	}
}
