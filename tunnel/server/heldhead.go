package server

import (
	"bufio"
	"errors"
	"net"
	"net/http"
)

// serveHeld runs a reverse proxy's serve with the answer's head held until
// the first byte of its body, as tether's router does (proxy/forward.go):
// httputil.ReverseProxy writes an answer's head, then copies its body, and
// when the copy fails it aborts the handler — and Go's server drops the
// head it had not sent yet, so the caller would get a connection closed
// without a word when the other end (a replica, a stock frpc, its service)
// went away between the two. With the head held, such an answer is one
// nobody has seen yet, and failed gives the caller tether's own instead.
// Once the head or any of the body went out, the abort goes on, after what
// was written is flushed: the caller sees the answer cut short.
func serveHeld(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter, *http.Request), failed func(http.ResponseWriter)) {
	hw := &heldWriter{ResponseWriter: w}
	defer func() {
		v := recover()
		err, _ := v.(error)
		switch {
		case v == nil:
			if hw.status != 0 {
				hw.commit() // an answer without a body: its head goes now
			}
			return
		case !errors.Is(err, http.ErrAbortHandler) || r.Context().Err() != nil:
			panic(v)
		case hw.sent:
			_ = http.NewResponseController(w).Flush()
			panic(v)
		}
		// The upstream's fields the proxy copied are not tether's answer.
		clear(w.Header())
		failed(w)
	}()
	serve(hw, r)
}

// heldWriter holds a final status until the body's first byte, a flush,
// or the end of the answer; when nothing was written (a forward that
// passed every holder over), nothing is sent, and the caller answers.
// Informational (1xx) heads pass at once.
type heldWriter struct {
	http.ResponseWriter
	status int  // held; 0: none
	sent   bool // the head went to the ResponseWriter
}

func (w *heldWriter) WriteHeader(code int) {
	switch {
	case w.sent || w.status != 0:
	case code >= 100 && code < 200:
		w.ResponseWriter.WriteHeader(code)
	default:
		w.status = code
	}
}

func (w *heldWriter) Write(p []byte) (int, error) {
	if len(p) == 0 && !w.sent {
		return 0, nil
	}
	w.commit()
	return w.ResponseWriter.Write(p)
}

// Flush sends the head too: a stream's answer flushes so that the caller
// sees it before anything more comes.
func (w *heldWriter) Flush() {
	w.commit()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection (a protocol
// switch hijacks it).
func (w *heldWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands the connection over (a protocol switch, whose head the
// proxy writes on it): nothing is held any more.
func (w *heldWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.sent = true
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// commit sends the held head, or 200 when a body comes without one (as
// Go's server does).
func (w *heldWriter) commit() {
	if w.sent {
		return
	}
	w.sent = true
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.ResponseWriter.WriteHeader(w.status)
}
