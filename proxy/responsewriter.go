package proxy

import (
	"bufio"
	"net"
	"net/http"
)

// NewStatusWriter wraps w.
func NewStatusWriter(w http.ResponseWriter) *StatusWriter { return &StatusWriter{ResponseWriter: w} }

// StatusWriter records the status a request was answered with, for logs and
// metrics. It passes flushing and hijacking (websocket upgrades) through to
// the ResponseWriter it wraps, and unwraps for http.ResponseController.
type StatusWriter struct {
	http.ResponseWriter
	status   int  // final status, 0 until written
	canceled bool // the caller went away before a response
}

// WriteHeader records the first final status (or 101) and passes it on.
func (w *StatusWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200 and passes p on.
func (w *StatusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// FlushError flushes buffered data to the caller.
func (w *StatusWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush implements http.Flusher.
func (w *StatusWriter) Flush() { _ = w.FlushError() }

// Hijack hands the connection over for a protocol switch; the router
// writes the 101 response on it directly.
func (w *StatusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

// Status is the final status written: 101 for a protocol switch, 0 while
// nothing has been written.
func (w *StatusWriter) Status() int { return w.status }

// Unwrap returns the wrapped ResponseWriter, for http.ResponseController.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
