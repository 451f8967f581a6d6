package gate

import (
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
)

// noticeTimeout bounds sending one notice.
const noticeTimeout = 10 * time.Second

// Notify tells a tether client something about its session (tunnel.Notice)
// on a stream of its own, in the background: a login or a drain does not
// wait for it. An old client that does not know notices closes the stream.
// The notice's Session is set to the session's ID.
func (s *Session) Notify(n tunnel.Notice) {
	n.Session = s.id
	s.gate.notices.Go(func() {
		stream, err := s.mux.OpenStream()
		if err != nil {
			return // the session ended
		}
		if !s.track(stream) {
			_ = stream.Close()
			return
		}
		defer s.untrack(stream)
		defer func() { _ = stream.Close() }()
		_ = stream.SetWriteDeadline(time.Now().Add(noticeTimeout))
		if err := tunnel.WriteNotice(stream, n); err != nil {
			s.Logger().Debug("send notice", zap.String("kind", n.Kind), zap.Error(err))
		}
	})
}
