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
	"sync"
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
// connection reaches frp only from its own tunnel's current session. frp's
// "internal" listener mode is never used for client streams: it skips
// control encryption and honours a login's AlwaysAuthPass.

const (
	// handshakeTimeout bounds TLS (and websocket) handshakes.
	handshakeTimeout = 10 * time.Second
	// openingTimeout bounds reading the first frp message of a stream.
	openingTimeout = 10 * time.Second
	// frpTLSHeadByte is frp's optional byte before a TLS ClientHello
	// (transport.tls.disableCustomTLSFirstByte = false).
	frpTLSHeadByte     = 0x17
	tlsRecordHandshake = 0x16
	// controlCloseGrace is how long a session outlives its closed control
	// stream, unless the client closes it first.
	controlCloseGrace = 2 * time.Second
)

// serveTunnel accepts tunnel clients on ln until ln is closed.
func (s *Server) serveTunnel(ln net.Listener) error {
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
		s.conns.Go(func() { s.serveTunnelConn(conn) })
	}
}

// serveTunnelConn runs one client connection until it ends.
func (s *Server) serveTunnelConn(raw net.Conn) {
	conn, transport, err := s.handshake(raw)
	if err != nil {
		_ = raw.Close()
		s.log.Debug("tunnel handshake failed", zap.String("remote_addr", raw.RemoteAddr().String()), zap.Error(err))
		return
	}
	counted := &countingConn{Conn: conn}
	mux, err := yamux.Server(tunnel.CoalesceFrames(counted), s.yamuxConfig())
	if err != nil {
		_ = conn.Close()
		s.log.Error("start yamux session", zap.Error(err))
		return
	}
	sess := newSession(newSessionID(), counted, mux, transport, s.log.Named("session"))
	s.tenancy.add(sess)
	sess.after(s.cfg.LoginTimeout, func() {
		if sess.Tunnel() == "" {
			sess.Close(fmt.Sprintf("no successful login within %v", s.cfg.LoginTimeout))
		}
	})

	var streams sync.WaitGroup
	var endErr error
	for {
		stream, err := mux.AcceptStream()
		if err != nil {
			endErr = err
			break
		}
		streams.Go(func() { s.admitStream(sess, stream) })
	}
	sess.Close("connection lost: " + describeEnd(endErr))
	streams.Wait()
	s.tenancy.remove(sess)
	sess.finish()
	if sess.Tunnel() != "" {
		info := sess.Info()
		sess.logger().Info("tunnel disconnected", zap.String("reason", sess.CloseReason()),
			zap.Duration("duration", time.Since(info.ConnectedSince)),
			zap.Uint64("bytes_in", info.BytesIn), zap.Uint64("bytes_out", info.BytesOut))
	}
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
// tunnel. Everything else is refused.
func (s *Server) admitStream(sess *Session, stream net.Conn) {
	_ = stream.SetReadDeadline(time.Now().Add(openingTimeout))
	op, err := readOpening(stream, maxOpeningSize)
	_ = stream.SetReadDeadline(time.Time{})
	if err != nil {
		reason := "malformed"
		if errors.Is(err, errOpeningTooLarge) {
			reason = "too_large"
		}
		s.refuse(sess, reason, "unreadable first message on a stream", zap.Error(err))
		_ = stream.Close()
		return
	}
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
			s.refuse(sess, "second_login", "second login on one connection")
			_ = stream.Close()
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
		s.toFRP(op, &controlStream{Conn: stream, end: func() {
			sess.after(controlCloseGrace, func() { sess.Close("control connection closed") })
		}})
	case *msg.NewWorkConn:
		if err := s.tenancy.admitsWork(sess, m.RunID); err != nil {
			s.refuse(sess, "foreign_work_conn", "work connection refused", zap.Error(err))
			_ = stream.Close()
			return
		}
		s.toFRP(op, stream)
	default:
		s.refuse(sess, "message_type", "stream refused", zap.String("message", fmt.Sprintf("%T", m)))
		_ = stream.Close()
	}
}

// refuse counts and logs a refused stream. Callers close the stream after
// it, so that whoever sees the stream end also sees it counted.
func (s *Server) refuse(sess *Session, reason, logMsg string, fields ...zap.Field) {
	s.metrics.refusedStreams.WithLabelValues(reason).Inc()
	fields = append(fields, zap.String("client_address", sess.remoteAddr), zap.String("reason", reason))
	sess.logger().Warn(logMsg, fields...)
}

// toFRP hands a stream, its opening replayed, to the embedded frp server.
func (s *Server) toFRP(op *opening, stream net.Conn) {
	conn, err := op.replay(stream)
	if err != nil {
		_ = stream.Close()
		s.log.Error("replay first message", zap.Error(err))
		return
	}
	if !s.frpConns.Push(conn) {
		_ = conn.Close()
	}
}

// handshake performs TLS (accepting frp's optional 0x17 first byte) and, when
// the client speaks HTTP inside TLS, the wss upgrade.
func (s *Server) handshake(raw net.Conn) (net.Conn, string, error) {
	_ = raw.SetDeadline(time.Now().Add(handshakeTimeout))
	defer func() { _ = raw.SetDeadline(time.Time{}) }()

	br := bufio.NewReader(raw)
	first, err := br.Peek(1)
	if err != nil {
		return nil, "", fmt.Errorf("read first byte: %w", err)
	}
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
	tb := bufio.NewReader(tlsConn)
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

func (s *Server) yamuxConfig() *yamux.Config {
	return tunnel.MuxConfig(s.cfg.HeartbeatTimeout, s.log)
}

// newSessionID returns 128 random bits as hex.
func newSessionID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// controlStream is the frp control stream of a session: when frp closes it,
// the session ends too.
type controlStream struct {
	net.Conn
	end  func()
	once sync.Once
}

func (c *controlStream) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.end)
	return err
}

// bufferedConn reads through the reader that peeked at the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
