package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
)

// Session is one connected tunnel client: a TLS (or websocket) connection
// carrying a yamux session. Its first stream is the frp control connection;
// the client opens more streams as frp work connections, and for tether
// clients the server opens streams of its own that carry HTTP.
//
// A session starts anonymous and becomes a tunnel's session when its login is
// verified; from then on every stream on it belongs to that tunnel.
type Session struct {
	id          string
	remoteAddr  string
	transport   string // "tls" or "wss"
	connectedAt time.Time
	mux         *yamux.Session
	conn        *countingConn
	baseLog     *zap.Logger

	// Set by the gate before the session is shared: the connection's
	// limits, and its place among the anonymous connections. The login
	// budget and the place end at login.
	limits *connLimits
	slot   *anonymousSlot
	// clientStreams counts the streams the client opened that are still
	// open here.
	clientStreams atomic.Int32
	// streams are the session's open streams, opened by either side.
	streamsMu sync.Mutex
	streams   map[*yamux.Stream]struct{}
	closing   bool
	// opened is set once the first stream's opening has been read.
	opened atomic.Bool

	// requests counts answered requests by status class: index 1..5 for
	// 1xx..5xx, index 0 for requests that failed before any response.
	requests [6]atomic.Uint64

	mu            sync.Mutex
	loginStarted  bool
	claims        *auth.Claims
	loggedInAt    time.Time
	clientVersion string
	routes        *string      // the routes a tether client advertised (JSON); nil for a stock frpc
	forward       http.Handler // how a request reaches this client; set at login
	route         string       // the registered frp proxy name; "" while none
	log           *zap.Logger  // baseLog with the tunnel name once logged in
	closeReason   string
	timers        []*time.Timer
	onEnd         []func() // run once the session has ended
}

func newSession(id string, conn *countingConn, mux *yamux.Session, transport string, log *zap.Logger) *Session {
	return &Session{
		id:          id,
		remoteAddr:  conn.RemoteAddr().String(),
		transport:   transport,
		connectedAt: time.Now(),
		mux:         mux,
		conn:        conn,
		baseLog:     log,
		log:         log,
		streams:     make(map[*yamux.Stream]struct{}),
	}
}

// logger returns the session's logger, which names the tunnel once logged in.
func (s *Session) logger() *zap.Logger {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log
}

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} { return s.mux.CloseChan() }

// Close ends the session for reason, once; later calls keep the first reason.
func (s *Session) Close(reason string) {
	s.setCloseReason(reason)
	s.interruptReads()
	_ = s.mux.Close()
}

// track records an open stream of the session. It returns false when the
// session is closing; the caller then closes the stream.
func (s *Session) track(st *yamux.Stream) bool {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.closing {
		return false
	}
	s.streams[st] = struct{}{}
	return true
}

// untrack forgets a stream that was closed.
func (s *Session) untrack(st *yamux.Stream) {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	delete(s.streams, st)
}

// interruptReads makes every read on the session's streams return now.
// While a hashicorp/yamux v0.1.2 session shuts down, a read blocked on one
// of its streams spins until the shutdown reaches that stream: with a few
// hundred streams, that is seconds of every CPU.
func (s *Session) interruptReads() {
	s.streamsMu.Lock()
	s.closing = true
	streams := make([]*yamux.Stream, 0, len(s.streams))
	for st := range s.streams {
		streams = append(streams, st)
	}
	s.streamsMu.Unlock()
	now := time.Now()
	for _, st := range streams {
		_ = st.SetReadDeadline(now)
	}
}

// setCloseReason records why the session ends, unless a reason was given
// before, and reports whether this call gave it. Close follows.
func (s *Session) setCloseReason(reason string) (first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeReason == "" {
		s.closeReason = reason
		first = true
	}
	for _, t := range s.timers {
		t.Stop()
	}
	return first
}

// CloseReason says why the session ended ("" while it is open).
func (s *Session) CloseReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeReason
}

// alive reports whether the session is open and its connection has not
// ended, whether or not the gate has noticed yet.
func (s *Session) alive() bool { return s.CloseReason() == "" && !s.mux.IsClosed() }

// after runs f after d unless the session closes first.
func (s *Session) after(d time.Duration, f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeReason != "" {
		return
	}
	s.timers = append(s.timers, time.AfterFunc(d, f))
}

// atEnd registers f to run when the session has ended.
func (s *Session) atEnd(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onEnd = append(s.onEnd, f)
}

// finish runs the end-of-session hooks; the gate calls it once the session's
// connection is gone.
func (s *Session) finish() {
	s.mu.Lock()
	hooks := s.onEnd
	s.onEnd = nil
	s.mu.Unlock()
	for _, f := range hooks {
		f()
	}
}

// advertisedRoutes returns the route specs a tether client sent at login;
// advertised is false for a stock frpc.
func (s *Session) advertisedRoutes() (specs []string, advertised bool, err error) {
	s.mu.Lock()
	raw := s.routes
	s.mu.Unlock()
	if raw == nil {
		return nil, false, nil
	}
	if err := json.Unmarshal([]byte(*raw), &specs); err != nil {
		return nil, true, fmt.Errorf("the client's advertised routes are not a JSON list of route specs: %w", err)
	}
	return specs, true, nil
}

// startLogin admits the session's one login; a second login on the same
// connection is refused, so a session is never re-bound to another identity.
func (s *Session) startLogin(clientVersion string, routes *string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loginStarted {
		return false
	}
	s.loginStarted = true
	s.clientVersion = clientVersion
	s.routes = routes
	return true
}

// bind makes the session the verified identity's. forward is how requests
// will reach this client.
func (s *Session) bind(claims *auth.Claims, forward http.Handler) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claims != nil || s.closeReason != "" {
		return false
	}
	s.claims = claims
	s.loggedInAt = time.Now()
	s.limits.lift()
	s.slot.release()
	s.forward = forward
	s.log = s.baseLog.With(zap.String("tunnel", claims.Tunnel))
	return true
}

// Claims returns the verified identity, or nil before login.
func (s *Session) Claims() *auth.Claims {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims
}

// Tunnel is the tunnel name, or "" before login.
func (s *Session) Tunnel() string {
	if c := s.Claims(); c != nil {
		return c.Tunnel
	}
	return ""
}

// setRoute records the session's route; a tunnel has at most one.
func (s *Session) setRoute(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.route != "" && s.route != name {
		return false
	}
	s.route = name
	return true
}

func (s *Session) clearRoute(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.route == name {
		s.route = ""
	}
}

// routed returns the request forwarder once the route is registered.
func (s *Session) routed() (http.Handler, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.route == "" || s.closeReason != "" || s.forward == nil {
		return nil, false
	}
	return s.forward, true
}

// dial connects to addr, one of the tether client's upstreams, through the
// client: it opens a stream, asks the client to connect, and returns the
// stream once the client has. It is the router's DialContext.
func (s *Session) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	stream, err := s.mux.OpenStream()
	if err != nil {
		return nil, &tunnelClosedError{tunnel: s.Tunnel()}
	}
	if !s.track(stream) {
		_ = stream.Close()
		return nil, &tunnelClosedError{tunnel: s.Tunnel()}
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = stream.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = stream.SetDeadline(time.Now()) })
	defer stop()
	code, msg, err := dialThrough(stream, addr)
	if err != nil {
		_ = stream.Close()
		s.untrack(stream)
		select {
		case <-s.Done():
			return nil, &tunnelClosedError{tunnel: s.Tunnel()}
		default:
		}
		if ctx.Err() != nil {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
		}
		return nil, fmt.Errorf("dial %s through the tunnel: %w", addr, err)
	}
	if code != tunnel.DialOK {
		_ = stream.Close()
		s.untrack(stream)
		return nil, dialFailure(addr, code, msg)
	}
	_ = stream.SetDeadline(time.Time{})
	return &tunnelConn{Conn: stream, stream: stream, sess: s}, nil
}

func dialThrough(stream net.Conn, addr string) (tunnel.DialCode, string, error) {
	if err := tunnel.WriteDialRequest(stream, addr); err != nil {
		return 0, "", err
	}
	return tunnel.ReadDialReply(stream)
}

// dialFailure turns the client's answer into the error the router explains:
// a net.OpError for what a local dial could have met.
func dialFailure(addr string, code tunnel.DialCode, msg string) error {
	var cause error
	switch code {
	case tunnel.DialRefused:
		cause = syscall.ECONNREFUSED
	case tunnel.DialNotFound:
		host, _, _ := net.SplitHostPort(addr)
		cause = &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	case tunnel.DialUnreachable:
		cause = syscall.EHOSTUNREACH
	case tunnel.DialTimeout:
		cause = os.ErrDeadlineExceeded
	case tunnel.DialNotAllowed:
		return &notAllowedError{addr: addr, msg: msg}
	default:
		cause = errors.New(msg)
	}
	return &net.OpError{Op: "dial", Net: "tcp", Source: nil, Addr: nil, Err: cause}
}

// tunnelClosedError: the tunnel's session ended under a request.
type tunnelClosedError struct{ tunnel string }

func (e *tunnelClosedError) Error() string { return fmt.Sprintf("tunnel %q disconnected", e.tunnel) }

// Response implements proxy.ResponseError.
func (e *tunnelClosedError) Response() (int, string, string) {
	return http.StatusBadGateway, "tunnel_disconnected",
		fmt.Sprintf("tether: tunnel %q disconnected during the request; retry", e.tunnel)
}

// notAllowedError: the client refused an upstream it does not route to,
// which means server and client disagree about the client's routes.
type notAllowedError struct{ addr, msg string }

func (e *notAllowedError) Error() string {
	return fmt.Sprintf("the tunnel client refused to connect to %s: %s", e.addr, e.msg)
}

// Response implements proxy.ResponseError.
func (e *notAllowedError) Response() (int, string, string) {
	return http.StatusBadGateway, "upstream_not_allowed",
		fmt.Sprintf("tether: the tunnel client refused to connect to %s: it is not one of its routes", e.addr)
}

// tunnelConn is a dialed upstream connection inside the session. Once the
// session has ended, its errors say so, so that the router answers "tunnel
// disconnected" rather than blaming the upstream.
type tunnelConn struct {
	net.Conn
	stream *yamux.Stream
	sess   *Session
	once   sync.Once
}

func (c *tunnelConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.sess.untrack(c.stream) })
	return err
}

func (c *tunnelConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	return n, c.explain(err)
}

func (c *tunnelConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	return n, c.explain(err)
}

func (c *tunnelConn) explain(err error) error {
	if err == nil {
		return err
	}
	select {
	case <-c.sess.Done():
		return &tunnelClosedError{tunnel: c.sess.Tunnel()}
	default:
		return err
	}
}

// countRequest records one answered request by its status code (0 = failed
// before a response).
func (s *Session) countRequest(status int) { s.requests[statusClass(status)].Add(1) }

// statusClass maps 1xx..5xx to 1..5 and anything else to 0.
func statusClass(status int) int {
	if status >= 100 && status < 600 {
		return status / 100
	}
	return 0
}

// Info is a snapshot of a session for the admin API.
type Info struct {
	Name           string    `json:"name"`
	Account        string    `json:"account"`
	Runtime        string    `json:"runtime"`
	ClientAddress  string    `json:"client_address"`
	ConnectedSince time.Time `json:"connected_since"`
	ClientVersion  string    `json:"client_version"`
	BytesIn        uint64    `json:"bytes_in"`
	BytesOut       uint64    `json:"bytes_out"`
	Transport      string    `json:"transport"`
	Route          string    `json:"route"`
	TokenExpires   time.Time `json:"token_expires"`
	Requests       uint64    `json:"requests"`
}

// Info returns the session's state. BytesIn counts what the client sent.
func (s *Session) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := Info{
		ClientAddress:  s.remoteAddr,
		ConnectedSince: s.connectedAt.UTC(),
		ClientVersion:  s.clientVersion,
		BytesIn:        s.conn.read.Load(),
		BytesOut:       s.conn.written.Load(),
		Transport:      s.transport,
		Route:          s.route,
	}
	if s.claims != nil {
		info.Name = s.claims.Tunnel
		info.Account = s.claims.Account
		info.Runtime = s.claims.Runtime
		info.TokenExpires = s.claims.ExpiresAt.UTC()
	}
	for i := range s.requests {
		info.Requests += s.requests[i].Load()
	}
	return info
}

// countingConn counts the bytes of a session's connection, for the admin
// API and metrics. Two atomic adds per read or write cost nothing measurable
// beside TLS.
type countingConn struct {
	net.Conn
	read, written atomic.Uint64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(uint64(n)) //nolint:gosec // n >= 0
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(uint64(n)) //nolint:gosec // n >= 0
	return n, err
}
