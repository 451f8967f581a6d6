package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The tests in this file drive the transport directly, against an upstream
// played on net.Pipe connections: like tunnel streams, they report the
// peer's close to a read that may not wait. Time-driven behaviour runs in a
// synctest bubble.

// pipeUpstream plays an upstream: each dial gets a new connection, served
// by serve on its own goroutine.
type pipeUpstream struct {
	serve  func(c *upstreamConn)
	dials  atomic.Int32
	closed atomic.Int32 // connections whose serve returned
	probes atomic.Int32 // read deadlines set on the transport's ends
	wg     sync.WaitGroup
}

func newPipeUpstream(t *testing.T, serve func(c *upstreamConn)) *pipeUpstream {
	u := &pipeUpstream{serve: serve}
	t.Cleanup(u.wg.Wait)
	return u
}

func (u *pipeUpstream) dial(context.Context, string, string) (net.Conn, error) {
	u.dials.Add(1)
	client, server := net.Pipe()
	u.wg.Go(func() {
		defer u.closed.Add(1)
		defer server.Close()
		u.serve(&upstreamConn{Conn: server, br: bufio.NewReader(server)})
	})
	return &probedConn{Conn: client, probes: &u.probes}, nil
}

// probedConn counts the read deadlines set on it: the transport sets one
// only to check an idle connection.
type probedConn struct {
	net.Conn
	probes *atomic.Int32
}

func (c *probedConn) SetReadDeadline(t time.Time) error {
	if !t.IsZero() {
		c.probes.Add(1)
	}
	return c.Conn.SetReadDeadline(t)
}

// transport returns a transport that dials the upstream; it closes its idle
// connections when the test ends.
func (u *pipeUpstream) transport(t *testing.T) *transport {
	tr := newTransport(transportKey{scheme: "http", addr: "up:80"}, u.dial)
	t.Cleanup(tr.closeIdle)
	return tr
}

// upstreamConn is the upstream's end of one connection.
type upstreamConn struct {
	net.Conn
	br *bufio.Reader
}

// readRequest reads a request head and its whole body.
func (c *upstreamConn) readRequest() (*http.Request, string, error) {
	req, err := http.ReadRequest(c.br)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(req.Body)
	return req, string(b), err
}

// serveAll answers every request on the connection with respond's raw
// response, until the connection ends or respond returns "".
func serveAll(respond func(req *http.Request, body string) string) func(c *upstreamConn) {
	return func(c *upstreamConn) {
		for {
			req, body, err := c.readRequest()
			if err != nil {
				return
			}
			raw := respond(req, body)
			if raw == "" {
				return
			}
			if _, err := io.WriteString(c, raw); err != nil {
				return
			}
			if strings.HasPrefix(raw, "HTTP/1.0") || strings.Contains(raw, "Connection: close") {
				return
			}
		}
	}
}

const okResponse = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

func newRequest(t *testing.T, method, path string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://up"+path, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// fetch sends req and reads the whole response body.
func fetch(t *testing.T, tr *transport, req *http.Request) (*http.Response, string, error) {
	t.Helper()
	res, err := tr.roundTrip(req, 0, nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b), err
}

func TestTransportReuse(t *testing.T) {
	tests := []struct {
		name     string
		response string
		method   string
		read     func(io.Reader) // nil: read all
		reused   bool
	}{
		{name: "body read to its end", response: okResponse, reused: true},
		{name: "chunked body with trailers read to its end",
			response: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 1\r\n\r\n", reused: true},
		{name: "HEAD", method: http.MethodHead, response: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", reused: true},
		{name: "no content", response: "HTTP/1.1 204 No Content\r\n\r\n", reused: true},
		{name: "body closed before its end", response: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789",
			read: func(r io.Reader) { _, _ = r.Read(make([]byte, 1)) }},
		{name: "upstream closes", response: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"},
		{name: "body until the connection ends", response: "HTTP/1.0 200 OK\r\n\r\nok"},
		{name: "more than the response", response: okResponse + "HTTP/1.1 200 OK\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newPipeUpstream(t, serveAll(func(req *http.Request, _ string) string {
				if req.URL.Path == "/next" {
					return okResponse
				}
				return tc.response
			}))
			tr := up.transport(t)
			res, err := tr.roundTrip(newRequest(t, cmp(tc.method, http.MethodGet), "/first", nil), 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.read != nil {
				tc.read(res.Body)
			} else if _, err := io.Copy(io.Discard, res.Body); err != nil {
				t.Fatalf("read body: %v", err)
			}
			res.Body.Close()
			wantIdle, wantDials := 0, int32(2)
			if tc.reused {
				wantIdle, wantDials = 1, 1
			}
			if n := tr.idleCount(); n != wantIdle {
				t.Errorf("%d idle connections after the response, want %d", n, wantIdle)
			}
			if _, body, err := fetch(t, tr, newRequest(t, http.MethodGet, "/next", nil)); err != nil || body != "ok" {
				t.Fatalf("next request: %q, %v", body, err)
			}
			if n := up.dials.Load(); n != wantDials {
				t.Errorf("%d connections for two requests, want %d", n, wantDials)
			}
		})
	}
}

func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestTransportReuseWaitsForRequestBody: a connection whose request body is
// still being written when the response ends is not reused.
func TestTransportReuseWaitsForRequestBody(t *testing.T) {
	up := newPipeUpstream(t, func(c *upstreamConn) {
		for {
			req, err := http.ReadRequest(c.br)
			if err != nil {
				return
			}
			if req.URL.Path == "/early" {
				// Answer before reading the body, then read it.
				_, _ = io.WriteString(c, okResponse)
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if req.URL.Path != "/early" {
				_, _ = io.WriteString(c, okResponse)
			}
		}
	})
	tr := up.transport(t)
	pr, pw := io.Pipe()
	defer pw.Close()
	req := newRequest(t, http.MethodPost, "/early", pr)
	if _, body, err := fetch(t, tr, req); err != nil || body != "ok" {
		t.Fatalf("early answer: %q, %v", body, err)
	}
	pw.Close()
	if _, body, err := fetch(t, tr, newRequest(t, http.MethodPost, "/next", strings.NewReader("x"))); err != nil || body != "ok" {
		t.Fatalf("next request: %q, %v", body, err)
	}
	if n := up.dials.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the first was answered while its body was still being written", n)
	}
}

func TestTransportRetry(t *testing.T) {
	// Each upstream connection answers its first request; what it does
	// with the second is the case's.
	type second int
	const (
		closeBeforeRequest second = iota // closed as the request goes out
		closeAfterRequest                // reads the request, answers nothing
		partialAnswer                    // answers a part of a status line
	)
	tests := []struct {
		name   string
		second second
		method string
		body   string
		header string
		retry  bool
	}{
		{name: "GET, closed before the request", second: closeBeforeRequest, method: http.MethodGet, retry: true},
		{name: "DELETE, closed before the request", second: closeBeforeRequest, method: http.MethodDelete, retry: true},
		// Found closed before it is used: see TestTransportWatchesIdle.
		{name: "POST with a body, closed before the request", second: closeBeforeRequest, method: http.MethodPost, body: "x", retry: true},
		{name: "GET, no answer", second: closeAfterRequest, method: http.MethodGet, retry: true},
		{name: "HEAD, no answer", second: closeAfterRequest, method: http.MethodHead, retry: true},
		{name: "DELETE, no answer", second: closeAfterRequest, method: http.MethodDelete},
		{name: "POST with an idempotency key, no answer", second: closeAfterRequest, method: http.MethodPost, header: "Idempotency-Key", retry: true},
		{name: "POST with a body, no answer", second: closeAfterRequest, method: http.MethodPost, body: "x"},
		{name: "GET, part of an answer", second: partialAnswer, method: http.MethodGet},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var received atomic.Int32 // second requests that reached an upstream
				up := newPipeUpstream(t, func(c *upstreamConn) {
					if _, _, err := c.readRequest(); err != nil {
						return
					}
					_, _ = io.WriteString(c, okResponse)
					if tc.second == closeBeforeRequest {
						return
					}
					if _, _, err := c.readRequest(); err != nil {
						return
					}
					received.Add(1)
					if tc.second == partialAnswer {
						_, _ = io.WriteString(c, "HTTP/1.1 2")
					}
				})
				tr := up.transport(t)
				if _, _, err := fetch(t, tr, newRequest(t, http.MethodGet, "/first", nil)); err != nil {
					t.Fatal(err)
				}
				// The upstream is done with the first request (and, for
				// closeBeforeRequest, with the connection).
				synctest.Wait()

				var body io.Reader
				if tc.body != "" {
					body = strings.NewReader(tc.body)
				}
				req := newRequest(t, tc.method, "/second", body)
				if tc.header != "" {
					req.Header.Set(tc.header, "k1")
				}
				res, _, err := fetch(t, tr, req)
				if tc.retry {
					if err != nil || res.StatusCode != http.StatusOK {
						t.Fatalf("request failed (%v); want it sent on a new connection", err)
					}
					if n := up.dials.Load(); n != 2 {
						t.Errorf("%d connections, want 2", n)
					}
					return
				}
				if err == nil {
					t.Fatalf("request succeeded with status %d on %d connections; want it failed, not repeated", res.StatusCode, up.dials.Load())
				}
				if n := up.dials.Load(); n != 1 {
					t.Errorf("%d connections, want 1: the request must not be repeated", n)
				}
			})
		})
	}

	t.Run("a new connection is not retried", func(t *testing.T) {
		up := newPipeUpstream(t, func(c *upstreamConn) { _, _, _ = c.readRequest() })
		if _, _, err := fetch(t, up.transport(t), newRequest(t, http.MethodGet, "/", nil)); err == nil {
			t.Fatal("request succeeded; want the upstream's hang-up")
		}
		if n := up.dials.Load(); n != 1 {
			t.Errorf("%d connections, want 1", n)
		}
	})
}

// TestTransportWatchesIdle: whatever arrives on a pooled connection while
// it is idle (the upstream's close, an extra response) takes it out of the
// pool and closes it at once, so that the next request neither meets the
// close nor reads the extra response as its answer.
func TestTransportWatchesIdle(t *testing.T) {
	tests := []struct {
		name   string
		idle   string // what the upstream does once it has answered
		method string
	}{
		{name: "GET after the upstream closed", idle: "close", method: http.MethodGet},
		{name: "POST after the upstream closed", idle: "close", method: http.MethodPost},
		{name: "GET after an extra response", idle: extraResponse, method: http.MethodGet},
		{name: "POST after an extra response", idle: extraResponse, method: http.MethodPost},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var posts atomic.Int32
				up := newPipeUpstream(t, func(c *upstreamConn) {
					for {
						req, _, err := c.readRequest()
						if err != nil {
							return
						}
						if req.Method == http.MethodPost {
							posts.Add(1)
						}
						_, _ = io.WriteString(c, okResponse)
						time.Sleep(time.Second)
						if tc.idle == "close" {
							return
						}
						_, _ = io.WriteString(c, tc.idle)
					}
				})
				tr := up.transport(t)
				if _, _, err := fetch(t, tr, newRequest(t, http.MethodGet, "/", nil)); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if n := tr.idleCount(); n != 0 {
					t.Fatalf("%d idle connections after the upstream's %s, want none", n, tc.idle)
				}
				var body io.Reader
				if tc.method == http.MethodPost {
					body = strings.NewReader("event")
				}
				if _, got, err := fetch(t, tr, newRequest(t, tc.method, "/", body)); err != nil || got != "ok" {
					t.Fatalf("%s: %q, %v; want the upstream's fresh answer", tc.method, got, err)
				}
				if d := up.dials.Load(); d != 2 {
					t.Errorf("%d connections, want 2", d)
				}
				if tc.method == http.MethodPost && posts.Load() != 1 {
					t.Errorf("the upstream received %d POSTs, want 1", posts.Load())
				}
			})
		})
	}
}

// extraResponse is an answer to no request, with a caller's cookie.
const extraResponse = "HTTP/1.1 200 OK\r\nSet-Cookie: session=previous-caller\r\nContent-Length: 8\r\n\r\nprevious"

func TestTransportIdleTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newPipeUpstream(t, serveAll(func(*http.Request, string) string { return okResponse }))
		tr := up.transport(t)
		for range 3 {
			if _, _, err := fetch(t, tr, newRequest(t, http.MethodGet, "/", nil)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(idleConnTimeout / 2)
		}
		if n := tr.idleCount(); n != 1 || up.dials.Load() != 1 {
			t.Fatalf("%d idle of %d connections; want the one kept while in use", n, up.dials.Load())
		}
		time.Sleep(idleConnTimeout / 2)
		synctest.Wait()
		if n := tr.idleCount(); n != 0 || up.closed.Load() != 1 {
			t.Errorf("after %s unused: %d idle, %d closed; want the connection closed", idleConnTimeout, n, up.closed.Load())
		}
		// The next request dials again.
		if _, _, err := fetch(t, tr, newRequest(t, http.MethodGet, "/", nil)); err != nil || up.dials.Load() != 2 {
			t.Errorf("request after the idle close: %v, %d connections; want 2", err, up.dials.Load())
		}
	})
}

// slowBody is a request body that takes d to arrive.
type slowBody struct {
	d    time.Duration
	done bool
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	time.Sleep(b.d)
	b.done = true
	return copy(p, "x"), nil
}

func TestTransportHeaderTimeout(t *testing.T) {
	const timeout = time.Minute
	tests := []struct {
		name    string
		upload  time.Duration // the request body's time to arrive; 0: no body
		early   bool          // the upstream answers before reading the body
		wait    time.Duration // the upstream's time to answer once it has read what it reads
		wantErr error
		elapsed time.Duration
	}{
		{name: "answer in time", upload: time.Second, wait: 59 * time.Second, elapsed: time.Minute},
		{name: "answer in time, no body", wait: 59 * time.Second, elapsed: 59 * time.Second},
		{name: "slow upload is not cut short", upload: 10 * time.Minute, wait: 59 * time.Second, elapsed: 10*time.Minute + 59*time.Second},
		{name: "no headers in time", upload: time.Second, wait: time.Hour, wantErr: errHeaderTimeout, elapsed: time.Second + timeout},
		{name: "no headers in time, no body", wait: time.Hour, wantErr: errHeaderTimeout, elapsed: timeout},
		{name: "answer before the request was written", upload: time.Hour, early: true, wait: 2 * time.Minute, elapsed: 2 * time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				up := newPipeUpstream(t, func(c *upstreamConn) {
					req, err := http.ReadRequest(c.br)
					if err != nil {
						return
					}
					if tc.early {
						time.Sleep(tc.wait)
					} else {
						_, _ = io.Copy(io.Discard, req.Body)
						// Wait, unless the client closes the connection.
						_ = c.SetReadDeadline(time.Now().Add(tc.wait))
						if _, err := c.br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
							return
						}
						_ = c.SetReadDeadline(time.Time{})
					}
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nbody")
					_, _ = io.Copy(io.Discard, req.Body)
				})
				var body io.Reader
				if tc.upload > 0 {
					body = &slowBody{d: tc.upload}
				}
				start := time.Now()
				res, err := up.transport(t).roundTrip(newRequest(t, http.MethodPost, "/", body), timeout, nil)
				if elapsed := time.Since(start); elapsed != tc.elapsed {
					t.Errorf("roundTrip took %s, want %s", elapsed, tc.elapsed)
				}
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("roundTrip error %v, want %v", err, tc.wantErr)
				}
				if err != nil {
					synctest.Wait()
					if up.closed.Load() != 1 {
						t.Error("the upstream's connection is open after the timeout")
					}
					return
				}
				// The timeout bounds the headers only: the body may take
				// as long as it takes.
				time.Sleep(time.Hour)
				b, err := io.ReadAll(res.Body)
				if err != nil || string(b) != "body" {
					t.Errorf("body read an hour later: %q, %v; want %q", b, err, "body")
				}
				res.Body.Close()
			})
		})
	}
}

func TestTransportCancel(t *testing.T) {
	for _, during := range []string{"head", "body"} {
		t.Run("during the response "+during, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				up := newPipeUpstream(t, func(c *upstreamConn) {
					if _, _, err := c.readRequest(); err != nil {
						return
					}
					if during == "body" {
						_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
					}
					_, _ = c.Read(make([]byte, 1)) // until the connection ends
				})
				tr := up.transport(t)
				ctx, cancel := context.WithCancel(t.Context())
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://up/", nil)
				time.AfterFunc(time.Second, cancel)
				res, err := tr.roundTrip(req, time.Minute, nil)
				if during == "body" {
					if err != nil {
						t.Fatal(err)
					}
					_, err = io.ReadAll(res.Body)
					res.Body.Close()
				}
				if !errors.Is(err, context.Canceled) {
					t.Errorf("error %v, want %v", err, context.Canceled)
				}
				synctest.Wait()
				if up.closed.Load() != 1 || tr.idleCount() != 0 {
					t.Errorf("after the cancel: %d connections closed, %d idle; want the connection closed", up.closed.Load(), tr.idleCount())
				}
			})
		})
	}
}

func TestTransportInformational(t *testing.T) {
	t.Run("103 passed on", func(t *testing.T) {
		up := newPipeUpstream(t, serveAll(func(*http.Request, string) string {
			return "HTTP/1.1 103 Early Hints\r\nLink: </app.css>; rel=preload\r\n\r\n" + okResponse
		}))
		w := &informedWriter{h: http.Header{}}
		res, err := up.transport(t).roundTrip(newRequest(t, http.MethodGet, "/", nil), 0, w)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("got %v, %v; want 200", res, err)
		}
		res.Body.Close()
		if want := "103 </app.css>; rel=preload"; len(w.got) != 1 || w.got[0] != want {
			t.Errorf("informational responses written %q, want [%q]", w.got, want)
		}
		if len(w.h) != 0 {
			t.Errorf("headers left for the final response: %v, want none", w.h)
		}
	})

	t.Run("unbounded 1xx", func(t *testing.T) {
		up := newPipeUpstream(t, func(c *upstreamConn) {
			if _, _, err := c.readRequest(); err != nil {
				return
			}
			for {
				if _, err := io.WriteString(c, "HTTP/1.1 102 Processing\r\n\r\n"); err != nil {
					return
				}
			}
		})
		if _, _, err := fetch(t, up.transport(t), newRequest(t, http.MethodGet, "/", nil)); err == nil {
			t.Error("endless 102 responses: no error")
		}
	})

	for _, tc := range []struct {
		name   string
		answer string // what the upstream sends once it has the head
		sent   bool   // whether the body must reach it
	}{
		{"100 continue", "HTTP/1.1 100 Continue\r\n\r\n", true},
		{"refused, connection closed", "HTTP/1.1 401 Unauthorized\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				got := make(chan string, 1)
				up := newPipeUpstream(t, func(c *upstreamConn) {
					req, err := http.ReadRequest(c.br)
					if err != nil {
						return
					}
					_, _ = io.WriteString(c, tc.answer)
					b, _ := io.ReadAll(req.Body)
					got <- string(b)
					if tc.sent {
						_, _ = io.WriteString(c, okResponse)
					}
				})
				req := newRequest(t, http.MethodPut, "/", strings.NewReader("payload"))
				req.Header.Set("Expect", "100-continue")
				start := time.Now()
				res, _, err := fetch(t, up.transport(t), req)
				if err != nil {
					t.Fatal(err)
				}
				if time.Since(start) >= expectContinue {
					t.Errorf("waited %s for the upstream's decision, which came at once", time.Since(start))
				}
				want := ""
				if tc.sent {
					want = "payload"
				}
				if b := <-got; b != want {
					t.Errorf("status %d; upstream received body %q, want %q", res.StatusCode, b, want)
				}
			})
		})
	}
}

// informedWriter records the 1xx responses written to it.
type informedWriter struct {
	h   http.Header
	got []string
}

func (w *informedWriter) Header() http.Header         { return w.h }
func (w *informedWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *informedWriter) WriteHeader(code int) {
	w.got = append(w.got, strconv.Itoa(code)+" "+w.h.Get("Link"))
}

func TestTransportUpgrade(t *testing.T) {
	up := newPipeUpstream(t, func(c *upstreamConn) {
		if _, _, err := c.readRequest(); err != nil {
			return
		}
		// Bytes of the new protocol may come with the head.
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nhello")
		_, _ = io.Copy(c, c.br) // echo
	})
	tr := up.transport(t)
	req := newRequest(t, http.MethodGet, "/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	res, err := tr.roundTrip(req, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	rwc, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("101 body is %T, want an io.ReadWriteCloser", res.Body)
	}
	// A safety net: a read that would wait forever fails instead.
	defer time.AfterFunc(streamWait, func() { rwc.Close() }).Stop()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(rwc, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v; want the bytes that came with the head", buf, err)
	}
	if _, err := io.WriteString(rwc, "ping"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rwc, buf[:4]); err != nil || string(buf[:4]) != "ping" {
		t.Fatalf("echo %q, %v", buf[:4], err)
	}
	rwc.Close()
	up.wg.Wait()
	if tr.idleCount() != 0 {
		t.Error("an upgraded connection went back to the pool")
	}
}

// TestTransportHeadLimits: response heads are bounded in bytes and in
// fields, the 1xx heads of an exchange together with the final one, and a
// head beyond either bound fails the exchange with ErrBadResponse before
// the parser holds it.
func TestTransportHeadLimits(t *testing.T) {
	field := func(i int) string { return fmt.Sprintf("X-F%d: v\r\n", i) }
	fields := func(from, n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString(field(from + i))
		}
		return b.String()
	}
	big := "X-Big: " + strings.Repeat("a", MaxHeadBytes-200) + "\r\n"
	tests := []struct {
		name   string
		answer string
		ok     bool
	}{
		{"fields at the bound", "HTTP/1.1 200 OK\r\n" + fields(0, MaxHeadFields-1) + "Content-Length: 2\r\n\r\nok", true},
		{"one field too many", "HTTP/1.1 200 OK\r\n" + fields(0, MaxHeadFields) + "Content-Length: 2\r\n\r\nok", false},
		{"bytes at the bound", "HTTP/1.1 200 OK\r\n" + big + "Content-Length: 2\r\n\r\nok", true},
		{"bytes beyond the bound", "HTTP/1.1 200 OK\r\n" + big + strings.Repeat("X-A: b\r\n", 40) + "Content-Length: 2\r\n\r\nok", false},
		{"1xx heads count with the final one", "HTTP/1.1 103 Early Hints\r\n" + fields(0, MaxHeadFields/2) + "\r\n" +
			"HTTP/1.1 200 OK\r\n" + fields(MaxHeadFields/2, MaxHeadFields/2) + "Content-Length: 2\r\n\r\nok", false},
		{"a body of many lines is no head", "HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + strings.Repeat("\n", 2000), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newPipeUpstream(t, func(c *upstreamConn) {
				if _, _, err := c.readRequest(); err != nil {
					return
				}
				_, _ = io.WriteString(c, tc.answer)
				_, _ = io.Copy(io.Discard, c)
			})
			tr := up.transport(t)
			res, _, err := fetch(t, tr, newRequest(t, http.MethodGet, "/", nil))
			if tc.ok {
				if err != nil || res.StatusCode != http.StatusOK {
					t.Fatalf("got %v; want the answer", err)
				}
				return
			}
			if !errors.Is(err, ErrBadResponse) {
				t.Fatalf("got %v, want ErrBadResponse", err)
			}
			up.wg.Wait() // the connection was closed
		})
	}

	t.Run("endless heads are not read", func(t *testing.T) {
		var sent atomic.Int64
		up := newPipeUpstream(t, func(c *upstreamConn) {
			if _, _, err := c.readRequest(); err != nil {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
			for i := 0; ; i++ {
				n, err := io.WriteString(c, field(i))
				sent.Add(int64(n))
				if err != nil {
					return
				}
			}
		})
		if _, _, err := fetch(t, up.transport(t), newRequest(t, http.MethodGet, "/", nil)); !errors.Is(err, ErrBadResponse) {
			t.Fatalf("got %v, want ErrBadResponse", err)
		}
		up.wg.Wait()
		if n := sent.Load(); n > 2*MaxHeadBytes {
			t.Errorf("read %d bytes of head; want the read stopped near the bound", n)
		}
	})
}

// shrinkingConn counts the transport's calls to Shrink.
type shrinkingConn struct {
	net.Conn
	shrunk *atomic.Int32
}

func (c shrinkingConn) Shrink() { c.shrunk.Add(1) }

// A connection that can give back its buffers (a tunnel stream) is shrunk
// each time it becomes idle, and not while it carries a request.
func TestTransportShrinksIdleConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var shrunk atomic.Int32
		up := newPipeUpstream(t, serveAll(func(*http.Request, string) string { return okResponse }))
		tr := up.transport(t)
		dial := tr.dial
		tr.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return shrinkingConn{Conn: c, shrunk: &shrunk}, nil
		}
		for i := range 3 {
			if _, _, err := fetch(t, tr, newRequest(t, http.MethodGet, "/", nil)); err != nil {
				t.Fatal(err)
			}
			if n, want := shrunk.Load(), int32(i+1); n != want || tr.idleCount() != 1 {
				t.Fatalf("after request %d: shrunk %d times, %d idle; want %d and 1", i+1, n, tr.idleCount(), want)
			}
		}
		if d := up.dials.Load(); d != 1 {
			t.Errorf("%d connections for 3 requests, want 1: a shrunk connection is still reused", d)
		}
	})
}
