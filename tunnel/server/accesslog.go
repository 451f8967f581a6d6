package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/proxy"
)

// Every public request has a request ID, in X-Request-Id: the caller's when
// it sent one that is fit to log (maxRequestIDLen printable ASCII
// characters, no spaces), otherwise a new one. The upstream receives it with
// the request, the caller with the answer (an upstream's own does not
// replace it), and the access log names it, so one ID follows a request
// from the caller through tether to the upstream and back.
const (
	requestIDHeader = "X-Request-Id"
	maxRequestIDLen = 128
)

// What the access log writes of a caller's method and path at most: they
// come from anyone on the internet, and one request must not make a line
// of its head's size.
const (
	maxLoggedMethod = 32
	maxLoggedPath   = 1024
)

// accessLog gives every public request its request ID and, when enabled
// (--access-log), logs one line per request as it ends: what was asked,
// which tunnel and route served it, how it was answered. It never logs a
// query string, a header's value (but the request ID), a body or a token.
type accessLog struct {
	log     *zap.Logger // nil: no access log
	replica string
	domain  string
}

// newAccessLog is the public entry's access log: to log, when enabled.
func newAccessLog(cfg *Config, log *zap.Logger) *accessLog {
	a := &accessLog{replica: cfg.ReplicaID, domain: cfg.Domain}
	if cfg.AccessLog {
		a.log = log.Named("access")
	}
	return a
}

// wrap returns next with request IDs, and logged.
func (a *accessLog) wrap(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := requestID(r.Header)
		r.Header[requestIDHeader] = []string{id}
		w.Header()[requestIDHeader] = []string{id}
		aw := &accessWriter{ResponseWriter: w, id: id}
		if a.log == nil {
			next(aw, r)
			return
		}
		start, method, path := time.Now(), r.Method, r.URL.Path
		note := &accessNote{}
		r = r.WithContext(proxy.WithRouteNote(context.WithValue(r.Context(), accessNoteKey{}, note), &note.route))
		// Deferred: a response cut short (http.ErrAbortHandler) is logged
		// too.
		defer func() { a.write(r, aw, note, method, path, time.Since(start)) }()
		next(aw, r)
	})
}

// write logs one request.
func (a *accessLog) write(r *http.Request, w *accessWriter, note *accessNote, method, path string, d time.Duration) {
	status := w.status
	if status == 0 && r.Context().Err() == nil {
		status = http.StatusOK // net/http answers a handler that wrote nothing
	}
	name, _ := tunnelName(r.Host, a.domain)
	fields := []zap.Field{
		zap.String("tunnel", name),
		zap.String("route", note.route.Prefix),
		zap.String("method", clip(method, maxLoggedMethod)),
		zap.String("path", clip(path, maxLoggedPath)),
		zap.Int("status", status),
		zap.String("error", w.tetherError),
		zap.Duration("duration", d),
		zap.Int64("bytes", w.bytes),
		zap.String("request_id", w.id),
		zap.String("replica", a.replica),
		zap.Bool("forwarded", note.forwardedTo != ""),
	}
	if note.forwardedTo != "" {
		fields = append(fields, zap.String("forwarded_to", note.forwardedTo))
	}
	a.log.Info("request", fields...)
}

// clip returns s cut to n bytes, marked when cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// requestID returns the request ID h carries, or a new one when it carries
// none, several, or one unfit to log.
func requestID(h http.Header) string {
	if v := h[requestIDHeader]; len(v) == 1 && validRequestID(v[0]) {
		return v[0]
	}
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// validRequestID reports whether id is 1 to maxRequestIDLen printable
// ASCII characters without spaces.
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := range len(id) {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

// accessNote is what the access log learns from inside the entry about one
// request: the route that served it (the router writes it) and the replica
// it was forwarded to. Written by the goroutine that serves the request,
// read once the handler has returned.
type accessNote struct {
	route       proxy.RouteNote
	forwardedTo string // the replica that answered it; "" when not forwarded
}

type accessNoteKey struct{}

// noteForwarded records, for the access log, that a replica answered the
// request of ctx.
func noteForwarded(ctx context.Context, replica string) {
	if n, ok := ctx.Value(accessNoteKey{}).(*accessNote); ok {
		n.forwardedTo = replica
	}
}

// accessWriter puts the request ID on the answer, and records for the
// access log its status, its X-Tether-Error and how many body bytes went
// out. Flushing, hijacking and the rest of http.ResponseController pass
// through (Unwrap).
type accessWriter struct {
	http.ResponseWriter
	id          string
	status      int    // final status (or 101), 0 until written
	tetherError string // X-Tether-Error: tether answered itself
	bytes       int64
}

// WriteHeader sets the request ID over an upstream's, then records the
// first final status.
func (w *accessWriter) WriteHeader(code int) {
	if w.status == 0 {
		h := w.Header()
		h[requestIDHeader] = []string{w.id}
		if code >= 200 || code == http.StatusSwitchingProtocols {
			w.status = code
			w.tetherError = h.Get(proxy.ErrorHeader)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *accessWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

// FlushError flushes buffered data to the caller.
func (w *accessWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection over for a protocol switch, which answers
// 101 on it directly.
func (w *accessWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

// Unwrap returns the wrapped ResponseWriter, for http.ResponseController.
func (w *accessWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
