package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// serve runs one session of the slot: it answers the streams the server
// opens, logs in, registers the session's route and serves until the
// session or ctx ends, or until it has left its slot to another.
func (s *slot) serve(ctx context.Context, sess *session) outcome {
	start := time.Now()
	mux, ss := sess.mux, sess.state
	var streams sync.WaitGroup
	streams.Go(func() { s.serveStreams(sess) })
	var lost error
	streams.Go(func() { lost = tunnel.KeepAlive(mux, s.c.cfg.HeartbeatTimeout) })
	s.control(ctx, sess)
	_ = mux.Close()
	streams.Wait()
	loggedIn, moved, redial := s.c.status.onEnded(ss)
	switch {
	case ctx.Err() != nil, redial:
	case moved:
		s.log.Info("session that moved away ended", zap.String("replica", ss.replica),
			zap.Duration("connected_for", time.Since(start)), zap.Bool("left_shared_replica", !ss.moving))
	case loggedIn:
		s.log.Warn("disconnected from tunnel server; reconnecting",
			zap.Duration("connected_for", time.Since(start)), zap.String("reason", describeEnd(lost)))
	}
	return outcome{loggedIn: loggedIn, moved: moved, redial: redial}
}

// control logs in on the session and runs frp's client control, which
// registers the session's route, until the session or ctx ends, or the
// session has left its slot to another (leave).
func (s *slot) control(ctx context.Context, sess *session) {
	c, mux, ss := s.c, sess.mux, sess.state
	control, runID, err := s.login(mux, s.runIDs[ss.identity])
	if err != nil {
		// A session closed to land on another replica may fail its login
		// on the way out: that is no failure of the slot.
		if !c.status.leaving(ss) {
			c.status.onFailed(s.index, ss, err)
			s.log.Warn("login failed; retrying", zap.String("via", ss.via), zap.Error(err))
		}
		return
	}
	c.status.onLoggedIn(ss)
	s.log.Info("logged in to tunnel server", zap.String("server", c.cfg.Server), zap.String("via", ss.via))

	ctl, err := frpclient.NewControl(ctx, &frpclient.SessionContext{
		Common: c.frpConfig,
		RunID:  runID,
		Conn: msg.NewConn(control.stream, &routeWatch{ReadWriter: control.rw, onRoute: func(name, errMsg string) {
			s.routeAnswered(ss, name, errMsg)
		}}),
		Auth:      c.frpAuth,
		Connector: streamConnector{mux: mux},
	})
	if err != nil {
		c.status.onFailed(s.index, ss, err)
		return
	}
	ctl.SetInWorkConnCallback(c.handleWorkConn)
	ctl.Run([]v1.ProxyConfigurer{s.routes[ss.identity].Clone()}, nil)
	select {
	case <-ctl.Done():
	case <-ctx.Done():
	case <-ss.leaveNow:
		s.leave(ctx, ctl, sess)
	}
	// Close even after the control ended by itself: frp v0.71.0's Run
	// starts the control's worker before it adds the route's proxy, and a
	// session that ends at once (a slot leaving a replica another slot
	// holds) can end the worker, which stops the proxies it knows, before
	// the proxy is added. That proxy's status loop would then run for the
	// life of the process; Close stops it (client/control.go Run, worker).
	_ = ctl.Close()
	<-ctl.Done()
}

// leave withdraws the session's route, so that the server sends it no new
// request, and waits until the requests it carries have ended (the
// server closes the idle ones), for leaveGrace at most, or until the
// session or ctx ends.
func (s *slot) leave(ctx context.Context, ctl *frpclient.Control, sess *session) {
	s.log.Info("session gives its slot over to one on another replica: route withdrawn, closing once its requests end",
		zap.String("replica", sess.state.replica))
	_ = ctl.UpdateAllConfigurer(nil, nil)
	grace := time.NewTimer(leaveGrace)
	defer grace.Stop()
	tick := time.NewTicker(leaveCheck)
	defer tick.Stop()
	for {
		// Checked after a tick: frp sends the withdrawal from a goroutine
		// of its own, which gets that moment before the session closes.
		select {
		case <-ctl.Done():
			return
		case <-ctx.Done():
			return
		case <-grace.C:
			return
		case <-tick.C:
		}
		if sess.dials.Load() == 0 {
			return
		}
	}
}

// controlStream is a logged-in control stream: frp's control channel is
// encrypted from here on.
type controlStream struct {
	stream net.Conn
	rw     msg.ReadWriter
}

// login sends frp's Login as the slot, under run ID as, with the token
// the client holds now (the token file is re-read, so a rotated token
// takes effect at the next login; a renewal the server sent wins over an
// older one), and reads the answer. runID is the run ID the server gave
// the session.
func (s *slot) login(mux *yamux.Session, as string) (_ *controlStream, runID string, _ error) {
	c := s.c
	token, fileProblem, err := c.tokens.forLogin()
	if err != nil {
		return nil, "", err
	}
	if fileProblem != nil {
		s.log.Warn("--token-file holds no usable token; logging in with the renewed one", zap.String("jti", token.Claims.ID), zap.Error(fileProblem))
	}
	stream, runID, err := sendLogin(mux, c.frpAuth, as, map[string]string{
		auth.TokenMetaKey:    token.Raw(),
		tunnel.RoutesMetaKey: c.advertisedRoutes,
	})
	if rej, ok := errors.AsType[*RejectedError](err); ok && c.tokens.onRefused(token, rej.Reason) {
		s.log.Warn("the server refused the renewed token as not its own; the next login uses --token-file's token",
			zap.String("jti", token.Claims.ID), zap.String("reason", rej.Reason))
	}
	if err != nil {
		return nil, "", err
	}
	rw, err := netpkg.NewCryptoReadWriter(stream, c.frpAuth.EncryptionKey())
	if err != nil {
		_ = stream.Close()
		return nil, "", fmt.Errorf("encrypt control channel: %w", err)
	}
	return &controlStream{stream: stream, rw: msg.NewV1ReadWriter(rw)}, runID, nil
}

// sendLogin opens the control stream, sends frp's Login with runID and
// metas (and the client's version) and reads the answer. It returns the
// stream once the server has accepted the login, and the run ID the server
// gave the session (runID when it names none).
func sendLogin(mux *yamux.Session, frpAuth *frpauth.ClientAuth, runID string, metas map[string]string) (net.Conn, string, error) {
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
		return nil, "", fmt.Errorf("sign login: %w", err)
	}
	var encoded bytes.Buffer
	if err := msg.WriteMsg(&encoded, login); err != nil {
		return nil, "", fmt.Errorf("encode login: %w", err)
	}
	if err := checkLoginSize(encoded.Len()-tunnel.MessageHeaderSize, metas); err != nil {
		return nil, "", err
	}
	stream, err := mux.OpenStream()
	if err != nil {
		return nil, "", fmt.Errorf("open control stream: %w", err)
	}
	_ = stream.SetDeadline(time.Now().Add(loginTimeout))
	if _, err := stream.Write(encoded.Bytes()); err != nil {
		_ = stream.Close()
		return nil, "", fmt.Errorf("send login: %w", err)
	}
	var resp msg.LoginResp
	if err := msg.ReadMsgInto(stream, &resp); err != nil {
		_ = stream.Close()
		return nil, "", fmt.Errorf("read login answer: %w", err)
	}
	_ = stream.SetDeadline(time.Time{})
	if resp.Error != "" {
		_ = stream.Close()
		return nil, "", &RejectedError{Reason: resp.Error}
	}
	if resp.RunID != "" {
		// The server scopes the run ID to the tunnel; frp's work
		// connections name the run ID the server knows.
		runID = resp.RunID
	}
	return stream, runID, nil
}

// checkLoginSize refuses a login of size bytes that the server would
// refuse, naming what makes it large: the token or the routes. Without it
// the server closes the connection and the client sees only an EOF.
func checkLoginSize(size int, metas map[string]string) error {
	if size <= tunnel.MaxLoginSize {
		return nil
	}
	token, routes := len(metas[auth.TokenMetaKey]), len(metas[tunnel.RoutesMetaKey])
	hint := fmt.Sprintf("the token (--token-file) is %d bytes: issue one with shorter claims (account, runtime, audience)", token)
	if routes > token {
		hint = fmt.Sprintf("the routes (--route) take %d bytes: serve fewer routes, or shorter prefixes and upstream URLs", routes)
	}
	return fmt.Errorf("the login is %d bytes, and the server reads at most %d: %s", size, tunnel.MaxLoginSize, hint)
}

// RejectedError is the server's refusal of a login, in its own words.
type RejectedError struct{ Reason string }

func (e *RejectedError) Error() string { return "login rejected by the server: " + e.Reason }

// routeAnswered records the server's answer to the registration of the
// route of session ss.
func (s *slot) routeAnswered(ss *sessionState, name, errMsg string) {
	if errMsg != "" {
		s.c.status.onRoute(ss, errors.New(errMsg))
		s.log.Warn("tunnel route rejected by the server; it retries by itself", zap.String("route", name), zap.String("reason", errMsg))
		return
	}
	s.c.status.onRoute(ss, nil)
	s.log.Info("session ready: it serves requests for this tunnel", zap.String("route", name))
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

// handleWorkConn refuses frp work connections: a tether client's requests
// come through the dial protocol, never through frp's vhost.
func (c *Client) handleWorkConn(_ *v1.ProxyBaseConfig, conn net.Conn, _ *msg.StartWorkConn) bool {
	_ = conn.Close()
	return false // handled: frp must not dial a local port
}

// describeEnd says why a logged-in session ended, for the log: lost is
// KeepAlive's error.
func describeEnd(lost error) string {
	if lost != nil {
		return lost.Error() + ": the path to the server froze (a NAT or proxy dropped it) or the server hung"
	}
	return "the connection or its control channel was closed"
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

// frpRouteConfig is a slot's route: an http proxy at the tunnel's
// subdomain, named "<tunnel>.<runID>" so that the routes of a tunnel's
// sessions are told apart.
func frpRouteConfig(tunnel, runID string) v1.ProxyConfigurer {
	route := &v1.HTTPProxyConfig{
		ProxyBaseConfig: v1.ProxyBaseConfig{Name: tunnel + "." + runID, Type: "http"},
		DomainConfig:    v1.DomainConfig{SubDomain: tunnel},
	}
	route.Complete()
	return route
}
