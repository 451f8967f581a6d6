package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/net/http/httpguts"

	"github.com/tether-dev/tether/internal/copybuf"
)

// forward sends req to the route's upstream and copies the answer back. It
// does what httputil.ReverseProxy did for the router, for the router's
// needs only: the outbound request shares the caller's header values instead
// of a deep copy, and 1xx responses go straight to w instead of through an
// httptrace hook. See the package doc for the behaviour. It returns false,
// having written nothing, when elsewhere allows it and the upstream could
// not be dialed with ErrNotDelivered (Router.Deliver).
func (rt *route) forward(w http.ResponseWriter, in *http.Request, elsewhere bool) (delivered bool) {
	out, err := rt.outbound(in)
	if err != nil {
		rt.handleError(w, in, err)
		return true
	}
	if body, ok := out.Body.(*callerBody); ok {
		// The body's writer may outlive this handler (an upstream that
		// answered before reading it): it must not read the caller's body
		// after ServeHTTP returns.
		defer body.stop()
	}

	var start time.Time
	if rt.metrics != nil {
		start = time.Now()
	}
	res, err := rt.transport.roundTrip(out, rt.Timeout, w)
	if err != nil {
		if elsewhere && errors.Is(err, ErrNotDelivered) && in.Context().Err() == nil {
			rt.log.Debug("request not delivered", zap.Error(err))
			return false
		}
		if !rt.tookUnreachable(w, in, err) {
			rt.handleError(w, out, err)
		}
		return true
	}
	if rt.metrics != nil {
		rt.metrics.latency.Observe(time.Since(start).Seconds())
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		rt.switchProtocols(w, out, res)
		return true
	}

	streamed := isStreamed(res)
	// A head with a body of known length waits for the body's first bytes
	// (copyBody writes it): Go's server would hold it unsent until then
	// anyway, and a body that fails before any arrives (the tunnel session
	// died between the two) is then answered like any failed exchange,
	// with a 502, rather than by a connection closed without a word.
	var pending *http.Response
	announced := 0
	if streamed || res.Body == http.NoBody {
		announced = writeHead(w, res)
	} else {
		pending = res
	}
	if streamed {
		// The caller gets the head as the upstream sent it: an event
		// stream may send nothing more for minutes. Flushed here, not in
		// copyBody: writing the head takes Go's deepest frames, and one
		// frame less under them keeps the handler's stack at 8 KiB for
		// the stream's life (BENCHMARKS.md, slow streams).
		_ = http.NewResponseController(w).Flush()
	}
	if err := rt.copyBody(w, res.Body, streamed, pending); err != nil {
		res.Body.Close()
		if errors.Is(err, errNoHead) {
			rt.handleError(w, out, err)
			return true
		}
		// The response is under way: all that is left is to abort it, so
		// that the caller sees it cut short rather than complete. What Go's
		// server holds of it goes first: aborted, it would drop a head that
		// had not left yet, and the caller would get nothing at all.
		if in.Context().Value(http.ServerContextKey) != nil {
			_ = http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}
		return true
	}
	res.Body.Close() // now, for res.Trailer
	if len(res.Trailer) > 0 {
		sendTrailers(w, res.Trailer, announced)
	}
	return true
}

// announceTrailers announces the trailers the upstream announced, in h, and
// returns how many.
func announceTrailers(h, trailer http.Header) int {
	var keys []string
	for k := range trailer {
		if !tetherField(k) {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		h.Add("Trailer", strings.Join(keys, ", "))
	}
	return len(keys)
}

// sendTrailers sends the trailers that came after the body: announced ones
// as they were announced, others with http.TrailerPrefix.
func sendTrailers(w http.ResponseWriter, trailer http.Header, announced int) {
	// Force chunking: a short body would otherwise get a Content-Length and
	// no room for trailers.
	_ = http.NewResponseController(w).Flush()
	h := w.Header()
	for k := range trailer {
		if tetherField(k) {
			delete(trailer, k)
		}
	}
	if len(trailer) == announced {
		for k, vv := range trailer {
			h[k] = vv
		}
		return
	}
	for k, vv := range trailer {
		for _, v := range vv {
			h.Add(http.TrailerPrefix+k, v)
		}
	}
}

// outbound builds the request to the upstream: the caller's, pointed at
// the route's upstream, with its end-to-end headers and the forwarding
// headers the tunnel server's entry set. The header values are shared with
// in and must not be modified.
func (rt *route) outbound(in *http.Request) (*http.Request, error) {
	rp, err := splitPath(in.URL)
	if err != nil {
		return nil, err // ServeHTTP validated the path already
	}
	u := &url.URL{
		Scheme:   rt.Upstream.Scheme,
		Host:     rt.Upstream.Host,
		RawQuery: cleanQuery(in.URL.RawQuery),
	}
	u.Path, u.RawPath = rewrite(rp, rt.Prefix, rt.Upstream)

	h := make(http.Header, len(in.Header)+1)
	for k, vv := range in.Header {
		if !hopByHop(k) && !notForUpstream(k) {
			h[k] = vv
		}
	}
	deleteListed(h, in.Header)
	// Only websocket upgrades pass through the tunnel; h2c and others are
	// hop-by-hop here.
	if up := upgradeType(in.Header); up != "" && strings.EqualFold(up, "websocket") {
		h["Connection"] = upgradeConnection
		h["Upgrade"] = []string{up}
	}
	// Tell an upstream that cares that trailers reach the caller (Go issue
	// 21096).
	if httpguts.HeaderValuesContainsToken(in.Header["Te"], "trailers") {
		h["Te"] = teTrailers
	}
	if rt.strip && rt.Prefix != "/" {
		prior := strings.TrimSuffix(in.Header.Get("X-Forwarded-Prefix"), "/")
		h["X-Forwarded-Prefix"] = []string{prior + rt.Prefix}
	}
	if _, ok := h["User-Agent"]; !ok {
		// Send none rather than Go's default.
		h["User-Agent"] = noUserAgent
	}

	out := in.WithContext(in.Context()) // a shallow copy
	out.URL = u
	// The upstream sees its own host, as it would from a client in the
	// cluster; the caller's host travels in X-Forwarded-Host.
	out.Host = ""
	out.RequestURI = ""
	out.Header = h
	out.Close = false
	out.Body = nil
	out.Trailer = nil
	if in.ContentLength != 0 && in.Body != nil && in.Body != http.NoBody {
		body := &callerBody{r: in.Body}
		out.Body = body
		out.Trailer = body.trailers(in.Trailer)
	}
	return out, nil
}

// Header values the router sets, shared by every request: never modified.
var (
	upgradeConnection = []string{"Upgrade"}
	teTrailers        = []string{"trailers"}
	noUserAgent       = []string{""}
)

// hopByHop reports whether the header named k (canonical) is for one hop
// only (RFC 9110, section 7.6.1, and the headers older proxies use).
func hopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// notForUpstream reports whether the caller's header named k never reaches
// an upstream: Forwarded, which no hop vouches for (the entry's
// X-Forwarded-* are passed on), and Proxy-* headers, which are for proxies;
// "Proxy" is httpoxy (CVE-2016-5385).
func notForUpstream(k string) bool {
	return k == "Forwarded" || k == "Proxy" || strings.HasPrefix(k, "Proxy-")
}

// callerTrailer reports whether the caller's trailer field named k may
// reach the upstream: by the rules of its header fields, and none that tells
// about the caller or speaks for tether (X-Forwarded-*, X-Real-Ip,
// X-Tether-*), which the server's entry vouches for in the head only.
// Servers that map fields to CGI-style variables read '_' as '-'.
func callerTrailer(k string) bool {
	if hopByHop(k) || notForUpstream(k) || tetherField(k) {
		return false
	}
	l := strings.ToLower(strings.ReplaceAll(k, "_", "-"))
	return l != "forwarded" && l != "x-real-ip" && !strings.HasPrefix(l, "x-forwarded-") && !strings.HasPrefix(l, "proxy-")
}

// tetherField reports whether the field named k is one of tether's own
// (X-Tether-*, in any case): an upstream's never reaches a caller, a
// replica or the error handling, where it would pass for tether's (a
// forged X-Tether-Error, or X-Tether-Peer-Miss, which makes a replica send
// the request to another holder of the tunnel).
func tetherField(k string) bool {
	const prefix = "x-tether-"
	return len(k) >= len(prefix) && strings.EqualFold(k[:len(prefix)], prefix)
}

// deleteListed deletes from h the headers that src's Connection header
// names: they are hop-by-hop too.
func deleteListed(h, src http.Header) {
	for _, v := range src["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				delete(h, textproto.CanonicalMIMEHeaderKey(f))
			}
		}
	}
}

// copyEndToEnd copies the end-to-end headers of src, an upstream's, into
// h, sharing the values; tether's own are not taken from an upstream.
func copyEndToEnd(h, src http.Header) {
	for k, vv := range src {
		if !hopByHop(k) && !tetherField(k) {
			h[k] = vv
		}
	}
	deleteListed(h, src)
}

// upgradeType is the protocol h asks to switch to, "" for none.
func upgradeType(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

// maxQueryParams is url.ParseQuery's limit.
const maxQueryParams = 10000

// cleanQuery drops the query parameters Go's server could not parse (";" as
// a separator, a bad escape, beyond url.ParseQuery's limit), as
// ReverseProxy does: a query the upstream reads differently from tether is a
// way to smuggle parameters past it.
func cleanQuery(q string) string {
	if strings.Count(q, "&")+1 > maxQueryParams {
		return reencodeQuery(q)
	}
	for i := 0; i < len(q); {
		switch q[i] {
		case ';':
			return reencodeQuery(q)
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return reencodeQuery(q)
			}
			i += 3
		default:
			i++
		}
	}
	return q
}

func reencodeQuery(q string) string {
	v, _ := url.ParseQuery(q)
	return v.Encode()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// errBodyAfterHandler: the caller's body was read after its handler
// returned, which net/http does not allow.
var errBodyAfterHandler = errors.New("request body read after the handler returned")

// callerBody is the caller's request body as the transport sees it:
// closing it stops further reads (the body's writer may outlive the
// handler) and leaves the caller's body to the HTTP server, which closes
// it. At its end it fills in the trailers that pass on.
type callerBody struct {
	r      io.ReadCloser
	closed atomic.Bool
	// trailer is the outbound request's, from, the caller's: the server
	// fills in the caller's values only once the body has ended.
	trailer, from http.Header
}

// trailers returns the outbound request's trailers, those of the caller's
// announced trailers (from) that may reach the upstream, with their
// values to come at the body's end; nil if none.
func (b *callerBody) trailers(from http.Header) http.Header {
	for k := range from {
		if callerTrailer(k) {
			if b.trailer == nil {
				b.trailer = make(http.Header, len(from))
			}
			b.trailer[k] = nil
		}
	}
	b.from = from
	return b.trailer
}

func (b *callerBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errBodyAfterHandler
	}
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		for k := range b.trailer {
			b.trailer[k] = b.from[k]
		}
	}
	return n, err
}

// Close stops further reads.
func (b *callerBody) Close() error {
	b.stop()
	return nil
}

func (b *callerBody) stop() { b.closed.Store(true) }

// isStreamed reports whether res is a stream: server-sent events, or a body
// of unknown length (watch streams, long polls, chunked downloads). A
// stream's head goes to the caller at once and its body at every write; a
// body of known length goes out in full buffers, without a system call per
// write.
func isStreamed(res *http.Response) bool {
	if res.Body == http.NoBody {
		return false
	}
	return res.ContentLength == -1 || isEventStream(res.Header.Get("Content-Type"))
}

// writeHead writes res's head to w and returns the number of trailers it
// announced.
func writeHead(w http.ResponseWriter, res *http.Response) (announced int) {
	h := w.Header()
	copyEndToEnd(h, res.Header)
	announced = announceTrailers(h, res.Trailer)
	w.WriteHeader(res.StatusCode)
	return announced
}

// errNoHead: a response body failed before its head was written, so the
// caller may still be answered.
var errNoHead = errors.New("response body failed before its first byte")

// copyBody copies a response body to w, flushing every write of a stream.
// With head set, it writes head's head first, just before the body's first
// bytes (or at its end, when it has none): a body that fails before then
// returns an error that wraps errNoHead, and nothing was written.
//
// It reads into a small buffer, and into a large one while the body has
// more ready than the small one holds. Once it has read what the upstream
// sent so far, it waits for the next bytes holding no buffer: a stream that
// trickles (an event stream open for hours) holds one only while it copies.
func (rt *route) copyBody(w http.ResponseWriter, body io.Reader, stream bool, head *http.Response) error {
	var rc *http.ResponseController
	if stream {
		rc = http.NewResponseController(w)
	}
	waiter, _ := body.(ReadyWaiter)
	buf := copyBuffers.Get()
	defer buf.Release()
	for {
		b := buf.Bytes()
		n, rerr := body.Read(b)
		if head != nil {
			if n == 0 && rerr != nil && !errors.Is(rerr, io.EOF) {
				return fmt.Errorf("%w: %w", errNoHead, rerr)
			}
			if n > 0 || rerr != nil {
				writeHead(w, head) // a body of known length announces no trailers
				head = nil
			}
		}
		if n > 0 {
			if _, err := w.Write(b[:n]); err != nil {
				return err
			}
			if stream {
				if err := rc.Flush(); err != nil {
					return err
				}
			}
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF):
			return nil
		default:
			if !errors.Is(rerr, context.Canceled) {
				if ce := rt.log.Check(zapcore.DebugLevel, "response body cut short"); ce != nil {
					ce.Write(zap.Error(rerr))
				}
			}
			return rerr
		}
		if caughtUp := buf.Adapt(n); caughtUp && waiter != nil {
			buf.Release()
			waiter.WaitReady()
		}
	}
}

// A ReadyWaiter can wait for its next bytes without reading them into a
// buffer: the transport's response bodies, and upstream connections that
// offer it (a tunnel stream), so that a quiet stream holds no buffer of its
// own while it waits.
type ReadyWaiter interface {
	// WaitReady returns once a Read would not wait, or the connection
	// failed (the Read says how).
	WaitReady()
}

// isEventStream reports whether the media type of ct is text/event-stream.
func isEventStream(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// switchProtocols completes a protocol switch (a websocket) that the
// transport found asked for: it sends the upstream's 101 to the caller on
// the hijacked connection, then copies bytes both ways until either side
// ends.
func (rt *route) switchProtocols(w http.ResponseWriter, out *http.Request, res *http.Response) {
	backend, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		res.Body.Close()
		rt.handleError(w, out, errors.New("101 response with a body that cannot be written"))
		return
	}
	defer backend.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		rt.handleError(w, out, fmt.Errorf("take over the caller's connection for a protocol switch: %w", err))
		return
	}
	defer conn.Close()
	// The request's end (the server shutting down) ends the switched
	// connection too.
	stop := context.AfterFunc(out.Context(), func() { backend.Close() })
	defer stop()

	h := w.Header()
	for k, vv := range res.Header {
		if !tetherField(k) {
			h[k] = vv
		}
	}
	res.Header = h
	res.Body = nil // res.Write writes the head only
	if err := res.Write(brw); err != nil {
		rt.log.Debug("protocol switch: write the 101 response to the caller", zap.Error(err))
		return
	}
	if err := brw.Flush(); err != nil {
		rt.log.Debug("protocol switch: write the 101 response to the caller", zap.Error(err))
		return
	}
	var fromCaller io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 {
		// What the caller sent after its request, read with it.
		fromCaller = io.MultiReader(io.LimitReader(brw.Reader, int64(n)), conn)
	}
	ended := make(chan bool, 2)
	go copySwitched(backend, fromCaller, ended)
	go copySwitched(conn, backend, ended)
	// Both directions end, or one does and the other cannot be told.
	if <-ended {
		<-ended
	}
}

// copySwitched copies one direction of a switched connection, then closes
// dst for writing when it can, so that the other side sees the end. It
// sends on ended whether the other direction may go on.
func copySwitched(dst io.Writer, src io.Reader, ended chan<- bool) {
	if _, err := io.Copy(dst, src); err != nil {
		ended <- false
		return
	}
	cw, ok := dst.(interface{ CloseWrite() error })
	ended <- ok && cw.CloseWrite() == nil
}

// copyBuffers copy response bodies (copyBody): 4 KiB, and 32 KiB while the
// upstream has that much ready.
var copyBuffers = copybuf.New(4<<10, 32<<10)
