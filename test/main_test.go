// Package test holds tether's end-to-end tests. Each test starts real
// processes on loopback: the tether binary built once in TestMain, a stock
// frpc built from the pinned frp module, and backends and proxies in the test
// process itself.
//
// The binary is built without the race detector: frp's HTTP vhost, which
// serves stock frpc tunnels, updates its per-connection byte counters without
// synchronisation (pkg/util/net.StatsConn), and a race-enabled server reports
// that now and then. tether's own concurrency runs under the race detector in
// the in-process tests of tunnel/server, tunnel/client and proxy.
package test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Set by TestMain.
var (
	tetherBin string // the tether binary under test
	frpcBin   string // a stock frpc from the pinned frp module
	caFile    string // CA that signed serverCert (for --tls-ca)
	certFile  string // tunnel listener certificate for 127.0.0.1, localhost, tunnel.test
	keyFile   string // its private key
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "tether-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := setup(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	return m.Run()
}

func setup(dir string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the end-to-end tests build tether and frpc with the go command: %w", err)
	}
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))

	tetherBin = filepath.Join(dir, "tether")
	frpcBin = filepath.Join(dir, "frpc")
	builds := [][]string{
		{"build", "-o", tetherBin, "./cmd/tether"},
		{"build", "-tags", "noweb", "-o", frpcBin, "github.com/fatedier/frp/cmd/frpc"},
	}
	errs := make([]error, len(builds))
	var wg sync.WaitGroup
	for i, args := range builds {
		wg.Go(func() {
			cmd := exec.Command(goBin, args...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return writeTestPKI(dir)
}

// writeTestPKI makes a CA and a tunnel listener certificate it signed, valid
// for 127.0.0.1, localhost and tunnel.test (the fake name the egress proxy
// tests give the server).
func writeTestPKI(dir string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tether e2e test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(90 * 24 * time.Hour), // beyond the 14 days under which tether diagnose warns
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "tunnel.test"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(90 * 24 * time.Hour),
		DNSNames:     []string{"tunnel.test", "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	leafKeyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		return err
	}
	caFile = filepath.Join(dir, "ca.pem")
	certFile = filepath.Join(dir, "tls.crt")
	keyFile = filepath.Join(dir, "tls.key")
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{
		{caFile, "CERTIFICATE", caDER},
		{certFile, "CERTIFICATE", leafDER},
		{keyFile, "PRIVATE KEY", leafKeyDER},
	} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return err
		}
	}
	return nil
}
