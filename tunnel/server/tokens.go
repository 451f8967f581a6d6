package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server/gate"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// A logged-in session lives by its token:
//
//   - it closes when the token expires (plus the verifier's leeway), unless
//     it was renewed before;
//   - with --token-renewal-key, a tether client's token is renewed when a
//     third of its lifetime is left (auth.RenewAt): the server signs the
//     renewal, sends it to the client in a notice (the client logs in with
//     it from then on, and keeps it in --renewed-token-file), and the
//     session lives by the renewal (gate.Session.Renew). A stock frpc takes
//     no notices: its session ends with its token, as without the key;
//   - a revocation in force against its tunnel, its token's jti or the jti
//     its token was renewed from closes it, on every replica, as soon as
//     the replica learns of the revocation (at once where it was made,
//     within about a second elsewhere), and refuses its logins and probes
//     with reason revoked.
type tokenKeeper struct {
	// Static after newTokenKeeper.
	verifier *auth.Verifier
	renewer  *auth.Signer // nil: tokens are not renewed
	revs     *registry.Revocations
	log      *zap.Logger
}

// renewalRetry is how long after a renewal that failed (a key file that
// cannot sign, a renewal the verifier refuses) the next try is made.
const renewalRetry = time.Minute

func newTokenKeeper(v *auth.Verifier, renewer *auth.Signer, revs *registry.Revocations, log *zap.Logger) *tokenKeeper {
	return &tokenKeeper{verifier: v, renewer: renewer, revs: revs, log: log.Named("tokens")}
}

// refusal is the rejection of a login, or of a probe, with claims c while a
// revocation is in force against it; nil when none is. The operator's
// reason stays in the server's log: the client is told what to do.
func (k *tokenKeeper) refusal(c *auth.Claims) *auth.RejectError {
	rev, ok := k.revs.Revoked(c.Tunnel, c.ID, c.Renews)
	if !ok {
		return nil
	}
	until := "until it is deleted"
	if !rev.Until.IsZero() {
		until = "until " + rev.Until.UTC().Format(time.RFC3339)
	}
	what := fmt.Sprintf("tunnel %q is revoked", c.Tunnel)
	if rev.JTI != "" {
		what = fmt.Sprintf("this token of tunnel %q (or the token it was renewed from) is revoked", c.Tunnel)
	}
	return &auth.RejectError{Reason: auth.ReasonRevoked, ClaimedTunnel: c.Tunnel,
		Detail: fmt.Sprintf("%s (revocation %s, %s): ask the platform operator for a new token or to lift the revocation", what, rev.ID, until)}
}

// keep bounds a bound session's life by its token and, with a renewal key,
// renews a tether client's token when it is due.
func (k *tokenKeeper) keep(sess *gate.Session) {
	c := sess.Claims()
	sess.After(time.Until(k.verifier.ValidUntil(c)), func() { k.expire(sess) })
	if k.renewer != nil && !sess.Stock() {
		sess.After(time.Until(auth.RenewAt(c)), func() { k.renew(sess) })
	}
}

// expire closes a session whose token has expired; a session renewed since
// the timer was set lives on to its renewal's expiry.
func (k *tokenKeeper) expire(sess *gate.Session) {
	if until := k.verifier.ValidUntil(sess.Claims()); time.Now().Before(until) {
		sess.After(time.Until(until), func() { k.expire(sess) })
		return
	}
	sess.Close("token expired")
}

// renew sends a session's client the renewal of its token, and makes the
// session live by it.
func (k *tokenKeeper) renew(sess *gate.Session) {
	c := sess.Claims()
	log := sess.Logger().With(zap.String("session", sess.ID()), zap.String("jti", c.ID))
	if k.refusal(c) != nil {
		return // revoked: the session is closing
	}
	token, err := k.renewer.Renew(c, time.Now())
	if errors.Is(err, auth.ErrNotRenewable) {
		log.Info("token not renewed: it has no iat or nbf, or lives too short to renew; the session ends with it", zap.Error(err))
		return
	}
	var renewed *auth.Claims
	if err == nil {
		renewed, err = k.verifier.Verify(token)
	}
	if err == nil {
		err = sess.Renew(renewed)
	}
	switch {
	case errors.Is(err, gate.ErrClosed):
		return
	case err != nil:
		log.Error("token renewal failed; retrying in a minute (check that --token-renewal-key's public key is among --jwt-public-key's)",
			zap.Error(err), zap.Duration("retry_in", renewalRetry))
		sess.After(renewalRetry, func() { k.renew(sess) })
		return
	}
	sess.Notify(tunnel.Notice{Kind: tunnel.NoticeToken, Token: token})
	log.Info("token renewed", zap.String("renewed_jti", renewed.ID), zap.String("renews", renewed.Renews),
		zap.Time("expires", renewed.ExpiresAt))
	sess.After(time.Until(auth.RenewAt(renewed)), func() { k.renew(sess) })
}

// enforce closes the sessions a revocation covers, at once and at each
// change of the revocations, until ctx ends. sessions lists the logged-in
// sessions of this replica.
func (k *tokenKeeper) enforce(ctx context.Context, sessions func() []*gate.Session) {
	for {
		changed := k.revs.Changed()
		for _, sess := range sessions() {
			k.closeRevoked(sess)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// closeRevoked closes sess when a revocation covers its token, and reports
// whether it did.
func (k *tokenKeeper) closeRevoked(sess *gate.Session) bool {
	c := sess.Claims()
	if c == nil {
		return false
	}
	rej := k.refusal(c)
	if rej == nil {
		return false
	}
	sess.Logger().Warn("closing a revoked tunnel's session", zap.String("session", sess.ID()),
		zap.String("jti", c.ID), zap.String("client_address", sess.RemoteAddr()), zap.String("detail", rej.Detail))
	sess.Close(rej.Error())
	return true
}
