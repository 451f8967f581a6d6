package gate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
)

// admitStream reads the first frp message of a client stream and decides
// whether frp may see the stream: a login (stamped with this session's ID so
// the auth plugin can bind it) or a work connection of this session's own
// tunnel. A login probe is answered here. Everything else is refused, and
// ends the session: neither a tether client nor frpc opens such a stream,
// and yamux would keep buffering what the client sends on a refused stream
// until the client closes it too.
func (g *Gate) admitStream(sess *Session, stream *clientStream) {
	_ = stream.SetReadDeadline(time.Now().Add(openingTimeout))
	op, err := readOpening(stream, MaxOpeningSize)
	_ = stream.SetReadDeadline(time.Time{})
	if err != nil {
		if !sess.Alive() {
			_ = stream.Close() // the session ended under the read
			return
		}
		reason := StreamMalformed
		if errors.Is(err, errOpeningTooLarge) {
			reason = StreamTooLarge
		}
		g.refuse(sess, stream, reason, "unreadable first message on a stream", zap.Error(err))
		return
	}
	sess.opened.Store(true)
	sess.slot.loginArrived()
	switch m := op.Msg.(type) {
	case *msg.Login:
		if _, probe := m.Metas[tunnel.ProbeMetaKey]; probe {
			g.answerProbe(sess, stream, m)
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
			g.refuse(sess, stream, StreamSecondLogin, "second login on one connection")
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
		g.handOver(sess, op, &controlStream{Conn: stream, sess: sess, end: func() {
			sess.After(controlCloseGrace, func() { sess.Close("control connection closed") })
		}})
	case *msg.NewWorkConn:
		if err := admitsWork(sess, m.RunID); err != nil {
			g.refuse(sess, stream, StreamForeignWorkConn, "work connection refused", zap.Error(err))
			return
		}
		guarded := g.host.WorkConn(stream, op.v2)
		op.rest = guarded
		g.handOver(sess, op, guarded)
	default:
		g.refuse(sess, stream, StreamMessageType, "stream refused", zap.String("message", fmt.Sprintf("%T", m)))
	}
}

// admitsWork reports whether a work connection claiming runID may reach frp
// from sess: only a logged-in session may open work connections, and only
// for its own run ID, so frp hands it only its own tunnel's requests.
func admitsWork(sess *Session, runID string) error {
	name := sess.Tunnel()
	switch {
	case name == "":
		return fmt.Errorf("work connection before login")
	case runID != sess.RunID():
		return fmt.Errorf("work connection for run ID %q on a session of tunnel %q with run ID %q", runID, name, sess.RunID())
	case !sess.Alive():
		return fmt.Errorf("work connection on a closed session of tunnel %q", name)
	}
	return nil
}

// refuse counts and logs a refused stream, then closes it and its session,
// in that order, so that whoever sees the stream end also sees it counted.
func (g *Gate) refuse(sess *Session, stream net.Conn, reason, logMsg string, fields ...zap.Field) {
	g.obs.StreamRefused(reason)
	fields = append(fields, zap.String("client_address", sess.remoteAddr), zap.String("tunnel", sess.Tunnel()), zap.String("reason", reason))
	g.cfg.FloodLog.Warn(logMsg, fields...)
	_ = stream.Close()
	sess.Close("stream refused: " + reason)
}

// handOver hands a stream, its opening replayed, to the host, for frp.
func (g *Gate) handOver(sess *Session, op *opening, stream net.Conn) {
	conn, err := op.replay(stream)
	if err != nil {
		// A login stamped with the session's ID can outgrow what frp
		// reads; frp would drop it without a word.
		g.refuse(sess, stream, StreamTooLarge, "first message refused", zap.Error(err))
		return
	}
	if !g.host.HandOver(sess, conn) {
		_ = conn.Close()
	}
}

// controlStream is the frp control stream of a session: when frp closes it,
// the session ends too, and each of frp's writes on it runs what
// OnControlWrite asked for.
type controlStream struct {
	net.Conn
	sess *Session
	end  func()
	once sync.Once
}

func (c *controlStream) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if f := c.sess.controlWrite.Swap(nil); f != nil {
		(*f)()
	}
	return n, err
}

func (c *controlStream) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.end)
	return err
}

// probeWriteTimeout bounds writing the answer to a login probe.
const probeWriteTimeout = 10 * time.Second

// answerProbe answers a login probe (`tether diagnose`) with what the host
// says: what a login would be told (frp's LoginResp with the same
// rejection text), followed on success by a tunnel.ProbeReply. The session
// never reaches frp and registers nothing, so a tunnel that is already
// connected is not disturbed.
func (g *Gate) answerProbe(sess *Session, stream net.Conn, login *msg.Login) {
	defer sess.After(controlCloseGrace, func() { sess.Close("login probe answered") })
	defer func() { _ = stream.Close() }()
	_ = stream.SetWriteDeadline(time.Now().Add(probeWriteTimeout))
	answer := g.host.Probe(sess, login)
	if err := msg.WriteMsg(stream, &answer.Login); err != nil || answer.Reply == nil {
		return
	}
	_ = json.NewEncoder(stream).Encode(answer.Reply)
}
