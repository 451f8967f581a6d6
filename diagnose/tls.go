package diagnose

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tether-dev/tether/internal/human"
	"github.com/tether-dev/tether/tunnel"
)

// certWarnBefore is how close to its expiry a certificate draws a warning.
const certWarnBefore = 14 * 24 * time.Hour

// checkTLS shakes hands over the TCP connection and verifies the server's
// certificate as the client would, reporting the chain it saw so that a
// TLS-inspecting middlebox shows itself.
func (r *run) checkTLS(ctx context.Context) Check {
	if r.conn == nil {
		if r.prober == nil {
			return unusable()
		}
		return Check{Status: Skip, Detail: "skipped: no TCP connection to the server (see tcp)"}
	}
	want := r.prober.TLSConfig()
	// Verification happens below, so that the certificate can be shown even
	// when it does not verify.
	cfg := &tls.Config{ServerName: want.ServerName, MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // verified below
	conn := tls.Client(r.conn, cfg)
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	if err := conn.HandshakeContext(ctx); err != nil {
		return fail(fmt.Sprintf("TLS handshake with %s failed: %v", r.cfg.Server, err),
			"something that is not a TLS server answers on that port: check the port in --server (the server's tunnel port, not its HTTP entry), or a proxy that does not pass TLS through")
	}
	r.tlsConn = conn
	cs := conn.ConnectionState()
	leaf := cs.PeerCertificates[0]
	fp := tunnel.Fingerprint(leaf.Raw)
	lines := []string{
		fmt.Sprintf("%s, %s", tls.VersionName(cs.Version), tls.CipherSuiteName(cs.CipherSuite)),
		fmt.Sprintf("certificate: %s, names %s, expires %s (%s)", leaf.Subject, certNames(leaf),
			leaf.NotAfter.UTC().Format(time.RFC3339), until(leaf.NotAfter, r.o.Now())),
		"SHA-256 fingerprint: " + fp,
	}
	for _, c := range cs.PeerCertificates {
		lines = append(lines, fmt.Sprintf("chain: %s, issued by %s", c.Subject, c.Issuer))
	}
	c := r.verifyServerCert(want, cs, fp)
	r.trusted = c.Status != Fail
	if c.Status == Pass {
		if left := leaf.NotAfter.Sub(r.o.Now()); left < certWarnBefore {
			c = warn(c.Detail+"; the certificate expires soon",
				fmt.Sprintf("the server's certificate expires %s: renew it (the server re-reads --tls-cert when the file changes)", until(leaf.NotAfter, r.o.Now())))
		}
	}
	c.Detail = strings.Join(append([]string{c.Detail}, lines...), "\n")
	return c
}

// verifyServerCert applies the client's trust settings to what the server
// sent. The Detail it returns is a one-line verdict.
func (r *run) verifyServerCert(want *tls.Config, cs tls.ConnectionState, fp string) Check {
	leaf := cs.PeerCertificates[0]
	switch {
	case r.cfg.TLSInsecureSkipVerify:
		return warn("not verified: --tls-insecure-skip-verify", "anyone in the middle can read the tunnel: use --tls-ca or --tls-fingerprint")
	case r.cfg.TLSFingerprint != "":
		// The client's own pin check, which its TLS config carries.
		if err := want.VerifyConnection(cs); err != nil {
			return fail("the certificate does not match --tls-fingerprint",
				"the server's certificate changed (a self-signed one is new at every server start) or something intercepts TLS: compare the fingerprint above with the one the server logs at start, and update --tls-fingerprint")
		}
		return pass("verified: matches --tls-fingerprint")
	}
	opts := x509.VerifyOptions{DNSName: want.ServerName, Roots: want.RootCAs, Intermediates: x509.NewCertPool(), CurrentTime: r.o.Now()}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	_, err := leaf.Verify(opts)
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case err == nil:
		trust := "the system's CAs"
		if r.cfg.TLSCAFile != "" {
			trust = "the system's CAs and --tls-ca " + r.cfg.TLSCAFile
		}
		return pass(fmt.Sprintf("verified for %s against %s", want.ServerName, trust))
	case errors.As(err, &hostname):
		return fail(fmt.Sprintf("the certificate is for %s, not %s", certNames(leaf), want.ServerName),
			"check the host in --server; when connecting by another name (an IP, an internal name), set --tls-server-name to a name the certificate holds")
	case errors.As(err, &unknown):
		top := cs.PeerCertificates[len(cs.PeerCertificates)-1]
		if leaf.Subject.CommonName == "tether self-signed" {
			return fail("the server uses the self-signed certificate tether makes without --tls-cert; this client does not trust it",
				fmt.Sprintf("pin it with --tls-fingerprint %s after checking it against the fingerprint the server logs at start, or give the server a certificate from a CA", fp))
		}
		return fail(fmt.Sprintf("the certificate was issued by %q, which this client does not trust", top.Issuer.String()),
			fmt.Sprintf("if %q is your organisation's TLS-inspecting proxy, trust its CA with --tls-ca FILE or have %s exempted from inspection; if the server uses a private CA, pass that CA with --tls-ca", top.Issuer.CommonName, r.host))
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return fail("the certificate is expired or not yet valid: "+err.Error(),
			"renew the server's certificate (the server re-reads --tls-cert when the file changes); if it looks valid, check this machine's clock")
	}
	return fail("the certificate does not verify: "+err.Error(), "give the server a certificate that verifies, or trust its CA with --tls-ca")
}

func certNames(c *x509.Certificate) string {
	names := append([]string(nil), c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		return "(none)"
	}
	return strings.Join(names, ", ")
}

// until says how far t is from now: "in 89d", "3h ago".
func until(t, now time.Time) string {
	d := t.Sub(now)
	if d < 0 {
		return human.Age(-d) + " ago"
	}
	return "in " + human.Age(d)
}

// Clock skew thresholds: tokens are checked with a 30s leeway.
const (
	skewWarn = 30 * time.Second
	skewFail = 5 * time.Minute
)

// checkClock compares this machine's clock with the Date the server sends
// on its tunnel port, because the server judges token times by its clock.
func (r *run) checkClock(ctx context.Context) Check {
	if r.tlsConn == nil {
		return Check{Status: Skip, Detail: "skipped: no TLS connection to the server (see tls)"}
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_ = r.tlsConn.SetDeadline(deadline)
	sent := r.o.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+r.cfg.Server+"/", nil)
	req.Host = r.host
	req.Close = true
	if err := req.Write(r.tlsConn); err != nil {
		return Check{Status: Skip, Detail: "could not ask the server for its time: " + err.Error()}
	}
	resp, err := http.ReadResponse(bufio.NewReader(r.tlsConn), req)
	got := r.o.Now()
	if err != nil {
		return Check{Status: Skip, Detail: "the server did not answer an HTTP request on its tunnel port, so its time is unknown: " + err.Error()}
	}
	_ = resp.Body.Close()
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return Check{Status: Skip, Detail: "the server's answer has no usable Date header, so its time is unknown"}
	}
	// Date has whole seconds: compare its middle with the request's middle.
	mid := sent.Add(got.Sub(sent) / 2)
	skew := date.Add(500 * time.Millisecond).Sub(mid).Round(time.Second)
	r.skew = &skew
	detail := "this clock and the server's agree (within a second)"
	switch {
	case skew > time.Second:
		detail = fmt.Sprintf("this clock is %s behind the server's", skew)
	case skew < -time.Second:
		detail = fmt.Sprintf("this clock is %s ahead of the server's", -skew)
	}
	abs := max(skew, -skew)
	hint := "sync this machine's clock (NTP, chrony; on a node, the node's time service): the server judges token times by its own clock, with 30s leeway"
	switch {
	case abs > skewFail:
		return fail(detail, hint)
	case abs > skewWarn:
		return warn(detail, hint)
	}
	return pass(detail)
}
