package server

import (
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
)

// noticeTimeout bounds sending one notice.
const noticeTimeout = 10 * time.Second

// notify tells a tether client something about its session (tunnel.Notice)
// on a stream of its own, in the background: a login or a drain does not
// wait for it. An old client that does not know notices closes the stream.
func (s *serving) notify(sess *Session, kind string) {
	n := tunnel.Notice{Kind: kind, Replica: s.cfg.ReplicaID, Session: sess.id,
		Alone: kind == tunnel.NoticeHello && s.registry.Status().Backend == "memory"}
	s.notices.Go(func() {
		stream, err := sess.mux.OpenStream()
		if err != nil {
			return // the session ended
		}
		if !sess.track(stream) {
			_ = stream.Close()
			return
		}
		defer sess.untrack(stream)
		defer func() { _ = stream.Close() }()
		_ = stream.SetWriteDeadline(time.Now().Add(noticeTimeout))
		if err := tunnel.WriteNotice(stream, n); err != nil {
			sess.logger().Debug("send notice", zap.String("kind", kind), zap.Error(err))
		}
	})
}
