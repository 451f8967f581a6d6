// Package gate is tether's tunnel port: it owns every tunnel client's
// connection from TCP accept to close, in front of the embedded frp server.
//
// A connection takes a place among the anonymous connections (anonymous.go)
// and makes its TLS or wss handshake; then it carries a yamux session
// (Session), the first frp message of every stream the client opens is read
// and judged (admit.go), and for the session's life its limits (limits.go),
// the heartbeat and the silence watch (heartbeat.go) apply. The gate hands
// frp, through its Host, only what a session may show it: a login stamped
// with the session's ID, so that the auth plugin can bind the session to
// the verified tunnel, and the work connections of the session's own run
// ID. The rest of the server reaches the client through the session: Dial
// opens a stream to one of the client's upstreams (dial.go), Notify tells
// the client something (notice.go). lifecycle.go has every state a session
// goes through, and who moves it on.
//
//	g, err := gate.New(gate.Config{TLS: tlsConfig, HeartbeatTimeout: time.Minute,
//		LoginTimeout: 30 * time.Second, MaxAnonymous: 1024, MaxAnonymousPerIP: 64,
//		Log: log, FloodLog: sampled}, host, observer)
//	err = g.Serve(ctx, ln) // until ctx ends
//	g.CloseAll("server shutting down")
//	g.Wait()
//
// Why the gate: frp admits a work connection by the run ID it names, and its
// token auth shares one secret among all clients. Here a session becomes a
// tunnel's only once the auth plugin verified its JWT, and a work connection
// reaches frp only from the session whose run ID it names. frp's own tcpMux
// is off: frp sees single streams, through the host. frp's "internal"
// listener mode is never used for client streams: it skips control
// encryption and honours a login's AlwaysAuthPass.
//
// The gate does not verify tokens (the host's auth plugin does), does not
// know which sessions serve which tunnel (the host does), and speaks HTTP
// only for the wss upgrade.
package gate

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/internal/source"
	"github.com/tether-dev/tether/tunnel"
)

// Config configures a Gate. It is static after New.
type Config struct {
	// TLS is the tunnel port's TLS configuration: its certificate.
	TLS *tls.Config
	// HeartbeatTimeout is how long a silent client connection lives before
	// the gate drops it (heartbeat.go). At least 3s.
	HeartbeatTimeout time.Duration
	// LoginTimeout is how long a new connection has to log in.
	LoginTimeout time.Duration
	// MaxAnonymous caps the connections that have not logged in, counted
	// from TCP accept (anonymous.go); MaxAnonymousPerIP caps those from
	// one address (an IPv6 /64), and SubnetShare times it those from one
	// /24 (IPv6 /48). Both positive.
	MaxAnonymous, MaxAnonymousPerIP int
	// Log takes the sessions' lifecycle (as "session") and the gate's own
	// failures; FloodLog is Log sampled, for what a client can make the
	// gate log as often as it likes: refused connections and streams,
	// limits, yamux's complaints.
	Log, FloodLog *zap.Logger
}

// Host is what the gate hands the rest of the server. Its methods are
// called concurrently, from the gate's goroutines, and must not block for
// long.
type Host interface {
	// HandOver gives frp a stream the gate admitted on sess, its first
	// message replayed: a login, stamped with sess.ID() (auth.SessionMetaKey),
	// whose stream becomes the session's control stream, or a work
	// connection of sess's own run ID (see WorkConn). It returns false when
	// frp takes no more streams: the gate then closes conn.
	HandOver(sess *Session, conn net.Conn) bool
	// WorkConn wraps the stream of a stock frpc's work connection before
	// frp gets it (HandOver): what the wrapper reads is what the client
	// sends after the connection's first message, which the gate replays
	// ahead of it, and frp writes through it. v2 tells frp's wire protocol
	// (which frames the message frp writes first). The wrapper owns stream.
	WorkConn(stream Stream, v2 bool) net.Conn
	// Probe answers a login probe (tether diagnose) on sess: what it is
	// told. The session never reaches frp; the gate writes the answer and
	// closes the session.
	Probe(sess *Session, login *msg.Login) ProbeAnswer
	// Silent: sess's client stopped answering while something written to
	// it awaited an answer (the silence watch, heartbeat.go). The host
	// closes sess when its tunnel has other sessions to go to.
	Silent(sess *Session)
	// Ended: sess's connection is gone, after its streams' admission ended.
	// Called once per session the gate accepted, logged in or not.
	Ended(sess *Session)
}

// Observer receives the gate's refusals, for metrics. Its methods are
// called concurrently and must not block.
type Observer interface {
	// ConnectionRefused: a connection closed at accept, before TLS, for
	// reason (Refused*).
	ConnectionRefused(reason string)
	// SessionLimited: a connection closed for going over limit (Limit*).
	SessionLimited(limit string)
	// StreamRefused: a client stream refused, for reason (malformed,
	// too_large, second_login, foreign_work_conn, message_type); its
	// session is closed with it.
	StreamRefused(reason string)
}

// Stream is a client stream as the gate hands it over. Reset ends it at
// once, as a TCP reset does: nothing more is read from it, and the client
// gets a reset (see resetStream).
type Stream interface {
	net.Conn
	Reset()
}

// ProbeAnswer is what a login probe is told: what the login would be told
// (frp's LoginResp, with the same rejection text), and, for a login that
// would be accepted, the reply that follows it.
type ProbeAnswer struct {
	Login msg.LoginResp
	Reply *tunnel.ProbeReply // nil for a rejection
}

// Gate is the tunnel port. Create it with New.
type Gate struct {
	// Static after New.
	cfg        Config
	host       Host
	obs        Observer
	sessionLog *zap.Logger
	anonymous  *anonymousSlots // locked inside

	// Every session, from its handshake until it has ended, by ID: frp's
	// plugin calls name a session by ID.
	mu       sync.RWMutex
	sessions map[string]*Session

	// The goroutines the gate starts besides Serve's, which Wait waits for.
	conns   sync.WaitGroup // one per client connection, until its session has ended (runAccept)
	notices sync.WaitGroup // Notify's
	pings   sync.WaitGroup // the heartbeat's (heartbeatPing)
}

// New validates cfg and makes a gate. It starts nothing.
func New(cfg Config, host Host, obs Observer) (*Gate, error) {
	var errs []error
	if cfg.TLS == nil {
		errs = append(errs, errors.New("gate: no TLS configuration"))
	}
	if host == nil || obs == nil {
		errs = append(errs, errors.New("gate: a Host and an Observer are required"))
	}
	if cfg.HeartbeatTimeout < 3*time.Second {
		errs = append(errs, fmt.Errorf("gate: heartbeat timeout %v: want at least 3s", cfg.HeartbeatTimeout))
	}
	if cfg.LoginTimeout <= 0 {
		errs = append(errs, fmt.Errorf("gate: login timeout %v: want a positive duration", cfg.LoginTimeout))
	}
	if cfg.MaxAnonymous <= 0 || cfg.MaxAnonymousPerIP <= 0 {
		errs = append(errs, fmt.Errorf("gate: anonymous caps %d and %d per address: want positive numbers", cfg.MaxAnonymous, cfg.MaxAnonymousPerIP))
	}
	if cfg.Log == nil || cfg.FloodLog == nil {
		errs = append(errs, errors.New("gate: Log and FloodLog are required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Gate{
		cfg: cfg, host: host, obs: obs,
		sessionLog: cfg.Log.Named("session"),
		anonymous:  newAnonymousSlots(cfg.MaxAnonymous, cfg.MaxAnonymousPerIP),
		sessions:   make(map[string]*Session),
	}, nil
}

const (
	// HandshakeTimeout bounds a connection's TLS (and websocket)
	// handshake.
	HandshakeTimeout = 10 * time.Second
	// openingTimeout bounds reading the first frp message of a stream (the
	// login's is bounded tighter, by loginOpeningTimeout).
	openingTimeout = 10 * time.Second
	// frpTLSHeadByte is frp's optional byte before a TLS ClientHello
	// (transport.tls.disableCustomTLSFirstByte = false).
	frpTLSHeadByte     = 0x17
	tlsRecordHandshake = 0x16
	// peekBufferSize is bufio's smallest buffer.
	peekBufferSize = 16
	// controlCloseGrace is how long a session outlives its closed control
	// stream, unless the client closes it first.
	controlCloseGrace = 2 * time.Second
)

// Serve accepts tunnel clients on ln, and runs the heartbeat, until ctx
// ends; it closes ln then. Sessions outlive it: CloseAll closes them, Wait
// waits for them.
func (g *Gate) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var heartbeat sync.WaitGroup
	heartbeat.Go(func() { g.watchHeartbeats(ctx) })
	defer heartbeat.Wait()
	return g.acceptConns(ln)
}

// acceptConns accepts tunnel clients on ln until ln is closed.
func (g *Gate) acceptConns(ln net.Listener) error {
	var delay time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors and the like: back off, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			g.cfg.Log.Warn("accept tunnel connection failed; retrying", zap.Error(err), zap.Duration("delay", delay))
			time.Sleep(delay)
			continue
		}
		delay = 0
		slot, victim, refused := g.anonymous.acquire(conn, time.Now())
		if slot == nil {
			g.refuseConn(conn, refused)
			continue
		}
		if victim != nil {
			g.evict(victim)
		}
		g.conns.Add(1) // done when the session has ended (runAccept)
		go g.serveConn(conn, slot)
	}
}

// Session returns the session with ID id, logged in or not.
func (g *Gate) Session(id string) (*Session, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	s, ok := g.sessions[id]
	return s, ok
}

// Sessions returns every session, logged in or not, in no order.
func (g *Gate) Sessions() []*Session {
	g.mu.RLock()
	defer g.mu.RUnlock()
	list := make([]*Session, 0, len(g.sessions))
	for _, s := range g.sessions {
		list = append(list, s)
	}
	return list
}

// each calls f for every session with the sessions locked for reading: f
// must not call the gate's session methods.
func (g *Gate) each(f func(*Session)) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, s := range g.sessions {
		f(s)
	}
}

// CloseAll closes every session for reason.
func (g *Gate) CloseAll(reason string) {
	for _, s := range g.Sessions() {
		s.Close(reason)
	}
}

// Wait waits until every session has ended and every goroutine the gate
// started has returned. Call it after Serve has returned, once the
// sessions are closed (CloseAll).
func (g *Gate) Wait() {
	g.conns.Wait()
	g.notices.Wait()
	g.pings.Wait()
}

// Anonymous is the number of connections that have not logged in.
func (g *Gate) Anonymous() int { return g.anonymous.count() }

// refuseConn closes a connection over the anonymous caps at once, before
// TLS, with a reset so that no socket lingers in TIME_WAIT.
func (g *Gate) refuseConn(conn net.Conn, reason string) {
	g.obs.ConnectionRefused(reason) // counted before the client sees it
	source.Refuse(conn)
	limit := g.cfg.MaxAnonymous
	switch reason {
	case RefusedAnonymousPerIP:
		limit = g.anonymous.perIP
	case RefusedAnonymousPerSubnet:
		limit = g.anonymous.perSubnet
	}
	g.cfg.FloodLog.Warn("tunnel connection refused: too many connections that have not logged in",
		zap.String("client_address", conn.RemoteAddr().String()), zap.String("reason", reason), zap.Int("limit", limit))
}

// evict closes an anonymous connection, at once and with a reset, to make
// room for a new one (anonymousSlots); its goroutine sees the end and
// finishes.
func (g *Gate) evict(victim *anonymousSlot) {
	g.obs.SessionLimited(LimitEvicted) // counted before the client sees it
	source.Refuse(victim.conn)
	g.cfg.FloodLog.Warn("tunnel connection closed to make room: too many connections that have not logged in; this one kept the server waiting longest",
		zap.String("client_address", victim.conn.RemoteAddr().String()), zap.Int("limit", g.cfg.MaxAnonymous))
}

// serveConn runs one client connection: the handshake, then the loop that
// accepts the client's streams (runAccept) until the session ends or the
// loop parks. slot is the connection's place among the anonymous
// connections, given back at login or at the end.
func (g *Gate) serveConn(raw net.Conn, slot *anonymousSlot) {
	defer slot.release()
	sess := g.openSession(raw, slot)
	if sess == nil {
		g.conns.Done()
		return
	}
	g.runAccept(sess.accept.park, sess)
}

// openSession makes the TLS (or wss) connection and its yamux session, and
// records the session; nil when the handshake failed.
func (g *Gate) openSession(raw net.Conn, slot *anonymousSlot) *Session {
	limits := newConnLimits(LoginBudget)
	gatherer := tunnel.NewGatherer(&budgetConn{Conn: raw, limits: limits, slot: slot})
	conn, transport, err := g.handshake(gatherer)
	if err != nil {
		_ = raw.Close()
		if errors.Is(err, errNoFirstByte) {
			_ = limits.trip(&limitError{reason: LimitFirstByte, detail: err.Error()})
		}
		if lim := limits.tripped.Load(); lim != nil {
			g.obs.SessionLimited(lim.reason)
		}
		g.cfg.FloodLog.Debug("tunnel handshake failed", zap.String("client_address", raw.RemoteAddr().String()), zap.Error(err))
		return nil
	}
	acc := newAcceptor()
	counted := &countingConn{Conn: &closeFirst{Conn: conn, raw: raw, closed: acc.resume}}
	guard := &muxGuard{Conn: counted, limits: limits, opening: acc.opening}
	mux, err := yamux.Server(tunnel.CoalesceFrames(guard, gatherer), g.yamuxConfig())
	if err != nil {
		_ = conn.Close()
		g.cfg.Log.Error("start yamux session", zap.Error(err))
		return nil
	}
	sess := newSession(g, newSessionID(), counted, mux, transport)
	sess.limits, sess.slot = limits, slot
	acc.g, acc.sess = g, sess
	sess.accept = acc
	g.mu.Lock()
	g.sessions[sess.id] = sess
	g.mu.Unlock()
	// The login must arrive early enough to leave time for its check.
	openBy := min(loginOpeningTimeout, g.cfg.LoginTimeout/2)
	sess.untilLogin(openBy, func() {
		if !sess.opened.Load() {
			g.closeAtLimit(sess, &limitError{reason: LimitNoLogin,
				detail: fmt.Sprintf("no login within %v of the handshake", openBy)})
		}
	})
	sess.untilLogin(g.cfg.LoginTimeout, func() {
		if sess.Tunnel() == "" {
			g.closeAtLimit(sess, &limitError{reason: LimitLoginTimeout,
				detail: fmt.Sprintf("no successful login within %v", g.cfg.LoginTimeout)})
		}
	})
	return sess
}

// forget removes an ended session from the gate's sessions.
func (g *Gate) forget(sess *Session) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.sessions, sess.id)
}

// errNoFirstByte: a connection sent nothing within firstByteTimeout.
var errNoFirstByte = fmt.Errorf("no TLS handshake within %v of connecting", firstByteTimeout)

// handshake performs TLS (accepting frp's optional 0x17 first byte) and, when
// the client speaks HTTP inside TLS, the wss upgrade.
func (g *Gate) handshake(raw net.Conn) (net.Conn, string, error) {
	start := time.Now()
	_ = raw.SetDeadline(start.Add(HandshakeTimeout))
	_ = raw.SetReadDeadline(start.Add(firstByteTimeout))
	defer func() { _ = raw.SetDeadline(time.Time{}) }()

	// Peeking needs a few bytes, and reads larger than the buffer bypass it:
	// the smallest buffer saves 4 KiB per connection.
	br := bufio.NewReaderSize(raw, peekBufferSize)
	first, err := br.Peek(1)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, "", errNoFirstByte
	}
	if err != nil {
		return nil, "", fmt.Errorf("read first byte: %w", err)
	}
	_ = raw.SetReadDeadline(start.Add(HandshakeTimeout))
	if first[0] == frpTLSHeadByte {
		_, _ = br.Discard(1)
	} else if first[0] != tlsRecordHandshake {
		return nil, "", fmt.Errorf("not a TLS connection (first byte 0x%02x): tunnel clients must use TLS (frpc: transport.tls.enable = true)", first[0])
	}
	tlsConn := tls.Server(&bufferedConn{Conn: raw, r: br}, g.cfg.TLS)
	ctx, cancel := context.WithTimeout(context.Background(), HandshakeTimeout)
	defer cancel()
	if err := tlsConn.HandshakeContext(ctx); err != nil {
		return nil, "", fmt.Errorf("TLS handshake: %w", err)
	}
	tb := bufio.NewReaderSize(tlsConn, peekBufferSize)
	head, err := tb.Peek(4)
	if err != nil {
		return nil, "", fmt.Errorf("read after TLS handshake: %w", err)
	}
	conn := net.Conn(&bufferedConn{Conn: tlsConn, r: tb})
	if string(head) != "GET " {
		return conn, "tls", nil
	}
	ws, err := acceptWebsocket(conn, g.cfg.Log)
	if err != nil {
		return nil, "", err
	}
	return ws, "wss", nil
}

// yamuxConfig is the sessions' yamux configuration. yamux logs a line per
// odd frame (for a stream it reset, past its backlog), so its log is
// sampled like the refusals. Its keepalive is off (tunnel.MuxConfig): the
// gate's heartbeat is watchHeartbeats, with no goroutine and no ping per
// session while its client pings.
func (g *Gate) yamuxConfig() *yamux.Config {
	return tunnel.MuxConfig(g.cfg.HeartbeatTimeout, g.cfg.FloodLog)
}

// newSessionID returns 128 random bits as hex.
func newSessionID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
