package server

import (
	"encoding/json"
	"net"
	"strings"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	frpversion "github.com/fatedier/frp/pkg/util/version"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/version"
	"github.com/tether-dev/tether/tunnel"
)

// probeWriteTimeout bounds writing the answer to a login probe.
const probeWriteTimeout = 10 * time.Second

// answerProbe answers a login probe (`tether diagnose`): the token is
// verified exactly as a login's, and the answer is what a login would be told
// (frp's LoginResp with the same rejection text), followed on success by a
// tunnel.ProbeReply. The session never reaches frp and registers nothing, so
// a tunnel that is already connected is not disturbed.
func (s *serving) answerProbe(sess *Session, stream net.Conn, login *msg.Login) {
	defer sess.after(controlCloseGrace, func() { sess.Close("login probe answered") })
	defer func() { _ = stream.Close() }()
	_ = stream.SetWriteDeadline(time.Now().Add(probeWriteTimeout))

	// Anyone can make the server answer probes: their log is sampled.
	log := s.floodLog.Named("session").With(zap.String("client_address", sess.remoteAddr))
	claims, rej := auth.VerifyLoginToken(s.verifier, login.Metas)
	if rej != nil {
		s.metrics.probes.WithLabelValues("rejected").Inc()
		log.Info("login probe rejected", zap.String("reason", string(rej.Reason)), zap.String("claimed_tunnel", rej.ClaimedTunnel))
		_ = msg.WriteMsg(stream, &msg.LoginResp{Version: frpversion.Full(), Error: rej.Error()})
		return
	}
	s.metrics.probes.WithLabelValues("accepted").Inc()
	log.Info("login probe accepted", zap.String("tunnel", claims.Tunnel))
	reply := tunnel.ProbeReply{
		Tunnel:        claims.Tunnel,
		Account:       claims.Account,
		Runtime:       claims.Runtime,
		ServerVersion: version.String(),
		PublicURL:     strings.Replace(s.cfg.PublicURL, "*", claims.Tunnel, 1),
	}
	if cur, ok := s.sessions.lookup(claims.Tunnel); ok {
		info := cur.Info()
		reply.Connected = true
		reply.ClientAddress = info.ClientAddress
		reply.ConnectedSince = &info.ConnectedSince
	} else if len(s.registry.Holders(claims.Tunnel)) > 0 {
		reply.Connected = true // through another replica
	}
	if err := msg.WriteMsg(stream, &msg.LoginResp{Version: frpversion.Full()}); err != nil {
		return
	}
	_ = json.NewEncoder(stream).Encode(reply)
}
