package client

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"
	xproxy "golang.org/x/net/proxy"
	"golang.org/x/net/websocket"

	"github.com/tether-dev/tether/tunnel"
)

// dialer makes connections to the tunnel server the way the client's
// configuration says: TCP directly or through the egress proxy, TLS, and for
// wss the websocket upgrade.
type dialer struct {
	cfg       Config
	tlsConfig *tls.Config
}

func newDialer(cfg Config) (*dialer, error) {
	tc, err := clientTLSConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &dialer{cfg: cfg, tlsConfig: tc}, nil
}

// dial makes one connection attempt. via names the path taken.
func (d *dialer) dial(ctx context.Context) (conn net.Conn, via string, err error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
	defer cancel()
	proxyURL, _, err := d.egressProxy()
	if err != nil {
		return nil, "", err
	}
	via = "direct"
	if proxyURL != nil {
		via = "proxy " + redactURL(proxyURL)
	}
	raw, err := d.dialTCP(ctx, proxyURL, d.cfg.Server)
	if err != nil {
		return nil, "", err
	}
	gatherer := tunnel.NewGatherer(raw)
	tlsConn := tls.Client(gatherer, d.tlsConfig)
	if err := tlsConn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, "", fmt.Errorf("TLS handshake with %s: %w", d.cfg.Server, explainTLS(err))
	}
	if d.cfg.Transport != "wss" {
		return &sessionConn{Conn: tlsConn, gatherer: gatherer}, via, nil
	}
	ws, err := upgradeWebsocket(ctx, tlsConn, d.tlsConfig.ServerName, d.cfg.Server)
	if err != nil {
		_ = tlsConn.Close()
		return nil, "", err
	}
	return &sessionConn{Conn: ws, gatherer: gatherer}, via, nil
}

// sessionConn is a connection to the server (TLS, or wss) and the Gatherer
// under its TLS, for tunnel.CoalesceFrames.
type sessionConn struct {
	net.Conn
	gatherer *tunnel.Gatherer
}

// gathererOf returns the Gatherer under conn, or nil when conn did not
// come from a dialer.
func gathererOf(conn net.Conn) *tunnel.Gatherer {
	if sc, ok := conn.(*sessionConn); ok {
		return sc.gatherer
	}
	return nil
}

// dialTCP connects to target directly (proxyURL nil) or through the proxy.
func (d *dialer) dialTCP(ctx context.Context, proxyURL *url.URL, target string) (net.Conn, error) {
	if proxyURL != nil {
		return d.dialProxy(ctx, proxyURL, target)
	}
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", target) // its error names the address
}

// proxyEnv lists the variables that name an egress proxy for a TLS
// connection, in the order they are consulted.
var proxyEnv = []string{"HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"}

// egressProxy returns the proxy to reach the server through (nil: direct)
// and why: the flag or variable that named it, or what made the connection
// direct. Without --proxy, HTTPS_PROXY (then ALL_PROXY) applies unless
// NO_PROXY exempts the server, with the usual lower-case variants and the
// usual rule that loopback addresses are never proxied.
func (d *dialer) egressProxy() (proxy *url.URL, why string, err error) {
	switch u, err := parseProxyFlag(d.cfg.Proxy); {
	case err != nil:
		return nil, "", err
	case u != nil:
		return u, "--proxy", nil
	case d.cfg.Proxy == "direct":
		return nil, "--proxy direct ignores the proxy environment", nil
	}
	env := func(names ...string) (name, value string) {
		for _, n := range names {
			if v := d.cfg.Getenv(n); v != "" {
				return n, v
			}
		}
		return "", ""
	}
	proxyVar, proxyValue := env(proxyEnv...)
	noProxyVar, noProxy := env("NO_PROXY", "no_proxy")
	if proxyVar == "" {
		return nil, "no HTTPS_PROXY or ALL_PROXY in the environment", nil
	}
	// httpproxy only decides whether NO_PROXY (or loopback) exempts the
	// server, so it gets a stand-in for the value: it ignores a value it
	// cannot parse (the client would go direct, where only the proxy may
	// lead out), and its errors would quote the value, password and all.
	applies := httpproxy.Config{HTTPSProxy: "http://proxy.invalid", NoProxy: noProxy}
	u, err := applies.ProxyFunc()(&url.URL{Scheme: "https", Host: d.cfg.Server})
	if err != nil {
		return nil, "", fmt.Errorf("egress proxy from the environment (%s): %w", proxyVar, err)
	}
	if u == nil {
		if noProxyVar != "" {
			return nil, fmt.Sprintf("%s=%s exempts %s from %s (or it is a loopback address)", noProxyVar, noProxy, d.cfg.Server, proxyVar), nil
		}
		return nil, fmt.Sprintf("%s does not apply to the loopback address %s", proxyVar, d.cfg.Server), nil
	}
	if proxy, err = parseProxyEnv(proxyValue); err != nil {
		return nil, "", fmt.Errorf("egress proxy from the environment: %s=%s: %w", proxyVar, RedactProxy(proxyValue), err)
	}
	return proxy, proxyVar, nil
}

// parseProxyEnv parses a proxy variable as httpproxy does: a URL, or
// without a scheme HOST:PORT (user:password@ allowed), which means http://.
// Its errors never hold the value.
func parseProxyEnv(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if (err != nil || u.Scheme == "" || u.Host == "") && !strings.Contains(s, "://") {
		u, err = url.Parse("http://" + s)
	}
	if err != nil || u.Host == "" {
		return nil, errors.New("not a proxy URL: want one like http://proxy.corp:3128 (user:password@ for a login; percent-encode @, : and / in them)")
	}
	if err := checkProxyScheme(u); err != nil {
		return nil, err
	}
	return u, nil
}

// parseProxyFlag parses --proxy; "" and "direct" yield nil.
func parseProxyFlag(s string) (*url.URL, error) {
	if s == "" || s == "direct" {
		return nil, nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		// Never the value as given, nor url.Parse's error, which quotes it:
		// it may hold the proxy's password.
		return nil, fmt.Errorf("--proxy %q: want a URL like http://proxy.corp:3128 (user:password@ for a login; percent-encode @, : and / in them), or direct", RedactProxy(s))
	}
	if err := checkProxyScheme(u); err != nil {
		return nil, fmt.Errorf("--proxy: %w", err)
	}
	return u, nil
}

func checkProxyScheme(u *url.URL) error {
	switch u.Scheme {
	case "http", "https", "socks5", "socks5h":
		return nil
	}
	return fmt.Errorf("proxy scheme %q not supported; want http, https, socks5 or socks5h", u.Scheme)
}

func (d *dialer) dialProxy(ctx context.Context, u *url.URL, target string) (net.Conn, error) {
	var nd net.Dialer
	switch u.Scheme {
	case "socks5", "socks5h":
		sd, err := xproxy.FromURL(u, &nd)
		if err != nil {
			return nil, fmt.Errorf("egress proxy %s: %w", redactURL(u), err)
		}
		conn, err := sd.(xproxy.ContextDialer).DialContext(ctx, "tcp", target)
		if err != nil {
			return nil, fmt.Errorf("dial %s through SOCKS5 proxy %s: %w", target, redactURL(u), err)
		}
		return conn, nil
	}
	conn, err := nd.DialContext(ctx, "tcp", ProxyAddr(u))
	if err != nil {
		return nil, fmt.Errorf("dial egress proxy %s: %w", redactURL(u), err)
	}
	if u.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: u.Hostname(), RootCAs: d.tlsConfig.RootCAs, MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("TLS handshake with egress proxy %s: %w", redactURL(u), explainTLS(err))
		}
		conn = tc
	}
	if err := httpConnect(ctx, conn, u, target); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// ProxyAddr is the HOST:PORT of a proxy URL, with the scheme's default port.
func ProxyAddr(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}[u.Scheme]
	return net.JoinHostPort(u.Hostname(), port)
}

// httpConnect asks an HTTP proxy for a tunnel to target (RFC 9110 CONNECT).
func httpConnect(ctx context.Context, conn net.Conn, proxyURL *url.URL, target string) error {
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
		defer func() { _ = conn.SetDeadline(time.Time{}) }()
	}
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: target},
		Host:   target,
		Header: http.Header{},
	}
	if u := proxyURL.User; u != nil {
		pass, _ := u.Password()
		cred := base64.StdEncoding.EncodeToString([]byte(u.Username() + ":" + pass))
		req.Header.Set("Proxy-Authorization", "Basic "+cred)
	}
	if err := req.Write(conn); err != nil {
		return fmt.Errorf("send CONNECT to egress proxy %s: %w", redactURL(proxyURL), err)
	}
	// The proxy answers before the server says anything (TLS: the client
	// speaks first), so no tunnel bytes can hide in the reader's buffer.
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 1), req)
	if err != nil {
		return fmt.Errorf("read CONNECT answer from egress proxy %s: %w", redactURL(proxyURL), err)
	}
	_ = resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusProxyAuthRequired:
		if proxyURL.User != nil {
			return fmt.Errorf("egress proxy %s refused the user and password of the proxy URL (407): check them, with @, : and / in them percent-encoded", redactURL(proxyURL))
		}
		return fmt.Errorf("egress proxy %s requires authentication (407): put user:password@ in the proxy URL", redactURL(proxyURL))
	default:
		return fmt.Errorf("egress proxy %s refused CONNECT to %s: %s", redactURL(proxyURL), target, resp.Status)
	}
}

// upgradeWebsocket opens frp's websocket transport on an established TLS
// connection: binary frames, path tunnel.WebsocketPath.
func upgradeWebsocket(ctx context.Context, conn net.Conn, serverName, server string) (net.Conn, error) {
	host := serverName
	if _, port, err := net.SplitHostPort(server); err == nil {
		host = net.JoinHostPort(serverName, port)
	}
	cfg, err := websocket.NewConfig("wss://"+host+tunnel.WebsocketPath, "https://"+host)
	if err != nil {
		return nil, fmt.Errorf("websocket config for %s: %w", server, err)
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
		defer func() { _ = conn.SetDeadline(time.Time{}) }()
	}
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		return nil, fmt.Errorf("wss upgrade at %s%s: %w (is a proxy in the way rewriting HTTP?)", server, tunnel.WebsocketPath, err)
	}
	ws.PayloadType = websocket.BinaryFrame
	return ws, nil
}

// clientTLSConfig builds how the client trusts the server.
func clientTLSConfig(cfg Config) (*tls.Config, error) {
	host, _, _ := net.SplitHostPort(cfg.Server)
	tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if cfg.TLSServerName != "" {
		tc.ServerName = cfg.TLSServerName
	}
	// Without --tls-ca, RootCAs stays nil: Go then loads the system roots on
	// the first handshake that needs them, not at start.
	if cfg.TLSCAFile != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("read --tls-ca: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", cfg.TLSCAFile)
		}
		tc.RootCAs = pool
	}
	switch {
	case cfg.TLSInsecureSkipVerify:
		tc.InsecureSkipVerify = true //nolint:gosec // the operator asked for it, for testing
	case cfg.TLSFingerprint != "":
		want, _ := parseFingerprint(cfg.TLSFingerprint)
		// The pin replaces chain verification: a self-signed server
		// certificate is exactly what it is for. VerifyConnection, unlike
		// VerifyPeerCertificate, also runs on resumed sessions.
		tc.InsecureSkipVerify = true //nolint:gosec // replaced by the pin below
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server sent no certificate")
			}
			got := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if subtle.ConstantTimeCompare(got[:], want) != 1 {
				return fmt.Errorf("server certificate fingerprint %X does not match --tls-fingerprint", got[:])
			}
			return nil
		}
	}
	return tc, nil
}

// parseFingerprint accepts 64 hex digits, with or without colons.
func parseFingerprint(s string) ([]byte, error) {
	b, err := hex.DecodeString(strings.ReplaceAll(s, ":", ""))
	if err != nil || len(b) != sha256.Size {
		return nil, fmt.Errorf("%q is not a SHA-256 fingerprint: want 64 hex digits, colons optional (the server logs it at start)", s)
	}
	return b, nil
}

// explainTLS adds the likely cause to certificate errors.
func explainTLS(err error) error {
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	switch {
	case errors.As(err, &unknown):
		issuer := ""
		if unknown.Cert != nil {
			issuer = unknown.Cert.Issuer.String()
		}
		return fmt.Errorf("%w: certificate issued by %q is not trusted; if a TLS-inspecting proxy is in the way, trust its CA with --tls-ca or exempt the server from inspection", err, issuer)
	case errors.As(err, &hostname):
		return fmt.Errorf("%w: the certificate is for another name; check --server or set --tls-server-name", err)
	}
	return err
}
