package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// exchange is one request and its response on a connection; it is also the
// response body, which hands the connection back when read to its end.
type exchange struct {
	pc  *persistConn
	req *http.Request
	res *http.Response
	// informational receives the 1xx responses (nil: none).
	informational http.ResponseWriter
	// stopWatch stops closing the connection when the request's context
	// ends; it reports false if that has begun.
	stopWatch func() bool
	body      io.ReadCloser // the body http.ReadResponse made
	// wrote receives the result of writing a request with a body (nil when
	// the request had none, and was written before the response was read).
	wrote chan error
	// cont tells the body's writer, for "Expect: 100-continue", whether to
	// send the body; nil otherwise.
	cont     chan bool
	deadline headerDeadline
	canceled atomic.Bool // the connection was closed for the request's context
	done     bool        // the body ended or was closed
	err      error       // what further reads of the body return
}

// run writes the request on ex.pc and reads the response head. On an error
// the connection is closed.
func (ex *exchange) run(timeout time.Duration) (*http.Response, error) {
	pc, req := ex.pc, ex.req
	pc.nread, pc.nwritten, pc.readErr = 0, 0, nil
	pc.heads.start()
	ex.deadline.d, ex.deadline.conn = timeout, pc.conn
	ex.stopWatch = context.AfterFunc(req.Context(), ex.cancel)
	if req.Body == nil || req.Body == http.NoBody {
		if err := pc.writeRequest(req); err != nil {
			return nil, ex.fail(fmt.Errorf("write request: %w", err))
		}
		ex.deadline.start()
	} else {
		ex.wrote = make(chan error, 1)
		if httpguts.HeaderValuesContainsToken(req.Header["Expect"], "100-continue") {
			ex.cont = make(chan bool, 1)
		}
		go ex.writeWithBody()
	}
	res, err := ex.readResponse()
	if ex.deadline.stop() {
		return nil, ex.fail(errHeaderTimeout)
	}
	if err != nil {
		if ex.cont != nil {
			ex.cont <- false
		}
		select {
		case werr := <-ex.wrote:
			if werr != nil && !errors.Is(werr, errBodyNotSent) {
				err = fmt.Errorf("write request: %w", werr)
			}
		default:
		}
		return nil, ex.fail(err)
	}
	ex.res = res
	switch {
	case res.StatusCode == http.StatusSwitchingProtocols:
		if !switchAsked(req.Header, res.Header) {
			return nil, ex.fail(errUnaskedSwitch)
		}
		res.Body = &upgradedBody{ex: ex, br: pc.br}
	case res.Body == http.NoBody:
		ex.finish(true)
	default:
		ex.body = res.Body
		res.Body = ex
	}
	return res, nil
}

// fail ends the exchange on err, closing its connection.
func (ex *exchange) fail(err error) error {
	ex.stopWatch()
	ex.pc.close()
	if ex.canceled.Load() {
		if cerr := ex.req.Context().Err(); cerr != nil {
			return cerr
		}
	}
	return err
}

// cancel closes the connection when the request's context ends.
func (ex *exchange) cancel() {
	ex.canceled.Store(true)
	ex.pc.close()
}

// retryable reports whether the failed exchange may be repeated on a new
// connection: it had no request body and no byte of the response arrived,
// on a pooled connection the upstream may have closed meanwhile; and the
// request is safe to repeat or none of it was written.
func (ex *exchange) retryable(err error) bool {
	pc := ex.pc
	if !pc.reused || pc.nread > 0 || ex.wrote != nil || ex.canceled.Load() || errors.Is(err, errHeaderTimeout) {
		return false
	}
	return pc.nwritten == 0 || replayable(ex.req)
}

// replayable reports whether req may be sent again, as http.Transport
// decides: a method that is idempotent, or an idempotency key.
func replayable(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// writeRequest writes req, head and body, through a pooled buffer.
func (pc *persistConn) writeRequest(req *http.Request) error {
	bw := getWriter(pc)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	putWriter(bw)
	return err
}

// errBodyNotSent: the upstream answered an "Expect: 100-continue" request
// without asking for its body.
var errBodyNotSent = errors.New("the upstream answered without asking for the request body")

// writeWithBody writes a request that has a body, on its own goroutine: the
// upstream may answer while the body streams. A write that fails closes the
// connection, so that a response being read fails too.
func (ex *exchange) writeWithBody() {
	req := ex.req
	var cb *continueBody
	if ex.cont != nil {
		cb = &continueBody{ReadCloser: req.Body, cont: ex.cont}
		r := *req
		r.Body = cb
		req = &r
	}
	err := ex.pc.writeRequest(req)
	switch {
	case cb != nil && cb.refused:
		// The connection closes once the response has been read.
		err = errBodyNotSent
	case err == nil:
		ex.deadline.start()
	default:
		ex.pc.close()
	}
	ex.wrote <- err
}

// continueBody holds a request body back until the upstream asks for it
// with "100 Continue", answers without asking, or expectContinue passes.
// Request.Write has flushed the head before its first read.
type continueBody struct {
	io.ReadCloser
	cont    chan bool
	decided bool
	refused bool // the body was not sent
}

func (b *continueBody) Read(p []byte) (int, error) {
	if !b.decided {
		b.decided = true
		t := time.NewTimer(expectContinue)
		select {
		case send := <-b.cont:
			if !send {
				t.Stop()
				b.refused = true
				return 0, errBodyNotSent
			}
		case <-t.C:
		}
		t.Stop()
	}
	return b.ReadCloser.Read(p)
}

// switchAsked reports whether a 101 answer with header res switches to the
// protocol that the request with header req asked for, as http.Transport
// and httputil.ReverseProxy decide: both name it in Upgrade, and both say
// Connection: Upgrade. A bare 101 to a plain request would otherwise turn
// the caller's connection into a raw pipe to the upstream, which would
// then read the caller's next requests, whatever their host.
func switchAsked(req, res http.Header) bool {
	want := upgradeType(req)
	return want != "" && strings.EqualFold(want, upgradeType(res))
}

// errTooManyInformational ends an exchange with endless 1xx responses.
var errTooManyInformational = &badResponseError{
	reason: fmt.Sprintf("it sent more than %d informational (1xx) responses", maxInformational)}

// readResponse reads the final response head, writing 1xx responses to
// ex.informational. The heads are bounded together (pc.heads).
func (ex *exchange) readResponse() (*http.Response, error) {
	pc := ex.pc
	for n := 0; ; n++ {
		if n > maxInformational {
			return nil, errTooManyInformational
		}
		res, err := http.ReadResponse(pc.br, ex.req)
		if err != nil {
			if pc.readErr == nil && !errors.Is(err, ErrBadResponse) {
				// The bytes arrived, and are not a response.
				err = malformed(err)
			}
			return nil, fmt.Errorf("read response: %w", err)
		}
		code := res.StatusCode
		if code == http.StatusContinue && ex.cont != nil {
			ex.cont <- true
			ex.cont = nil
		}
		if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
			if w := ex.informational; w != nil {
				h := w.Header()
				for k, vv := range res.Header {
					if !tetherField(k) {
						h[k] = vv
					}
				}
				w.WriteHeader(code)
				// WriteHeader keeps the headers of a 1xx response.
				clear(h)
			}
			continue
		}
		if ex.cont != nil {
			// A final answer without "100 Continue": the body follows only
			// if the connection is kept, as http.Transport does.
			ex.cont <- !res.Close
			ex.cont = nil
		}
		return res, nil
	}
}

// Read reads the response body. At its end, the connection returns to the
// pool if both sides keep it alive and the request was written in full.
func (ex *exchange) Read(p []byte) (int, error) {
	if ex.done {
		return 0, ex.err
	}
	n, err := ex.body.Read(p)
	switch {
	case errors.Is(err, io.EOF):
		ex.err = io.EOF
		ex.finish(true)
	case err != nil:
		ex.err = err
		ex.finish(false)
		if ex.canceled.Load() {
			if cerr := ex.req.Context().Err(); cerr != nil {
				err = cerr
			}
		}
	}
	return n, err
}

// WaitReady waits until the connection has bytes of the body, or fails, so
// that the body's copy holds no buffer while the upstream is quiet: in the
// connection itself when it can wait without reading (the bytes then stay
// where the next Read, bypassing the reader, takes as many as it has room
// for), else in the connection's reader. A failure is left for the Read
// that follows, which meets it again on the connection.
func (ex *exchange) WaitReady() {
	switch {
	case ex.done, ex.pc.br.Buffered() > 0:
	case ex.pc.waiter != nil:
		ex.pc.waiter.WaitReady()
	default:
		_, _ = ex.pc.br.Peek(1)
	}
}

// Close closes the body; a body not read to its end closes the connection.
// It does not drain the rest: it may never end (an event stream).
func (ex *exchange) Close() error {
	if !ex.done {
		ex.err = errors.New("read on closed response body")
		ex.finish(false)
	}
	return nil
}

// finish ends the exchange: the connection goes back to the pool if the
// response ended (complete) and nothing else stops it, or is closed.
func (ex *exchange) finish(complete bool) {
	ex.done = true
	watched := ex.stopWatch()
	reuse := complete && watched && !ex.res.Close && !ex.req.Close
	if ex.wrote != nil {
		select {
		case err := <-ex.wrote:
			reuse = reuse && err == nil
		default:
			reuse = false // the body is still being written
		}
	}
	if reuse {
		ex.pc.t.putIdle(ex.pc)
		return
	}
	ex.pc.close()
}

// upgradedBody is a 101 response's body: the connection itself, switched to
// another protocol (websocket), read and written by the caller. It never
// returns to the pool.
type upgradedBody struct {
	ex *exchange
	br *bufio.Reader // bytes that came with the response head, until read
}

func (b *upgradedBody) Read(p []byte) (int, error) {
	if b.br != nil {
		if n := b.br.Buffered(); n > 0 {
			return b.br.Read(p[:min(len(p), n)])
		}
		b.br = nil
	}
	return b.ex.pc.conn.Read(p)
}

func (b *upgradedBody) Write(p []byte) (int, error) { return b.ex.pc.conn.Write(p) }

func (b *upgradedBody) Close() error {
	b.ex.stopWatch()
	return b.ex.pc.conn.Close()
}

// headerDeadline is the timer of one request's response-header timeout: it
// starts once the request is written, body included, and closes the
// connection if no response head arrives in time.
type headerDeadline struct {
	d    time.Duration // 0: none
	conn net.Conn

	mu      sync.Mutex
	timer   *time.Timer // nil until started
	stopped bool        // the response head arrived, or the exchange failed
}

// start starts the timer, unless the head arrived first.
func (h *headerDeadline) start() {
	if h.d <= 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped || h.timer != nil {
		return
	}
	h.timer = time.AfterFunc(h.d, h.expire)
}

func (h *headerDeadline) expire() { _ = h.conn.Close() }

// stop ends the deadline and reports whether it had expired.
func (h *headerDeadline) stop() bool {
	if h.d <= 0 {
		return false
	}
	h.mu.Lock()
	h.stopped = true
	t := h.timer
	h.mu.Unlock()
	return t != nil && !t.Stop()
}
