package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	frpclient "github.com/fatedier/frp/client"
	frpauth "github.com/fatedier/frp/pkg/auth"
	v1 "github.com/fatedier/frp/pkg/config/v1"
	"github.com/fatedier/frp/pkg/msg"
	netpkg "github.com/fatedier/frp/pkg/util/net"
	frpversion "github.com/fatedier/frp/pkg/util/version"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/version"
	"github.com/tether-dev/tether/tunnel"
)

// loginTimeout bounds the wait for the server's answer to a login.
const loginTimeout = 10 * time.Second

// keepConnected runs sessions until ctx ends. After a session that logged in,
// the next attempt comes at once (jittered by up to 200ms, so that the
// clients of a restarted server do not return in lockstep); after each
// failure the delay doubles up to MaxReconnectDelay.
func (c *Client) keepConnected(ctx context.Context) {
	const minDelay = 200 * time.Millisecond
	delay := minDelay
	for {
		loggedIn := c.runSession(ctx)
		if ctx.Err() != nil {
			return
		}
		if loggedIn {
			delay = minDelay
		}
		wait := delay/2 + rand.N(delay/2+1) //nolint:gosec // jitter, not a secret
		c.log.Debug("next connection attempt", zap.Duration("in", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, c.cfg.MaxReconnectDelay)
	}
}

// runSession makes one connection, logs in, and serves until the session
// ends. It reports whether the login succeeded.
func (c *Client) runSession(ctx context.Context) (loggedIn bool) {
	conn, via, err := c.dialer.dial(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.status.onFailed(err)
			c.log.Warn("connect to tunnel server failed; retrying", zap.Error(err))
		}
		return false
	}
	mux, err := yamux.Client(tunnel.CoalesceFrames(conn), tunnel.MuxConfig(c.cfg.HeartbeatTimeout, c.log))
	if err != nil {
		_ = conn.Close()
		c.status.onFailed(err)
		return false
	}
	c.status.onConnected(via)
	start := time.Now()
	var streams sync.WaitGroup
	streams.Go(func() { c.serveStreams(mux) })
	defer func() {
		_ = mux.Close()
		streams.Wait()
		c.status.onDisconnected()
	}()

	control, err := c.login(mux)
	if err != nil {
		c.status.onFailed(err)
		c.log.Warn("login failed; retrying", zap.String("via", via), zap.Error(err))
		return false
	}
	c.status.onLoggedIn()
	c.log.Info("logged in to tunnel server", zap.String("server", c.cfg.Server), zap.String("via", via))

	ctl, err := frpclient.NewControl(ctx, &frpclient.SessionContext{
		Common:    c.frpConfig,
		RunID:     c.tunnel,
		Conn:      msg.NewConn(control.stream, &routeWatch{ReadWriter: control.rw, onRoute: c.routeAnswered}),
		Auth:      c.frpAuth,
		Connector: streamConnector{mux: mux},
	})
	if err != nil {
		c.status.onFailed(err)
		return true
	}
	ctl.SetInWorkConnCallback(c.handleWorkConn)
	ctl.Run([]v1.ProxyConfigurer{c.frpRoute.Clone()}, nil)
	select {
	case <-ctl.Done():
	case <-ctx.Done():
		_ = ctl.Close()
		<-ctl.Done()
	}
	if ctx.Err() == nil {
		c.log.Warn("disconnected from tunnel server; reconnecting",
			zap.Duration("connected_for", time.Since(start)), zap.String("reason", describeEnd(mux)))
	}
	return true
}

// controlStream is a logged-in control stream: frp's control channel is
// encrypted from here on.
type controlStream struct {
	stream net.Conn
	rw     msg.ReadWriter
}

// login sends frp's Login with the token read from the token file now, so
// a rotated token takes effect at the next login, and reads the answer.
func (c *Client) login(mux *yamux.Session) (*controlStream, error) {
	token, err := readToken(c.cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	// The route registered below is named after the tunnel this process
	// started with; a token for another tunnel cannot serve it.
	if name, err := tunnelOf(token); err != nil {
		return nil, fmt.Errorf("--token-file %s: %w", c.cfg.TokenFile, err)
	} else if name != c.tunnel {
		return nil, fmt.Errorf("--token-file %s now holds a token for tunnel %q, but this client serves tunnel %q: restart the client to switch tunnels", c.cfg.TokenFile, name, c.tunnel)
	}
	stream, err := sendLogin(mux, c.frpAuth, c.tunnel, map[string]string{
		auth.TokenMetaKey:    token,
		tunnel.RoutesMetaKey: c.advertisedRoutes,
	})
	if err != nil {
		return nil, err
	}
	rw, err := netpkg.NewCryptoReadWriter(stream, c.frpAuth.EncryptionKey())
	if err != nil {
		_ = stream.Close()
		return nil, fmt.Errorf("encrypt control channel: %w", err)
	}
	return &controlStream{stream: stream, rw: msg.NewV1ReadWriter(rw)}, nil
}

// sendLogin opens the control stream, sends frp's Login with metas (and the
// client's version) and reads the answer. It returns the stream once the
// server has accepted the login.
func sendLogin(mux *yamux.Session, frpAuth *frpauth.ClientAuth, runID string, metas map[string]string) (net.Conn, error) {
	stream, err := mux.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("open control stream: %w", err)
	}
	hostname, _ := os.Hostname()
	metas[tunnel.ClientMetaKey] = version.String()
	login := &msg.Login{
		Version:   frpversion.Full(),
		Hostname:  hostname,
		Os:        runtime.GOOS,
		Arch:      runtime.GOARCH,
		Timestamp: time.Now().Unix(),
		RunID:     runID,
		Metas:     metas,
	}
	if err := frpAuth.Setter.SetLogin(login); err != nil {
		_ = stream.Close()
		return nil, fmt.Errorf("sign login: %w", err)
	}
	_ = stream.SetDeadline(time.Now().Add(loginTimeout))
	if err := msg.WriteMsg(stream, login); err != nil {
		_ = stream.Close()
		return nil, fmt.Errorf("send login: %w", err)
	}
	var resp msg.LoginResp
	if err := msg.ReadMsgInto(stream, &resp); err != nil {
		_ = stream.Close()
		return nil, fmt.Errorf("read login answer: %w", err)
	}
	_ = stream.SetDeadline(time.Time{})
	if resp.Error != "" {
		_ = stream.Close()
		return nil, &RejectedError{Reason: resp.Error}
	}
	return stream, nil
}

// RejectedError is the server's refusal of a login, in its own words.
type RejectedError struct{ Reason string }

func (e *RejectedError) Error() string { return "login rejected by the server: " + e.Reason }

// routeAnswered records the server's answer to the route registration.
func (c *Client) routeAnswered(name, errMsg string) {
	if errMsg != "" {
		c.status.onRoute(errors.New(errMsg))
		c.log.Warn("tunnel route rejected by the server; it retries by itself", zap.String("route", name), zap.String("reason", errMsg))
		return
	}
	c.status.onRoute(nil)
	c.log.Info("tunnel ready: requests for this tunnel are served", zap.String("route", name))
}

// routeWatch passes the control channel's messages to frp and reports the
// server's answers to route registrations on the way.
type routeWatch struct {
	msg.ReadWriter
	onRoute func(name, errMsg string)
}

func (w *routeWatch) ReadMsg() (msg.Message, error) {
	m, err := w.ReadWriter.ReadMsg()
	if resp, ok := m.(*msg.NewProxyResp); ok && err == nil {
		w.onRoute(resp.ProxyName, resp.Error)
	}
	return m, err
}

// streamConnector gives frp a new stream of the session for each work
// connection it opens.
type streamConnector struct{ mux *yamux.Session }

func (s streamConnector) Connect() (*msg.Conn, error) {
	stream, err := s.mux.OpenStream()
	if err != nil {
		return nil, err
	}
	return msg.NewConn(stream, msg.NewV1ReadWriter(stream)), nil
}

func (s streamConnector) Close() error { return s.mux.Close() }

// serveStreams answers the dial requests the server makes on streams it
// opens, until the session ends, and waits for their connections to end.
func (c *Client) serveStreams(mux *yamux.Session) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		stream, err := mux.AcceptStream()
		if err != nil {
			return
		}
		conns.Go(func() { c.upstreams.serve(stream, c.log) })
	}
}

// handleWorkConn refuses frp work connections: a tether client's requests
// come through the dial protocol, never through frp's vhost.
func (c *Client) handleWorkConn(_ *v1.ProxyBaseConfig, conn net.Conn, _ *msg.StartWorkConn) bool {
	_ = conn.Close()
	return false // handled: frp must not dial a local port
}

// describeEnd says why a session ended, for the log.
func describeEnd(mux *yamux.Session) string {
	select {
	case <-mux.CloseChan():
	default:
		return "control channel closed by the server"
	}
	return "connection closed or heartbeat lost"
}

// frpClientConfig is the frp client configuration tether's session needs:
// frp's own TLS, multiplexing and heartbeats are off, because the session
// layer provides them.
func frpClientConfig(server string) (*v1.ClientCommonConfig, *frpauth.ClientAuth, error) {
	host, portStr, _ := net.SplitHostPort(server)
	port, _ := strconv.Atoi(portStr) // Config.Validate checked the address
	common := &v1.ClientCommonConfig{
		ServerAddr: host,
		ServerPort: port,
		Transport: v1.ClientTransportConfig{
			TCPMux:            new(false),
			TLS:               v1.TLSClientConfig{Enable: new(false)},
			HeartbeatInterval: -1,
			HeartbeatTimeout:  -1,
		},
	}
	if err := common.Complete(); err != nil {
		return nil, nil, fmt.Errorf("complete frp client config: %w", err)
	}
	frpAuth, err := frpauth.BuildClientAuth(&common.Auth)
	if err != nil {
		return nil, nil, fmt.Errorf("frp client auth: %w", err)
	}
	return common, frpAuth, nil
}

// frpRouteConfig is the tunnel's one route: an http proxy whose subdomain
// (and name) is the tunnel's name.
func frpRouteConfig(name string) v1.ProxyConfigurer {
	route := &v1.HTTPProxyConfig{
		ProxyBaseConfig: v1.ProxyBaseConfig{Name: name, Type: "http"},
		DomainConfig:    v1.DomainConfig{SubDomain: name},
	}
	route.Complete()
	return route
}
