package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// certificates serves the tunnel listener's certificate: the files given
// with --tls-cert/--tls-key, re-read when they change on disk (a renewed
// cert-manager Secret takes effect without a restart), or a self-signed one
// made at start.
type certificates struct {
	// Static after construction.
	certFile, keyFile string

	// Guarded by mu.
	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string    // modification times and sizes of the files loaded
	checked time.Time // last time the files were looked at
}

// newCertificates loads the key pair, or makes a self-signed one for hosts
// when both file names are empty.
func newCertificates(certFile, keyFile string, hosts []string) (*certificates, error) {
	c := &certificates{certFile: certFile, keyFile: keyFile}
	if certFile == "" && keyFile == "" {
		cert, err := selfSigned(hosts)
		if err != nil {
			return nil, fmt.Errorf("make self-signed certificate: %w", err)
		}
		c.cert = &cert
		return c, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, fmt.Errorf("--tls-cert and --tls-key go together: give both files or neither (neither makes a self-signed certificate)")
	}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// selfSignedOnly reports whether the certificate was made at start.
func (c *certificates) selfSignedOnly() bool { return c.certFile == "" }

// GetCertificate is tls.Config.GetCertificate. It looks at the files at most
// once every few seconds; a broken renewal keeps the last good certificate.
func (c *certificates) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.certFile != "" && time.Since(c.checked) > 5*time.Second {
		c.checked = time.Now()
		_ = c.reloadLocked() // keep serving the previous certificate on error
	}
	return c.cert, nil
}

func (c *certificates) reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checked = time.Now()
	return c.reloadLocked()
}

func (c *certificates) reloadLocked() error {
	stamp, err := fileStamp(c.certFile, c.keyFile)
	if err != nil {
		return err
	}
	if stamp == c.stamp && c.cert != nil {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("load TLS key pair --tls-cert %s --tls-key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cert, c.stamp = &cert, stamp
	return nil
}

// Fingerprint is the SHA-256 of the certificate's DER, as colon-separated
// hex: what `tether client --tls-fingerprint` pins.
func (c *certificates) Fingerprint() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return tunnel.Fingerprint(c.cert.Certificate[0])
}

func fileStamp(paths ...string) (string, error) {
	var b strings.Builder
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("read TLS file: %w", err)
		}
		fmt.Fprintf(&b, "%s:%d:%d;", p, fi.ModTime().UnixNano(), fi.Size())
	}
	return b.String(), nil
}

// selfSigned makes an ECDSA P-256 certificate valid for a year, for hosts
// (names or IPs) and the loopback names.
func selfSigned(hosts []string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "tether self-signed"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			if !ip.IsUnspecified() {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else if h != "localhost" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
