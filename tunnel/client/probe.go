package client

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"time"

	frpauth "github.com/fatedier/frp/pkg/auth"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
)

// Prober takes the client's path to the tunnel server one step at a time,
// for `tether diagnose`: the same egress proxy choice, TCP, TLS settings and
// login as the client's, each step observable on its own. It neither needs
// nor reads the token file.
type Prober struct {
	d       *dialer
	frpAuth *frpauth.ClientAuth
}

// NewProber validates cfg (as New does, but without reading the token).
func NewProber(cfg Config) (*Prober, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d, err := newDialer(cfg)
	if err != nil {
		return nil, err
	}
	_, frpAuth, err := frpClientConfig(cfg.Server)
	if err != nil {
		return nil, err
	}
	return &Prober{d: d, frpAuth: frpAuth}, nil
}

// Config is the configuration with its defaults filled in.
func (p *Prober) Config() Config { return p.d.cfg }

// EgressProxy returns the proxy the client would use (nil: direct) and why:
// the flag or variable that named it, or what made the connection direct.
func (p *Prober) EgressProxy() (*url.URL, string, error) { return p.d.egressProxy() }

// DialTCP connects to target (an address of the server) the way the client
// would: directly, or through the egress proxy, which then resolves it.
func (p *Prober) DialTCP(ctx context.Context, target string) (net.Conn, error) {
	proxyURL, _, err := p.d.egressProxy()
	if err != nil {
		return nil, err
	}
	return p.d.dialTCP(ctx, proxyURL, target)
}

// TLSConfig is how the client trusts the server (a copy).
func (p *Prober) TLSConfig() *tls.Config { return p.d.tlsConfig.Clone() }

// Login connects as the client would and sends a login probe with token:
// the server verifies the token as for a login and answers with what it
// knows of the tunnel, without registering anything, so a running client of
// the same tunnel is not disturbed. A refusal is a *RejectedError with the
// server's words.
func (p *Prober) Login(ctx context.Context, token string) (*tunnel.ProbeReply, error) {
	conn, _, err := p.d.dial(ctx)
	if err != nil {
		return nil, err
	}
	mux, err := yamux.Client(conn, tunnel.MuxConfig(p.d.cfg.HeartbeatTimeout, zap.NewNop()))
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	defer func() { _ = mux.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = mux.Close() })
	defer stop()

	stream, _, err := sendLogin(mux, p.frpAuth, probeRunID(), map[string]string{
		auth.TokenMetaKey:   token,
		tunnel.ProbeMetaKey: "1",
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.Close() }()
	_ = stream.SetReadDeadline(time.Now().Add(loginTimeout))
	var reply tunnel.ProbeReply
	line, err := bufio.NewReader(stream).ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("the server accepted the login but sent no probe answer (%w): is it an older tether server?", err)
	}
	if err := json.Unmarshal(line, &reply); err != nil {
		return nil, fmt.Errorf("read the server's probe answer: %w", err)
	}
	return &reply, nil
}

// probeRunID is a fresh run ID, so that even a server that treated the probe
// as a login would not replace the tunnel's session.
func probeRunID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "probe-" + hex.EncodeToString(b)
}
