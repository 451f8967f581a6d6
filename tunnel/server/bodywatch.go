package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/proxy"
)

// defaultBodyIdleTimeout bounds how long a request body may send nothing
// while the server waits for it, as ReadHeaderTimeout bounds a head: a
// client sends a body as fast as the network and the upstream take it, so
// 30 s of silence is a client gone, or one holding the tunnel's slot (and
// a goroutine, a stream and their buffers) for nothing.
const defaultBodyIdleTimeout = 30 * time.Second

// unroutedBodyTimeout is the code, and the reason counted in
// tether_http_unrouted_requests_total, of a request whose body stalled.
const unroutedBodyTimeout = "body_timeout"

// bodyWatch watches a public request's body for stalls: its body (in
// place of the request's) gives each read until timeout to bring a byte,
// by the connection's read deadline, and its reply (in place of the
// ResponseWriter) answers 408 instead of whatever the route answers once
// the body has stalled. A read that times out fails the request's
// context: Go's HTTP server takes any read error for the caller leaving.
type bodyWatch struct {
	body  idleBody
	reply stallWriter
}

// watchBody watches r's body, and returns the ResponseWriter to answer
// through; nil and w when r has no body.
func (s *replica) watchBody(w http.ResponseWriter, r *http.Request) (*bodyWatch, http.ResponseWriter) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, w
	}
	bw := &bodyWatch{
		body:  idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w), timeout: s.srv.cfg.BodyIdleTimeout},
		reply: stallWriter{ResponseWriter: w},
	}
	bw.reply.body = &bw.body
	r.Body = &bw.body
	return bw, &bw.reply
}

// stalled reports whether the body stalled; a nil bodyWatch never does.
func (bw *bodyWatch) stalled() bool { return bw != nil && bw.body.timedOut() }

// answerStalled answers a request whose body stalled, once the route is
// done with it: 408, unless a response had begun, and then the
// connection is aborted.
func (s *replica) answerStalled(bw *bodyWatch, r *http.Request) {
	s.metrics.unrouted.WithLabelValues(unroutedBodyTimeout).Inc()
	s.srv.refusalLog.Warn("request body stalled: answered 408 and closed the connection",
		zap.String("remote_addr", r.RemoteAddr), zap.String("host", r.Host), zap.Duration("timeout", s.srv.cfg.BodyIdleTimeout))
	if !bw.reply.divert() {
		// The route's answer had begun: end the connection after what was
		// written, rather than read what follows the body as a request.
		panic(http.ErrAbortHandler)
	}
}

// idleBody is a request body whose every read must bring a byte within
// timeout.
type idleBody struct {
	// Static after watchBody.
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration

	// Written by Read, read by timedOut (the handler's goroutine, which
	// may answer while a read is still under way).
	// readingUntil is the deadline of the read in progress, in Unix
	// nanoseconds; 0 while none is.
	readingUntil atomic.Int64
	stalled      atomic.Bool // a read timed out
}

func (b *idleBody) Read(p []byte) (int, error) {
	deadline := time.Now().Add(b.timeout)
	_ = b.rc.SetReadDeadline(deadline)
	b.readingUntil.Store(deadline.UnixNano())
	n, err := b.ReadCloser.Read(p)
	b.readingUntil.Store(0)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.stalled.Store(true)
	default:
		// The end of the body: the server reads on in the background to
		// see the caller leave, and a deadline would end the response.
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// timedOut reports whether a read timed out, or is timing out: the server
// fails the request's context inside the read, so its handler may answer
// before the read returns.
func (b *idleBody) timedOut() bool {
	if b.stalled.Load() {
		return true
	}
	until := b.readingUntil.Load()
	return until != 0 && time.Now().UnixNano() >= until
}

// stallWriter is the ResponseWriter of a request whose body is watched:
// once the body has stalled, and unless a response began, it answers 408
// in place of the route's answer, which it drops. Only the handler's
// goroutine writes.
type stallWriter struct {
	http.ResponseWriter
	body     *idleBody
	began    bool // a response began
	diverted bool // the 408 was written
}

func (w *stallWriter) WriteHeader(code int) {
	if w.divert() {
		return
	}
	if code >= http.StatusOK || code == http.StatusSwitchingProtocols {
		w.began = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *stallWriter) Write(p []byte) (int, error) {
	if w.divert() {
		return len(p), nil
	}
	w.began = true
	return w.ResponseWriter.Write(p)
}

// divert writes the 408 if the body stalled before a response began, and
// reports whether it has been written: then whatever the route writes is
// dropped.
func (w *stallWriter) divert() bool {
	if w.diverted || w.began || !w.body.timedOut() {
		return w.diverted
	}
	w.diverted = true
	h := w.Header()
	clear(h)
	h.Set("Connection", "close")
	proxy.WriteError(w.ResponseWriter, http.StatusRequestTimeout, unroutedBodyTimeout, fmt.Sprintf(
		"tether: the request body sent nothing for %v (--body-idle-timeout); send the body without pausing", w.body.timeout))
	return true
}

// Unwrap returns the wrapped ResponseWriter, for http.ResponseController.
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
