package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
)

// The gate is tether's session layer in front of frp. It owns TLS and the
// yamux session of every client connection, so that each stream is known to
// belong to the session it arrived on. frp's own tcpMux is off: frp sees
// single streams, handed to it through Service.HandleListener(l, false).
//
// Why: frp admits a work connection by the run ID it names, and its token
// auth shares one secret among all clients. Here a session becomes a
// tunnel's only after the auth plugin verified its JWT, and a work
// connection reaches frp only from the session whose run ID it names. frp's
// "internal" listener mode is never used for client streams: it skips
// control encryption and honours a login's AlwaysAuthPass.
//
// The tunnel port is open to anyone, so what a connection may cost before
// it has logged in is bounded, and so are the streams of a logged-in one:
// see limits.go.

const (
	// handshakeTimeout bounds TLS (and websocket) handshakes.
	handshakeTimeout = 10 * time.Second
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

// serveTunnel accepts tunnel clients on ln until ln is closed.
func (s *serving) serveTunnel(ln net.Listener) error {
	var delay time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors and the like: back off, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("accept tunnel connection failed; retrying", zap.Error(err), zap.Duration("delay", delay))
			time.Sleep(delay)
			continue
		}
		delay = 0
		slot, victim, refused := s.anonymous.acquire(conn, time.Now())
		if slot == nil {
			s.refuseConn(conn, refused)
			continue
		}
		if victim != nil {
			s.evict(victim)
		}
		s.conns.Add(1) // done when the session has ended (runAccept)
		go s.serveTunnelConn(conn, slot)
	}
}

// refuseConn closes a connection over the anonymous caps at once, before
// TLS, with a reset so that no socket lingers in TIME_WAIT.
func (s *serving) refuseConn(conn net.Conn, reason string) {
	s.metrics.connectionsRefused.WithLabelValues(reason).Inc() // counted before the client sees it
	resetConn(conn)
	limit := s.cfg.MaxAnonymous
	switch reason {
	case refusedAnonymousPerIP:
		limit = s.anonymous.perIP
	case refusedAnonymousPerSubnet:
		limit = s.anonymous.perSubnet
	}
	s.floodLog.Warn("tunnel connection refused: too many connections that have not logged in",
		zap.String("client_address", conn.RemoteAddr().String()), zap.String("reason", reason), zap.Int("limit", limit))
}

// evict closes an anonymous connection, at once and with a reset, to make
// room for a new one (anonymousSlots); its goroutine sees the end and
// finishes.
func (s *serving) evict(victim *anonymousSlot) {
	s.metrics.sessionsLimited.WithLabelValues(limitEvicted).Inc() // counted before the client sees it
	resetConn(victim.conn)
	s.floodLog.Warn("tunnel connection closed to make room: too many connections that have not logged in; this one kept the server waiting longest",
		zap.String("client_address", victim.conn.RemoteAddr().String()), zap.Int("limit", s.cfg.MaxAnonymous))
}

// serveTunnelConn runs one client connection: the handshake, then the
// loop that accepts the client's streams (runAccept) until the session
// ends or the loop parks. slot is the connection's place among the
// anonymous connections, given back at login or at the end.
func (s *serving) serveTunnelConn(raw net.Conn, slot *anonymousSlot) {
	defer slot.release()
	sess := s.openSession(raw, slot)
	if sess == nil {
		s.conns.Done()
		return
	}
	s.runAccept(sess.accept.park, sess)
}

// openSession makes the TLS (or wss) connection and its yamux session, and
// records the session; nil when the handshake failed.
func (s *serving) openSession(raw net.Conn, slot *anonymousSlot) *Session {
	limits := newConnLimits(loginBudget)
	gatherer := tunnel.NewGatherer(&budgetConn{Conn: raw, limits: limits, slot: slot})
	conn, transport, err := s.handshake(gatherer)
	if err != nil {
		_ = raw.Close()
		if errors.Is(err, errNoFirstByte) {
			_ = limits.trip(&limitError{reason: limitFirstByte, detail: err.Error()})
		}
		if lim := limits.tripped.Load(); lim != nil {
			s.metrics.sessionsLimited.WithLabelValues(lim.reason).Inc()
		}
		s.floodLog.Debug("tunnel handshake failed", zap.String("client_address", raw.RemoteAddr().String()), zap.Error(err))
		return nil
	}
	acc := newAcceptor()
	counted := &countingConn{Conn: &closeFirst{Conn: conn, raw: raw, closed: acc.resume}}
	guard := &muxGuard{Conn: counted, limits: limits, opening: acc.opening}
	mux, err := yamux.Server(tunnel.CoalesceFrames(guard, gatherer), s.yamuxConfig())
	if err != nil {
		_ = conn.Close()
		s.log.Error("start yamux session", zap.Error(err))
		return nil
	}
	sess := newSession(newSessionID(), counted, mux, transport, s.sessionLog)
	sess.limits, sess.slot = limits, slot
	acc.s, acc.sess = s, sess
	sess.accept = acc
	s.sessions.add(sess)
	// The login must arrive early enough to leave time for its check.
	openBy := min(loginOpeningTimeout, s.cfg.LoginTimeout/2)
	sess.untilLogin(openBy, func() {
		if !sess.opened.Load() {
			s.closeAtLimit(sess, &limitError{reason: limitNoLogin,
				detail: fmt.Sprintf("no login within %v of the handshake", openBy)})
		}
	})
	sess.untilLogin(s.cfg.LoginTimeout, func() {
		if sess.Tunnel() == "" {
			s.closeAtLimit(sess, &limitError{reason: limitLoginTimeout,
				detail: fmt.Sprintf("no successful login within %v", s.cfg.LoginTimeout)})
		}
	})
	return sess
}

// The loop that accepts a client's streams runs while the client may open
// some: until its login, and for the whole life of a stock frpc's session,
// which opens a work connection per request. A tether client opens none
// after its control stream, so once it has logged in the loop parks: its
// goroutine ends, and an idle session of a tether client holds no
// goroutine of tether's own. The loop resumes, on a goroutine of its own,
// when the client opens a stream all the same (muxGuard sees the stream's
// first frame before yamux queues it) and when the session's connection
// closes (closeFirst), to end the session.
const (
	acceptRunning int32 = iota
	acceptParked
)

// acceptor is a session's accept loop, running or parked.
type acceptor struct {
	state atomic.Int32
	// opened counts the streams the client opened and accepted those the
	// loop took: the loop parks only once it has taken them all.
	opened, accepted atomic.Int64
	// park ends when the loop is to park (a tether client logged in).
	park     context.Context
	parkLoop context.CancelFunc
	// Set once the session exists; read after a state change from parked,
	// which follows the loop's first run.
	s    *serving
	sess *Session
}

func newAcceptor() *acceptor {
	a := &acceptor{}
	a.park, a.parkLoop = context.WithCancel(context.Background())
	return a
}

// opening runs when the client opens a stream, before yamux queues it.
func (a *acceptor) opening() {
	a.opened.Add(1)
	a.resume()
}

// resume runs the loop again if it is parked.
func (a *acceptor) resume() {
	if a.state.CompareAndSwap(acceptParked, acceptRunning) {
		go a.s.runAccept(context.Background(), a.sess)
	}
}

// runAccept runs the accept loop until the session ends, and then ends
// it, or until it parks when park ends.
func (s *serving) runAccept(park context.Context, sess *Session) {
	a := sess.accept
	for {
		err := s.acceptStreams(park, sess)
		if err != nil {
			s.endSession(sess, err)
			s.conns.Done()
			return
		}
		a.state.Store(acceptParked)
		// A stream opened, or the connection closed, while the loop was
		// on its way to park was not seen by resume: take it, or the end
		// of the session, now, unless resume has since.
		if a.opened.Load() == a.accepted.Load() && !sess.mux.IsClosed() {
			return
		}
		if !a.state.CompareAndSwap(acceptParked, acceptRunning) {
			return
		}
		park = context.Background()
	}
}

// acceptStreams admits the streams the client opens until the session
// ends, and returns why it ended, or until park ends (nil; the session
// may have ended meanwhile: runAccept looks).
func (s *serving) acceptStreams(park context.Context, sess *Session) error {
	for {
		stream, err := sess.mux.AcceptStreamWithContext(park)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		if err != nil {
			return err
		}
		sess.accept.accepted.Add(1)
		s.acceptStream(sess, stream)
	}
}

// acceptStream starts admitting a stream the client opened.
func (s *serving) acceptStream(sess *Session, stream *yamux.Stream) {
	// Before login muxGuard lets one stream through; this bounds the
	// streams of a logged-in client.
	if n := sess.clientStreams.Add(1); n > maxClientStreams {
		_ = stream.Close()
		s.closeAtLimit(sess, &limitError{reason: limitStreams,
			detail: fmt.Sprintf("opened more than %d streams at once", maxClientStreams)})
		return // AcceptStream now fails
	}
	cs := &clientStream{Stream: stream, sess: sess}
	if !sess.track(stream) {
		_ = cs.Close()
		return
	}
	sess.admitting.Go(func() { s.admitStream(sess, cs) })
}

// endSession closes the session, which ended for endErr, waits for its
// streams' admission and forgets it.
func (s *serving) endSession(sess *Session, endErr error) {
	sess.accept.parkLoop()
	if lim := sess.limits.tripped.Load(); lim != nil {
		s.closeAtLimit(sess, lim)
	}
	sess.Close("connection lost: " + describeEnd(endErr))
	sess.admitting.Wait()
	s.sessions.leave(sess)
	sess.finish()
	if sess.Tunnel() != "" {
		sess.slot.loggedOut()
		info := sess.Info()
		sess.logger().Info("tunnel disconnected", zap.String("reason", sess.CloseReason()),
			zap.Duration("duration", time.Since(info.ConnectedSince)),
			zap.Uint64("bytes_in", info.BytesIn), zap.Uint64("bytes_out", info.BytesOut))
	}
}

// closeAtLimit closes a session that went over lim, and counts and logs it
// unless the session had already ended.
func (s *serving) closeAtLimit(sess *Session, lim *limitError) {
	if sess.setCloseReason(lim.detail) {
		s.metrics.sessionsLimited.WithLabelValues(lim.reason).Inc()
		// One message per reason, so that a flood of one kind does not
		// hide another from the sampled log.
		s.floodLog.Warn("tunnel connection closed at a limit: "+lim.reason, zap.String("client_address", sess.remoteAddr),
			zap.String("tunnel", sess.Tunnel()), zap.String("detail", lim.detail))
	}
	sess.Close(lim.detail)
}

// describeEnd turns yamux's end-of-session error into words for the log.
func describeEnd(err error) string {
	switch {
	case errors.Is(err, yamux.ErrKeepAliveTimeout):
		return "no heartbeat answer (the path to the client froze or the client hung)"
	case errors.Is(err, io.EOF), errors.Is(err, yamux.ErrSessionShutdown):
		return "closed"
	case err == nil:
		return "closed"
	default:
		return err.Error()
	}
}

// admitStream reads the first frp message of a client stream and decides
// whether frp may see the stream: a login (stamped with this session's ID so
// the auth plugin can bind it) or a work connection of this session's own
// tunnel. Everything else is refused, and ends the session: neither a
// tether client nor frpc opens such a stream, and yamux would keep
// buffering what the client sends on a refused stream until the client
// closes it too.
func (s *serving) admitStream(sess *Session, stream net.Conn) {
	_ = stream.SetReadDeadline(time.Now().Add(openingTimeout))
	op, err := readOpening(stream, maxOpeningSize)
	_ = stream.SetReadDeadline(time.Time{})
	if err != nil {
		if !sess.alive() {
			_ = stream.Close() // the session ended under the read
			return
		}
		reason := "malformed"
		if errors.Is(err, errOpeningTooLarge) {
			reason = "too_large"
		}
		s.refuse(sess, stream, reason, "unreadable first message on a stream", zap.Error(err))
		return
	}
	sess.opened.Store(true)
	sess.slot.loginArrived()
	switch m := op.Msg.(type) {
	case *msg.Login:
		if _, probe := m.Metas[tunnel.ProbeMetaKey]; probe {
			s.answerProbe(sess, stream, m)
			return
		}
		version := "frpc " + m.Version
		if v := m.Metas[tunnel.ClientMetaKey]; v != "" {
			version = v
		}
		var routes *string
		if r, ok := m.Metas[tunnel.RoutesMetaKey]; ok {
			routes = &r
		}
		if !sess.startLogin(version, routes) {
			s.refuse(sess, stream, "second_login", "second login on one connection")
			return
		}
		if m.Metas == nil {
			m.Metas = make(map[string]string)
		}
		m.Metas[auth.SessionMetaKey] = sess.id // overwrites anything the client sent
		// When frp closes the control stream (a rejected login, a replaced
		// control, a client that left), the whole session ends with it,
		// after a grace that lets frp's last words (a login rejection)
		// reach the client: closing a connection that still has unread
		// bytes resets it, and the client would see only the reset.
		s.toFRP(sess, op, &controlStream{Conn: stream, end: func() {
			sess.after(controlCloseGrace, func() { sess.Close("control connection closed") })
		}, wrote: func() {
			if sess.routePending.CompareAndSwap(true, false) {
				s.sessions.serve(sess)
			}
		}})
	case *msg.NewWorkConn:
		if err := admitsWork(sess, m.RunID); err != nil {
			s.refuse(sess, stream, "foreign_work_conn", "work connection refused", zap.Error(err))
			return
		}
		s.toFRP(sess, op, s.frp.guardWork(stream, op))
	default:
		s.refuse(sess, stream, "message_type", "stream refused", zap.String("message", fmt.Sprintf("%T", m)))
	}
}

// refuse counts and logs a refused stream, then closes it and its session,
// in that order, so that whoever sees the stream end also sees it counted.
func (s *serving) refuse(sess *Session, stream net.Conn, reason, logMsg string, fields ...zap.Field) {
	s.metrics.refusedStreams.WithLabelValues(reason).Inc()
	fields = append(fields, zap.String("client_address", sess.remoteAddr), zap.String("tunnel", sess.Tunnel()), zap.String("reason", reason))
	s.floodLog.Warn(logMsg, fields...)
	_ = stream.Close()
	sess.Close("stream refused: " + reason)
}

// toFRP hands a stream, its opening replayed, to the embedded frp server.
func (s *serving) toFRP(sess *Session, op *opening, stream net.Conn) {
	conn, err := op.replay(stream)
	if err != nil {
		// A login stamped with the session's ID can outgrow what frp
		// reads; frp would drop it without a word.
		s.refuse(sess, stream, "too_large", "first message refused", zap.Error(err))
		return
	}
	if !s.frp.conns.Push(conn) {
		_ = conn.Close()
	}
}

// errNoFirstByte: a connection sent nothing within firstByteTimeout.
var errNoFirstByte = fmt.Errorf("no TLS handshake within %v of connecting", firstByteTimeout)

// handshake performs TLS (accepting frp's optional 0x17 first byte) and, when
// the client speaks HTTP inside TLS, the wss upgrade.
func (s *serving) handshake(raw net.Conn) (net.Conn, string, error) {
	start := time.Now()
	_ = raw.SetDeadline(start.Add(handshakeTimeout))
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
	_ = raw.SetReadDeadline(start.Add(handshakeTimeout))
	if first[0] == frpTLSHeadByte {
		_, _ = br.Discard(1)
	} else if first[0] != tlsRecordHandshake {
		return nil, "", fmt.Errorf("not a TLS connection (first byte 0x%02x): tunnel clients must use TLS (frpc: transport.tls.enable = true)", first[0])
	}
	tlsConn := tls.Server(&bufferedConn{Conn: raw, r: br}, s.tlsConfig)
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
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
	ws, err := acceptWebsocket(conn, s.log)
	if err != nil {
		return nil, "", err
	}
	return ws, "wss", nil
}

// yamuxConfig is the sessions' yamux configuration. yamux logs a line per
// odd frame (for a stream it reset, past its backlog), so its log is
// sampled like the refusals. Its keepalive is off (tunnel.MuxConfig): the
// server's heartbeat is watchHeartbeats, with no goroutine and no ping per
// session while its client pings.
func (s *serving) yamuxConfig() *yamux.Config {
	return tunnel.MuxConfig(s.cfg.HeartbeatTimeout, s.floodLog)
}

// newSessionID returns 128 random bits as hex.
func newSessionID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// controlStream is the frp control stream of a session: when frp closes it,
// the session ends too, and each of frp's writes on it is reported (wrote).
type controlStream struct {
	net.Conn
	end   func()
	wrote func()
	once  sync.Once
}

func (c *controlStream) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.wrote()
	return n, err
}

func (c *controlStream) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.end)
	return err
}

// clientStream is a stream the client opened; closing it here takes it
// off the session's count of open client streams.
type clientStream struct {
	*yamux.Stream
	sess *Session
	once sync.Once
}

func (c *clientStream) Close() error {
	err := c.Stream.Close()
	c.once.Do(func() {
		c.sess.clientStreams.Add(-1)
		c.sess.untrack(c.Stream)
	})
	return err
}

// closeFirst closes the TCP connection under a TLS (or wss) connection
// before the connection itself, so that closing never waits: TLS would
// first send close_notify, and wait up to 5s for a client that does not
// read, while yamux keeps the session half shut (its blocked stream
// readers spin meanwhile). Clients see the end of the connection either
// way. yamux closes it once, when the session ends: closed runs then.
type closeFirst struct {
	net.Conn
	raw    net.Conn
	closed func()
}

func (c *closeFirst) Close() error {
	err := c.raw.Close()
	_ = c.Conn.Close()
	c.closed()
	return err
}

// bufferedConn reads through the reader that peeked at the connection
// until what it peeked has been read, then from the connection: the reader
// goes, and with it a layer of every read for the connection's life.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	if c.r != nil {
		if c.r.Buffered() > 0 {
			return c.r.Read(p)
		}
		c.r = nil
	}
	return c.Conn.Read(p)
}
