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

// dial makes one connection attempt: TCP (directly or through the egress
// proxy), TLS, and for wss the websocket upgrade. via names the path taken.
func (c *Client) dial(ctx context.Context) (conn net.Conn, via string, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	proxyURL, err := c.egressProxy()
	if err != nil {
		return nil, "", err
	}
	var raw net.Conn
	via = "direct"
	if proxyURL == nil {
		var d net.Dialer
		raw, err = d.DialContext(ctx, "tcp", c.cfg.Server)
		if err != nil {
			return nil, "", fmt.Errorf("dial %s: %w", c.cfg.Server, err)
		}
	} else {
		via = "proxy " + proxyURL.Redacted()
		raw, err = c.dialProxy(ctx, proxyURL)
		if err != nil {
			return nil, "", err
		}
	}
	tlsConn := tls.Client(raw, c.tlsConfig)
	if err := tlsConn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, "", fmt.Errorf("TLS handshake with %s: %w", c.cfg.Server, explainTLS(err))
	}
	if c.cfg.Transport != "wss" {
		return tlsConn, via, nil
	}
	ws, err := upgradeWebsocket(ctx, tlsConn, c.tlsConfig.ServerName, c.cfg.Server)
	if err != nil {
		_ = tlsConn.Close()
		return nil, "", err
	}
	return ws, via, nil
}

// egressProxy returns the proxy to reach the server through, or nil.
// Without --proxy, HTTPS_PROXY (then ALL_PROXY) applies unless NO_PROXY
// exempts the server, with the usual lower-case variants and the usual
// rule that loopback addresses are never proxied.
func (c *Client) egressProxy() (*url.URL, error) {
	if u, err := parseProxyFlag(c.cfg.Proxy); err != nil || u != nil || c.cfg.Proxy == "direct" {
		return u, err
	}
	env := func(names ...string) string {
		for _, n := range names {
			if v := c.cfg.Getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	cfg := httpproxy.Config{
		HTTPSProxy: env("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"),
		NoProxy:    env("NO_PROXY", "no_proxy"),
	}
	u, err := cfg.ProxyFunc()(&url.URL{Scheme: "https", Host: c.cfg.Server})
	if err != nil {
		return nil, fmt.Errorf("egress proxy from the environment (HTTPS_PROXY/ALL_PROXY): %w", err)
	}
	if u != nil {
		if err := checkProxyScheme(u); err != nil {
			return nil, fmt.Errorf("egress proxy from the environment: %w", err)
		}
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
		return nil, fmt.Errorf("--proxy %q: want a URL like http://proxy.corp:3128, or direct", s)
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

func (c *Client) dialProxy(ctx context.Context, u *url.URL) (net.Conn, error) {
	var d net.Dialer
	switch u.Scheme {
	case "socks5", "socks5h":
		dialer, err := xproxy.FromURL(u, &d)
		if err != nil {
			return nil, fmt.Errorf("egress proxy %s: %w", u.Redacted(), err)
		}
		conn, err := dialer.(xproxy.ContextDialer).DialContext(ctx, "tcp", c.cfg.Server)
		if err != nil {
			return nil, fmt.Errorf("dial %s through SOCKS5 proxy %s: %w", c.cfg.Server, u.Redacted(), err)
		}
		return conn, nil
	}
	proxyAddr := u.Host
	if u.Port() == "" {
		proxyAddr = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	conn, err := d.DialContext(ctx, "tcp", proxyAddr)
	if err != nil {
		return nil, fmt.Errorf("dial egress proxy %s: %w", u.Redacted(), err)
	}
	if u.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: u.Hostname(), RootCAs: c.tlsConfig.RootCAs, MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("TLS handshake with egress proxy %s: %w", u.Redacted(), explainTLS(err))
		}
		conn = tc
	}
	if err := httpConnect(ctx, conn, u, c.cfg.Server); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
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
		return fmt.Errorf("send CONNECT to egress proxy %s: %w", proxyURL.Redacted(), err)
	}
	// The proxy answers before the server says anything (TLS: the client
	// speaks first), so no tunnel bytes can hide in the reader's buffer.
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 1), req)
	if err != nil {
		return fmt.Errorf("read CONNECT answer from egress proxy %s: %w", proxyURL.Redacted(), err)
	}
	_ = resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusProxyAuthRequired:
		return fmt.Errorf("egress proxy %s requires authentication (407): put user:password@ in the proxy URL", proxyURL.Redacted())
	default:
		return fmt.Errorf("egress proxy %s refused CONNECT to %s: %s", proxyURL.Redacted(), target, resp.Status)
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
