package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/server/buffer"
)

// Fields of a buffered request's answer and of its deliveries.
const (
	// BufferedHeader carries the ID of a stored request in its 202 answer.
	BufferedHeader = "X-Tether-Buffered"
	// DeliveryHeader carries the ID on each delivery, so that the upstream
	// can drop a duplicate (deliveries are at least once).
	DeliveryHeader = "X-Tether-Delivery"
	// AttemptHeader counts the deliveries of the request that reached the
	// upstream or its client, this one included: 1 on the first.
	AttemptHeader = "X-Tether-Attempt"
)

// CodeBufferFull (503) is the X-Tether-Error of a request that would have
// been stored, had the tunnel's buffer or the server's not been full.
const CodeBufferFull = "buffer_full"

// Offer stores r, a request for tunnel that could not be delivered, if its
// route buffers it, and reports whether it answered r: 202 Accepted once
// the store confirmed the write, or 503 buffer_full past a quota. When it
// did not answer (false) the caller answers as it would have without a
// buffer; r's body may then have been read in part, which such an answer
// does not need.
//
// Call it for a public request (not one another replica forwarded: that
// replica offers it) whose body no session received any of: no session
// serves the tunnel on any replica, every session failed before the
// request reached its client, or the client answered that the upstream
// refused the connection. r is stored when the tunnel was seen within the
// retention, the route its last login advertised for r's path has the
// buffer option (proxy.Buffered), its method is POST, PUT or PATCH and its
// body at most Config.MaxBody; a store that fails is logged and answers
// nothing.
//
// The headers are stored byte for byte but those that describe one hop
// (Connection and those it names, Keep-Alive, Proxy-*, TE, Trailer,
// Transfer-Encoding, Upgrade), Content-Length and Expect (a delivery sends
// the whole body, and says its length), and tether's own, X-Tether-* (each
// delivery sets X-Tether-Delivery and -Attempt; a caller's would pass for
// tether's). X-Forwarded-For, -Host and -Proto stay as the entry set them,
// so the upstream learns the caller it would have learnt without the
// outage. Credentials (Authorization, Cookie, X-Gitlab-Token, signatures)
// are stored as they came, since the upstream checks them; like the body
// and the query they are tenant data at rest: never logged, listed or
// put in metrics. Trailers are not stored.
func (f *Forwarder) Offer(w http.ResponseWriter, r *http.Request, tunnel string) bool {
	if f == nil || !bufferable(r, f.cfg.MaxBody) {
		return false
	}
	ctx := r.Context()
	log := f.log.With(zap.String("tunnel", tunnel))
	rem, seen, err := f.routes.Lookup(ctx, tunnel)
	if err != nil {
		log.Warn("could not tell whether the request may be buffered: answering it as unbuffered", zap.Error(err))
		return false
	}
	if !seen || !proxy.Buffered(rem.Routes, r.URL) {
		return false
	}
	body, release, err := f.readBody(w, r, tunnel)
	defer release()
	switch {
	case errors.Is(err, errPendingFull):
		f.refuseFull(w, log, tunnel, err)
		return true
	case err != nil:
		if ce := log.Check(zap.DebugLevel, "request not buffered"); ce != nil {
			ce.Write(zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Error(err))
		}
		return false
	}
	e, err := f.buf.Append(ctx, &buffer.Request{
		Entry:  buffer.Entry{Tunnel: tunnel, Method: r.Method},
		URI:    requestURI(r),
		Header: storedHeader(r.Header),
		Body:   body,
	})
	switch {
	case errors.Is(err, buffer.ErrFull):
		f.refuseFull(w, log, tunnel, err)
		return true
	case err != nil:
		log.Warn("could not buffer a request: answering it as unbuffered", zap.Error(err))
		return false
	}
	if ce := log.Check(zap.DebugLevel, "request buffered"); ce != nil {
		ce.Write(zap.String("id", e.ID), zap.String("method", e.Method), zap.String("path", e.Path), zap.Int64("size", e.Size))
	}
	writeReceipt(w, e)
	if f.sender.Serves(tunnel) {
		// The client is here but its upstream refused: retry from now.
		f.Kick(tunnel)
	}
	return true
}

// bufferable reports whether r's method and declared length let it be
// stored.
func bufferable(r *http.Request, maxBody int64) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		return r.ContentLength <= maxBody
	}
	return false
}

// requestURI is r's request target as received: path and query.
func requestURI(r *http.Request) string {
	if strings.HasPrefix(r.RequestURI, "/") {
		return r.RequestURI
	}
	return r.URL.RequestURI()
}

// receipt is the body of a 202 answer.
type receipt struct {
	ID       string    `json:"id"`
	Tunnel   string    `json:"tunnel"`
	QueuedAt time.Time `json:"queued_at"`
}

func writeReceipt(w http.ResponseWriter, e buffer.Entry) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set(BufferedHeader, e.ID)
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(receipt{ID: e.ID, Tunnel: e.Tunnel, QueuedAt: e.QueuedAt})
}

// fullLogEvery is how often a refusal for a full buffer is logged at most.
const fullLogEvery = 10 * time.Second

// refuseFull answers 503 buffer_full: the body names the tunnel and, for
// a quota, the flag that sets it, so that the caller's owner knows what to
// ask the operator for. The server-wide cap names no figure: what other
// tunnels store is none of this caller's business.
func (f *Forwarder) refuseFull(w http.ResponseWriter, log *zap.Logger, tunnel string, err error) {
	now := time.Now().UnixNano()
	if last := f.fullLogged.Load(); now-last >= int64(fullLogEvery) && f.fullLogged.CompareAndSwap(last, now) {
		log.Warn("buffer full: request refused (further refusals are counted, and logged at most every 10s)", zap.Error(err))
	}
	proxy.WriteError(w, http.StatusServiceUnavailable, CodeBufferFull, fullMessage(tunnel, err))
}

// fullMessage is the body of a buffer_full answer for err.
func fullMessage(tunnel string, err error) string {
	const head = "tether: tunnel %q is not connected, and tether cannot store the request: "
	var fe *buffer.FullError
	if !errors.As(err, &fe) {
		return fmt.Sprintf(head+"it is reading as many bodies for the tunnel as it may at once; retry later", tunnel)
	}
	if fe.Flag == buffer.FlagMaxTotalBytes {
		return fmt.Sprintf(head+"the server's buffer for all tunnels is full (%s); retry later, or ask the operator to raise %s", tunnel, fe.Flag, fe.Flag)
	}
	return fmt.Sprintf(head+"its buffer is full: %s; retry later, or ask the operator to raise %s", tunnel, fe.Error(), fe.Flag)
}

// hopHeaders describe one connection, not the request (RFC 9110 7.6.1),
// or the way its body was sent; they are not stored.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Expect",
}

// storedHeader is what is stored of the request's header h: all of it but
// hopHeaders, the fields Connection names and tether's own (X-Tether-*),
// each value byte for byte. Names are compared ignoring case and with '_'
// for '-', as servers that map them to CGI variables read them.
func storedHeader(h http.Header) http.Header {
	var named []string
	for _, v := range h.Values("Connection") {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				named = append(named, f)
			}
		}
	}
	out := make(http.Header, len(h))
	for k, vs := range h {
		if matchesAny(k, hopHeaders) || matchesAny(k, named) || tetherField(k) {
			continue
		}
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// tetherField reports whether the field named k is one of tether's own
// (X-Tether-*, in any case, '_' for '-'). A caller's is not stored: the
// upstream takes X-Tether-Delivery and -Attempt for tether's word on
// which request this is (a forged ID would have it drop a real delivery
// as a duplicate), and each delivery sets its own.
func tetherField(k string) bool {
	const prefix = "x-tether-"
	return len(k) >= len(prefix) && strings.EqualFold(strings.ReplaceAll(k[:len(prefix)], "_", "-"), prefix)
}

// matchesAny reports whether the field name k is one of names, ignoring
// case and with '_' for '-'.
func matchesAny(k string, names []string) bool {
	for _, n := range names {
		if len(n) == len(k) && strings.EqualFold(strings.ReplaceAll(k, "_", "-"), strings.ReplaceAll(n, "_", "-")) {
			return true
		}
	}
	return false
}

// Errors of readBody that decide the answer.
var (
	errTooLarge    = errors.New("the body is larger than --buffer-max-body")
	errPendingFull = errors.New("the bodies being read for the buffer reach their bound")
)

// firstRead is the buffer a body of unknown length is first read into; it
// doubles as the body comes, so that a caller that declares a large body
// and sends little holds little.
const firstRead = 8 << 10

// readBody reads r's body whole, each read bounded by the idle timeout,
// charging what it holds to the pending bound; release gives it back. It
// fails with errTooLarge past Config.MaxBody, errPendingFull past the
// pending bound, or the read's error; then the answer, whoever writes it,
// closes the connection.
func (f *Forwarder) readBody(w http.ResponseWriter, r *http.Request, tunnel string) (body []byte, release func(), err error) {
	var held int64
	release = func() { f.pending.give(tunnel, held) }
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, release, nil
	}
	rc := http.NewResponseController(w)
	defer func() {
		if err == nil {
			// Past the body, the server reads on to see the caller
			// leave; a deadline left in place would end the request.
			_ = rc.SetReadDeadline(time.Time{})
			return
		}
		// Without it, net/http reads what is left of a body of up to
		// 256 KiB after the answer, to reuse the connection, with no
		// deadline: a caller that stalled would hold it for ever.
		w.Header().Set("Connection", "close")
	}()
	// One byte more than the body may have, to see its end (or that it is
	// too large) without another buffer.
	limit := f.cfg.MaxBody + 1
	if r.ContentLength >= 0 {
		limit = min(limit, r.ContentLength+1)
	}
	for {
		if len(body) == cap(body) {
			if int64(cap(body)) >= limit {
				return nil, release, errTooLarge
			}
			size := min(max(2*int64(cap(body)), firstRead), limit)
			grow := size - int64(cap(body))
			if !f.pending.take(tunnel, grow) {
				return nil, release, errPendingFull
			}
			held += grow
			body = append(make([]byte, 0, size), body...)
		}
		_ = rc.SetReadDeadline(time.Now().Add(f.cfg.BodyIdleTimeout))
		n, err := r.Body.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		switch {
		case errors.Is(err, io.EOF):
			if int64(len(body)) > f.cfg.MaxBody {
				return nil, release, errTooLarge
			}
			return body, release, nil
		case err != nil:
			return nil, release, fmt.Errorf("read the body: %w", err)
		}
	}
}

// pending bounds the bytes of bodies being read: in all, and per tunnel.
type pending struct {
	limit, share int64

	mu       sync.Mutex
	total    int64
	byTunnel map[string]int64
}

func newPending(limit, share int64) *pending {
	return &pending{limit: limit, share: share, byTunnel: map[string]int64{}}
}

// take charges n bytes to tunnel, or reports that it would pass a bound.
func (p *pending) take(tunnel string, n int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.total+n > p.limit || p.byTunnel[tunnel]+n > p.share {
		return false
	}
	p.total += n
	p.byTunnel[tunnel] += n
	return true
}

// give returns n bytes that tunnel held.
func (p *pending) give(tunnel string, n int64) {
	if n == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total -= n
	if p.byTunnel[tunnel] -= n; p.byTunnel[tunnel] <= 0 {
		delete(p.byTunnel, tunnel)
	}
}

// held is what the bodies being read hold, in all.
func (p *pending) held() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total
}
