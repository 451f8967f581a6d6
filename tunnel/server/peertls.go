package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The peer channel. Replicas talk to each other over TLS 1.3 with mutual
// authentication: the peer port accepts only a client that presents a
// replica's certificate, and a replica forwards only to a peer port that
// presents one. A replica's certificate is one that chains to the peer CA;
// no name is checked, since a replica is reached at a pod address, which no
// certificate names, and what makes a certificate a replica's is the CA
// that signed it. So whoever can read or write the cluster network can
// neither read a forwarded request (cookies, tokens, bodies), nor replay
// one (each connection has keys of its own, and TLS 1.3 as Go speaks it
// has no 0-RTT data), nor alter one (every record is authenticated).
//
// The credentials come from one of two places, and need no other
// configuration:
//
//   - The peer secret (--peer-secret-file), the default. Every replica
//     derives the same CA from it: an Ed25519 key from HKDF-SHA256 of the
//     secret, and a self-signed certificate made from a fixed template (an
//     Ed25519 signature is deterministic, so it is the same certificate
//     everywhere). At start, each replica makes a key of its own (ECDSA
//     P-256) and a certificate for it signed by that CA, valid for
//     peerLeafLifetime, and makes a new one when half of that has passed.
//     The secret never leaves the process, nor does anything from which it
//     could be computed without guessing it: anyone who can connect to a
//     peer port sees a certificate signed by the CA, and could test guesses
//     of the secret against it, so the secret must be random (at least
//     minPeerSecretBytes bytes; `openssl rand -hex 32`). The file may hold
//     several secrets, one a line: the first signs this replica's
//     certificate, and certificates signed from any of them are accepted,
//     which lets an operator rotate the secret without a moment in which
//     two replicas refuse each other (README.md, "Running more than one
//     replica").
//   - Certificate files (--peer-tls-cert, --peer-tls-key, --peer-tls-ca),
//     e.g. issued by cert-manager: this replica's certificate (for both
//     server and client authentication), its key, and the CA that signs
//     every replica's peer certificate and nothing else.
//
// Either way the files are looked at again at most every
// peerCredentialsRecheck when the credentials are used, and what changed is
// taken up; a change that does not load keeps the credentials in force and
// is logged.
//
// Requests cross the channel as they came to the entry: the signature
// earlier versions put in a header is gone, since the connection itself is
// authenticated. Replicas of those versions speak plain HTTP on the peer
// port and cannot forward to or from this one.
const (
	// peerLeafLifetime is how long a certificate made from the peer secret
	// is valid; it is renewed at half of it, and starts an hour before it
	// is made, so that replicas whose clocks differ by less than that
	// accept it at once.
	peerLeafLifetime = 48 * time.Hour
	// peerCredentialsRecheck bounds how often the credential files are
	// looked at.
	peerCredentialsRecheck = 5 * time.Second
	// peerHandshakeTimeout bounds a TLS handshake with another replica, on
	// either side: on a cluster network it takes milliseconds.
	peerHandshakeTimeout = 5 * time.Second
	// minPeerSecretBytes is the shortest peer secret accepted.
	minPeerSecretBytes = 16
	// maxPeerResponseHeaderBytes bounds a response head read from another
	// replica, instead of Go's 10 MiB: the other replica passes on heads
	// that the upstreams of its tunnels wrote.
	maxPeerResponseHeaderBytes = 64 << 10
)

// peerCredentials are the peer channel's credentials at one moment. A
// value is never changed once made: peerTLS replaces it whole.
type peerCredentials struct {
	cert  *tls.Certificate // this replica's
	roots *x509.CertPool   // the CAs a replica's certificate chains to
	// ca names the CA that signs this replica's certificate, for logs: the
	// start of the SHA-256 of its public key.
	ca string
	// renewAt is when a certificate made from the secret is renewed;
	// zero for certificates from files.
	renewAt time.Time
	// signer is the CA key that signs this replica's certificate (nil for
	// files) and signerCert its certificate.
	signer     ed25519.PrivateKey
	signerCert *x509.Certificate
}

// peerTLS keeps the peer channel's credentials current and makes its TLS
// configurations.
type peerTLS struct {
	// Static after construction.
	secretFile                string // --peer-secret-file, or ""
	certFile, keyFile, caFile string // --peer-tls-*, or ""
	replica                   string
	log                       *zap.Logger

	// Guarded by mu.
	mu      sync.Mutex
	creds   *peerCredentials
	stamp   string    // of the files the credentials came from
	failed  string    // stamp of the files that last failed to load
	checked time.Time // when the files were last looked at
}

// newPeerTLS loads the peer credentials Config names, or returns nil when
// it names none.
func newPeerTLS(cfg Config, log *zap.Logger) (*peerTLS, error) {
	p := &peerTLS{
		secretFile: cfg.PeerSecretFile,
		certFile:   cfg.PeerTLSCertFile, keyFile: cfg.PeerTLSKeyFile, caFile: cfg.PeerTLSCAFile,
		replica: cfg.ReplicaID, log: log,
	}
	if p.secretFile == "" && p.certFile == "" {
		return nil, nil
	}
	stamp, err := fileStamp(p.files()...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.source(), err)
	}
	creds, err := p.load(time.Now())
	if err != nil {
		return nil, err
	}
	p.creds, p.stamp, p.checked = creds, stamp, time.Now()
	return p, nil
}

// files are the files the credentials come from.
func (p *peerTLS) files() []string {
	if p.secretFile != "" {
		return []string{p.secretFile}
	}
	return []string{p.certFile, p.keyFile, p.caFile}
}

// source names the flags the credentials come from, for errors and logs.
func (p *peerTLS) source() string {
	if p.secretFile != "" {
		return "--peer-secret-file " + p.secretFile
	}
	return fmt.Sprintf("--peer-tls-cert %s --peer-tls-key %s --peer-tls-ca %s", p.certFile, p.keyFile, p.caFile)
}

// load reads the credentials from the files.
func (p *peerTLS) load(now time.Time) (*peerCredentials, error) {
	if p.secretFile != "" {
		secrets, err := readPeerSecrets(p.secretFile)
		if err != nil {
			return nil, err
		}
		return credentialsFromSecrets(secrets, p.replica, now)
	}
	return credentialsFromFiles(p.certFile, p.keyFile, p.caFile)
}

// current returns the credentials in force, having taken up a change of the
// files (at most every peerCredentialsRecheck) and renewed a certificate
// made from the secret when it is due.
func (p *peerTLS) current() *peerCredentials {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Sub(p.checked) >= peerCredentialsRecheck {
		p.checked = now
		p.reloadLocked(now)
	}
	if c := p.creds; c.signer != nil && !now.Before(c.renewAt) {
		if cert, renewAt, err := signLeaf(c.signer, c.signerCert, p.replica, now); err != nil {
			p.log.Error("renew this replica's peer certificate failed; the current one stays in force", zap.Error(err))
		} else {
			renewed := *c
			renewed.cert, renewed.renewAt = cert, renewAt
			p.creds = &renewed
		}
	}
	return p.creds
}

func (p *peerTLS) reloadLocked(now time.Time) {
	stamp, err := fileStamp(p.files()...)
	if err != nil {
		stamp = "unreadable: " + err.Error() // logged once, as a broken file is
	}
	if stamp == p.stamp || stamp == p.failed {
		return
	}
	var creds *peerCredentials
	if err == nil {
		creds, err = p.load(now)
	}
	if err != nil {
		p.log.Error("reload the peer channel's credentials failed; the previous ones stay in force",
			zap.String("from", p.source()), zap.Error(err))
		p.failed = stamp
		return
	}
	p.creds, p.stamp, p.failed = creds, stamp, ""
	p.log.Info("peer channel credentials reloaded", zap.String("from", p.source()), zap.String("peer_ca", creds.ca))
}

// describe says where the credentials come from, for the start log.
func (p *peerTLS) describe() []zap.Field {
	return []zap.Field{zap.String("peer_tls", p.source()), zap.String("peer_ca", p.current().ca)}
}

// serverConfig is the peer port's TLS configuration: the client must
// present a replica's certificate.
func (p *peerTLS) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAnyClientCert, // verified by VerifyConnection, against the current CAs
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return p.current().cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			return p.verify(cs, x509.ExtKeyUsageClientAuth)
		},
	}
}

// clientConfig is the TLS configuration for connecting to another
// replica's peer port: the server must present a replica's certificate.
func (p *peerTLS) clientConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Go's own check wants a name; a replica's certificate names none
		// that its address would match. VerifyConnection checks the chain.
		InsecureSkipVerify: true, //nolint:gosec // verified by VerifyConnection
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return p.current().cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			return p.verify(cs, x509.ExtKeyUsageServerAuth)
		},
	}
}

// verify checks that the other side's certificate chains to a current peer
// CA, for usage.
func (p *peerTLS) verify(cs tls.ConnectionState, usage x509.ExtKeyUsage) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no certificate presented: not a tether replica")
	}
	intermediates := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		intermediates.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: p.current().roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{usage},
	})
	if err != nil {
		return fmt.Errorf("certificate %q is no replica's of this fleet (another --peer-secret-file or --peer-tls-ca?): %w",
			cs.PeerCertificates[0].Subject.CommonName, err)
	}
	return nil
}

// peerHandshakeError: the TLS handshake with another replica failed, so no
// request was sent: the request may go to another replica.
type peerHandshakeError struct {
	addr string
	err  error
}

func (e *peerHandshakeError) Error() string {
	return fmt.Sprintf("TLS handshake with the peer port at %s: %v", e.addr, e.err)
}

func (e *peerHandshakeError) Unwrap() error { return e.err }

// dialer connects to other replicas' peer ports for the peer transport
// (http.Transport.DialTLSContext).
func (p *peerTLS) dialer(log *zap.Logger) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: peerDialTimeout, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, p.clientConfig())
		hctx, cancel := context.WithTimeout(ctx, peerHandshakeTimeout)
		defer cancel()
		if err := conn.HandshakeContext(hctx); err != nil {
			_ = raw.Close()
			if ctx.Err() == nil {
				log.Warn("peer handshake failed: that replica is not passed this request; check that every replica has the same --peer-secret-file (or certificates from the same --peer-tls-ca) and runs this version",
					zap.String("peer_addr", addr), zap.Error(err))
			}
			return nil, &peerHandshakeError{addr: addr, err: err}
		}
		return conn, nil
	}
}

// peerListener is the peer port: every connection it accepts speaks TLS,
// and completes its handshake, within peerHandshakeTimeout, before its
// first byte is read. A handshake that fails is reported to refused, and
// the connection reads nothing.
type peerListener struct {
	net.Listener
	config  *tls.Config
	refused func(net.Conn, error)
}

func (l *peerListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &peerServerConn{Conn: tls.Server(conn, l.config), refused: l.refused}, nil
}

// peerServerConn is one connection to the peer port.
type peerServerConn struct {
	*tls.Conn
	refused func(net.Conn, error)
	once    sync.Once
	err     error
}

func (c *peerServerConn) Read(p []byte) (int, error) {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), peerHandshakeTimeout)
		defer cancel()
		if c.err = c.HandshakeContext(ctx); c.err != nil {
			c.refused(c.Conn, c.err)
		}
	})
	if c.err != nil {
		return 0, c.err
	}
	return c.Conn.Read(p)
}

// readPeerSecrets reads the peer secrets, one a line, the first the one
// that signs.
func readPeerSecrets(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read --peer-secret-file: %w", err)
	}
	var secrets [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		s := bytes.TrimSpace(sc.Bytes())
		switch {
		case len(s) == 0:
			continue
		case len(s) < minPeerSecretBytes:
			return nil, fmt.Errorf("--peer-secret-file %s, line %d: the secret is %d bytes; want at least %d random bytes (e.g. openssl rand -hex 32): anyone who reaches the peer port can test guesses of it",
				path, line, len(s), minPeerSecretBytes)
		}
		secrets = append(secrets, bytes.Clone(s))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read --peer-secret-file %s: %w", path, err)
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("--peer-secret-file %s is empty: put a random secret in it (e.g. openssl rand -hex 32)", path)
	}
	return secrets, nil
}

// credentialsFromSecrets derives a CA from each secret, and signs this
// replica's certificate with the first.
func credentialsFromSecrets(secrets [][]byte, replica string, now time.Time) (*peerCredentials, error) {
	roots := x509.NewCertPool()
	var creds peerCredentials
	for i, secret := range secrets {
		key, cert, err := peerCA(secret)
		if err != nil {
			return nil, err
		}
		roots.AddCert(cert)
		if i == 0 {
			creds.signer, creds.signerCert, creds.ca = key, cert, keyID(cert)
		}
	}
	leaf, renewAt, err := signLeaf(creds.signer, creds.signerCert, replica, now)
	if err != nil {
		return nil, err
	}
	creds.cert, creds.roots, creds.renewAt = leaf, roots, renewAt
	return &creds, nil
}

// peerCA derives the CA of a peer secret: the same key and certificate on
// every replica.
func peerCA(secret []byte) (ed25519.PrivateKey, *x509.Certificate, error) {
	seed, err := hkdf.Key(sha256.New, secret, []byte("tether peer CA"), "tether peer CA v1 ed25519 seed", ed25519.SeedSize)
	if err != nil {
		return nil, nil, fmt.Errorf("derive the peer CA key: %w", err)
	}
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tether peer CA"},
		NotBefore:             time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, nil, fmt.Errorf("make the peer CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse the peer CA certificate: %w", err)
	}
	return key, cert, nil
}

// signLeaf makes this replica's certificate, signed by the CA, and says
// when to renew it.
func signLeaf(caKey ed25519.PrivateKey, ca *x509.Certificate, replica string, now time.Time) (*tls.Certificate, time.Time, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("make this replica's peer key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, time.Time{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "tether replica " + replica},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(peerLeafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("sign this replica's peer certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, now.Add(peerLeafLifetime / 2), nil
}

// credentialsFromFiles loads this replica's certificate and the CA from
// files, and checks that the one chains to the other for both uses.
func credentialsFromFiles(certFile, keyFile, caFile string) (*peerCredentials, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load the peer key pair --peer-tls-cert %s --peer-tls-key %s: %w", certFile, keyFile, err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read --peer-tls-ca: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--peer-tls-ca %s holds no PEM certificate", caFile)
	}
	intermediates := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			intermediates.AddCert(c)
		}
	}
	chains, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err == nil {
		_, err = cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	}
	if err != nil {
		return nil, fmt.Errorf("--peer-tls-cert %s does not verify against --peer-tls-ca %s for both server and client authentication (a cert-manager Certificate needs usages: [server auth, client auth]): %w",
			certFile, caFile, err)
	}
	return &peerCredentials{cert: &cert, roots: roots, ca: keyID(chains[0][len(chains[0])-1])}, nil
}

// keyID names a CA by the start of the SHA-256 of its public key.
func keyID(ca *x509.Certificate) string {
	sum := sha256.Sum256(ca.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:4])
}
