package gate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
)

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
	// Static after newAcceptor: park ends when the loop is to park (Bind
	// calls parkLoop for a tether client). A context owned as the loop's
	// signal to park, and nothing else.
	park     context.Context
	parkLoop context.CancelFunc
	// Set by openSession once the session exists; read after a state
	// change from parked, which follows the loop's first run.
	g    *Gate
	sess *Session

	// Atomics shared by the loop and resume: running or parked; and the
	// streams the client opened (muxGuard's opening) and those the loop
	// took. The loop parks only once it has taken them all.
	state            atomic.Int32
	opened, accepted atomic.Int64
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
		go a.g.runAccept(context.Background(), a.sess)
	}
}

// runAccept runs the accept loop until the session ends, and then ends
// it, or until it parks when park ends.
func (g *Gate) runAccept(park context.Context, sess *Session) {
	a := sess.accept
	for {
		err := g.acceptStreams(park, sess)
		if err != nil {
			g.endSession(sess, err)
			g.conns.Done()
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
func (g *Gate) acceptStreams(park context.Context, sess *Session) error {
	for {
		stream, err := sess.mux.AcceptStreamWithContext(park)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		if err != nil {
			return err
		}
		sess.accept.accepted.Add(1)
		g.acceptStream(sess, stream)
	}
}

// acceptStream starts admitting a stream the client opened.
func (g *Gate) acceptStream(sess *Session, stream *yamux.Stream) {
	// Before login muxGuard lets one stream through; this bounds the
	// streams of a logged-in client.
	if n := sess.clientStreams.Add(1); n > MaxClientStreams {
		_ = stream.Close()
		g.closeAtLimit(sess, &limitError{reason: LimitStreams,
			detail: fmt.Sprintf("opened more than %d streams at once", MaxClientStreams)})
		return // AcceptStream now fails
	}
	cs := &clientStream{Stream: stream, sess: sess}
	if !sess.track(stream) {
		_ = cs.Close()
		return
	}
	sess.admitting.Go(func() { g.admitStream(sess, cs) })
}

// endSession closes the session, which ended for endErr, waits for its
// streams' admission and forgets it (→ closed): the host hears of it, and
// the session's OnEnd hooks run.
func (g *Gate) endSession(sess *Session, endErr error) {
	sess.accept.parkLoop()
	if lim := sess.limits.tripped.Load(); lim != nil {
		g.closeAtLimit(sess, lim)
	}
	sess.Close("connection lost: " + describeEnd(endErr))
	sess.admitting.Wait()
	g.forget(sess)
	hooks := sess.ended()
	g.host.Ended(sess)
	for _, f := range hooks {
		f()
	}
	if sess.Tunnel() != "" {
		sess.slot.loggedOut()
		in, out := sess.Traffic()
		sess.Logger().Info("tunnel disconnected", zap.String("reason", sess.CloseReason()),
			zap.Duration("duration", time.Since(sess.connectedAt)),
			zap.Uint64("bytes_in", in), zap.Uint64("bytes_out", out))
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

// Reset ends the stream at once (resetStream): what the client still sends
// on it is not read.
func (c *clientStream) Reset() {
	resetStream(c.Stream)
	_ = c.Close()
}
