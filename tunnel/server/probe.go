package server

import (
	"strings"

	"github.com/fatedier/frp/pkg/msg"
	frpversion "github.com/fatedier/frp/pkg/util/version"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/version"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server/gate"
)

// Probe answers a login probe (`tether diagnose`; gate.Host): the token is
// verified exactly as a login's, and the answer is what a login would be
// told (frp's LoginResp with the same rejection text), followed on success
// by a tunnel.ProbeReply: who the token is, and whether its tunnel is
// connected, here or through another replica.
func (s *replica) Probe(sess *gate.Session, login *msg.Login) gate.ProbeAnswer {
	// Anyone can make the server answer probes: their log is sampled.
	log := s.srv.floodLog.Named("session").With(zap.String("client_address", sess.RemoteAddr()))
	claims, rej := auth.VerifyLoginToken(s.srv.verifier, login.Metas)
	if rej == nil {
		rej = s.tokens.refusal(claims)
	}
	if rej != nil {
		s.metrics.probes.WithLabelValues("rejected").Inc()
		log.Info("login probe rejected", zap.String("reason", string(rej.Reason)), zap.String("claimed_tunnel", rej.ClaimedTunnel))
		return gate.ProbeAnswer{Login: msg.LoginResp{Version: frpversion.Full(), Error: rej.Error()}}
	}
	s.metrics.probes.WithLabelValues("accepted").Inc()
	log.Info("login probe accepted", zap.String("tunnel", claims.Tunnel))
	reply := &tunnel.ProbeReply{
		Tunnel:        claims.Tunnel,
		Account:       claims.Account,
		Runtime:       claims.Runtime,
		ServerVersion: version.String(),
		PublicURL:     strings.Replace(s.publicURL, "*", claims.Tunnel, 1),
	}
	if cur, ok := s.members.lookup(claims.Tunnel); ok {
		since := cur.ConnectedAt().UTC()
		reply.Connected = true
		reply.ClientAddress = cur.RemoteAddr()
		reply.ConnectedSince = &since
	} else if len(s.srv.registry.Holders(claims.Tunnel)) > 0 {
		reply.Connected = true // through another replica
	}
	s.srv.webhooks.describe(reply)
	return gate.ProbeAnswer{Login: msg.LoginResp{Version: frpversion.Full()}, Reply: reply}
}
