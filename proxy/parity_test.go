package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"sync"
	"testing"
	"time"
)

// The differential suite: hostile upstream behaviours go through
// net/http.Transport behind httputil.ReverseProxy, the standard library's
// reverse proxy, and through the router, over TCP and over tunnel streams,
// and each must give its callers the same safe outcome: what the caller
// gets, what the next caller gets on the connection the first one used
// (its own fresh answer, never the previous caller's), and whether the
// connection was closed. Where the standard library knows no bound
// (header fields; 1xx responses behind ReverseProxy) or nothing of tether
// (X-Tether-*), the router is stricter, and the case says how.

// Answers of the hostile upstream, and what it answers a next caller.
const (
	// previous is in every answer meant for the first caller: the next
	// caller must never see it.
	previous      = "HTTP/1.1 200 OK\r\nSet-Cookie: session=first-caller\r\nContent-Length: 8\r\n\r\nprevious"
	freshAnswer   = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh"
	okThenPrev    = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + previous
	nextPath      = "/next"
	hostileHeader = "X-Hostile"
)

// hostileCase is one behaviour of an upstream toward the first caller.
type hostileCase struct {
	name   string
	method string      // of the first request; GET if empty
	header http.Header // of the first request
	// answer is what the upstream writes once it has read the first
	// request; then, once the first caller has its answer, later (while
	// the connection is idle).
	answer, later string
	// endless is written after the answer for as long as the connection
	// takes it.
	endless string
	// pipe: after the answer the upstream reads raw bytes, as a switched
	// protocol would, and answers any with previous.
	pipe bool
	// anyClose: the case holds whether or not the front closes the
	// connection.
	anyClose bool
	// cutShort: the answer ends early; the caller gets it cut short or not
	// at all (status 0), either will do.
	cutShort bool

	want outcome // through both
	// router, when set, is the router's outcome where it is stricter than
	// the standard library's; stricter says how.
	router   *outcome
	stricter string
}

// outcome is what callers saw.
type outcome struct {
	status int  // the first caller's status; 0: no response at all
	cut    bool // its body was cut short
	// header: the value of hostileHeader, or of X-Tether-Error when the
	// case sets a fake one, in the first caller's answer.
	header string
	closed bool // the upstream saw the first connection closed
}

func hostileCases() []hostileCase {
	shortFields := strings.Repeat("X-F: v\r\n", (MaxHeadBytes-1024)/len("X-F: v\r\n"))
	return []hostileCase{
		{
			name:   "huge head in bytes",
			answer: "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 1<<20) + "\r\nContent-Length: 2\r\n\r\nok",
			want:   outcome{status: http.StatusBadGateway, closed: true},
		},
		{
			name:     "huge head in fields",
			answer:   "HTTP/1.1 200 OK\r\n" + shortFields + "Content-Length: 2\r\n\r\nok",
			want:     outcome{status: http.StatusOK},
			router:   &outcome{status: http.StatusBadGateway, closed: true},
			stricter: "net/http bounds a head in bytes only; the router also in fields",
		},
		{
			name:   "junk after a response",
			answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\x00\x01junk\r\n\r\n",
			want:   outcome{status: http.StatusOK, closed: true},
		},
		{
			name:   "a response after the response",
			answer: okThenPrev,
			want:   outcome{status: http.StatusOK, closed: true},
		},
		{
			name:   "an extra response while idle",
			answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
			later:  previous,
			want:   outcome{status: http.StatusOK, closed: true},
		},
		{
			// Answered before the request body was read, which the
			// upstream reads afterwards: a front may keep the connection
			// or not.
			name:     "an early response",
			method:   http.MethodPost,
			answer:   "HTTP/1.1 202 Accepted\r\nContent-Length: 5\r\n\r\nearly",
			anyClose: true,
			want:     outcome{status: http.StatusAccepted},
		},
		{
			// The caller gets the answer cut short, or none at all when the
			// front had not sent the head yet as the body ended.
			name:     "Content-Length longer than the body",
			answer:   "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
			cutShort: true,
			want:     outcome{closed: true},
		},
		{
			name:   "Content-Length shorter than the body",
			answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokay, and more" + previous,
			want:   outcome{status: http.StatusOK, closed: true},
		},
		{
			name:   "HEAD with a body",
			method: http.MethodHead,
			answer: "HTTP/1.1 200 OK\r\nContent-Length: " + fmt.Sprint(len(previous)) + "\r\n\r\n" + previous,
			want:   outcome{status: http.StatusOK, closed: true},
		},
		{
			name:   "204 with a body",
			answer: "HTTP/1.1 204 No Content\r\n\r\n" + previous,
			want:   outcome{status: http.StatusNoContent, closed: true},
		},
		{
			name:   "304 with a body",
			answer: "HTTP/1.1 304 Not Modified\r\nContent-Length: 8\r\n\r\n" + previous,
			want:   outcome{status: http.StatusNotModified, closed: true},
		},
		{
			name:   "bare 101 to a plain request",
			answer: "HTTP/1.1 101 Switching Protocols\r\n\r\n",
			pipe:   true,
			want:   outcome{status: http.StatusBadGateway, closed: true},
		},
		{
			name:     "101 to another protocol than asked",
			header:   http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}},
			answer:   "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
			pipe:     true,
			want:     outcome{status: http.StatusBadGateway},
			router:   &outcome{status: http.StatusBadGateway, closed: true},
			stricter: "ReverseProxy answers 502 but leaves the switched connection to the upstream open; the router closes it",
		},
		{
			name:     "endless 1xx",
			answer:   "HTTP/1.1 102 Processing\r\n\r\n",
			endless:  "HTTP/1.1 102 Processing\r\n\r\n",
			want:     outcome{status: 0, closed: true},
			router:   &outcome{status: http.StatusBadGateway, closed: true},
			stricter: "ReverseProxy passes 1xx on without bound and the caller gives up; the router ends the exchange with 502",
		},
		{
			name:   "garbage head",
			answer: "HELLO WORLD\r\n\r\n",
			want:   outcome{status: http.StatusBadGateway, closed: true},
		},
		{
			name:   "fake X-Tether headers",
			answer: "HTTP/1.1 503 Service Unavailable\r\nX-Tether-Error: tunnel_down\r\nX-Tether-Peer-Miss: 1\r\nContent-Length: 4\r\n\r\ndown",
			want:   outcome{status: http.StatusServiceUnavailable, header: "tunnel_down"},
			router: &outcome{status: http.StatusServiceUnavailable},
			stricter: "net/http passes every header on; the router never takes tether's own from an upstream, " +
				"where it would pass for tether's error or make a replica try another",
		},
	}
}

// fronts are what the hostile upstream is reached through: net/http's
// transport behind httputil.ReverseProxy, and the router.
var fronts = []struct {
	name   string
	router bool
	dial   func(testing.TB) DialFunc // the router's; nil: a net.Dialer
}{
	{name: "net/http"},
	{name: "router over tcp", router: true, dial: func(testing.TB) DialFunc { return nil }},
	{name: "router over tunnel streams", router: true, dial: streamDial},
}

func TestParityWithNetHTTP(t *testing.T) {
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range fronts {
				t.Run(f.name, func(t *testing.T) {
					t.Parallel()
					up := newHostileUpstream(t, tc)
					var front *httptest.Server
					if f.router {
						front = newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.url())}}, nil, Options{DialContext: f.dial(t)}).front
					} else {
						front = reverseProxyFront(t, up.url())
					}
					want := tc.want
					if f.router && tc.router != nil {
						want = *tc.router
					}
					got := up.run(t, tc, front.URL, want.closed)
					if tc.anyClose {
						got.closed = want.closed
					}
					if tc.cutShort && got.cut {
						got.status, got.cut = 0, false
					}
					if got != want {
						t.Errorf("got %+v, want %+v", got, want)
						if tc.stricter != "" {
							t.Logf("the router is stricter here: %s", tc.stricter)
						}
					}
				})
			}
		})
	}
}

// reverseProxyFront serves httputil.ReverseProxy over net/http.Transport,
// with the router's head bound in bytes, in front of upstream.
func reverseProxyFront(t testing.TB, upstream string) *httptest.Server {
	t.Helper()
	u := mustURL(t, upstream)
	tr := &http.Transport{MaxResponseHeaderBytes: MaxHeadBytes, Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	rp := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		Transport: tr,
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	return serveFront(t, rp)
}

// hostileUpstream plays a case's upstream on loopback TCP.
type hostileUpstream struct {
	ln       net.Listener
	tc       hostileCase
	answered chan struct{} // closed once the first caller has its answer
	wg       sync.WaitGroup

	mu        sync.Mutex
	conns     map[net.Conn]bool
	first     net.Conn // the connection that carried the first request
	closed    map[net.Conn]bool
	tunnelled bool // bytes came after a switch that was not made
}

func newHostileUpstream(t *testing.T, tc hostileCase) *hostileUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &hostileUpstream{ln: ln, tc: tc, answered: make(chan struct{}),
		conns: map[net.Conn]bool{}, closed: map[net.Conn]bool{}}
	u.wg.Go(u.accept)
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		for c := range u.conns {
			c.Close()
		}
		u.mu.Unlock()
		u.wg.Wait()
	})
	return u
}

func (u *hostileUpstream) url() string { return "http://" + u.ln.Addr().String() }

func (u *hostileUpstream) accept() {
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.conns[c] = true
		u.mu.Unlock()
		u.wg.Go(func() { u.serve(c) })
	}
}

// serve answers the requests of one connection until it ends.
func (u *hostileUpstream) serve(c net.Conn) {
	defer func() {
		c.Close()
		u.mu.Lock()
		u.closed[c] = true
		u.mu.Unlock()
	}()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.URL.Path == nextPath {
			_, _ = io.Copy(io.Discard, req.Body)
			if _, err := io.WriteString(c, freshAnswer); err != nil {
				return
			}
			continue
		}
		u.mu.Lock()
		u.first = c
		u.mu.Unlock()
		if req.Method != http.MethodPost {
			_, _ = io.Copy(io.Discard, req.Body)
		}
		if _, err := io.WriteString(c, u.tc.answer); err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		switch {
		case u.tc.endless != "":
			for {
				if _, err := io.WriteString(c, u.tc.endless); err != nil {
					return
				}
			}
		case u.tc.pipe:
			if _, err := br.ReadByte(); err != nil {
				return
			}
			u.mu.Lock()
			u.tunnelled = true
			u.mu.Unlock()
			_, _ = io.WriteString(c, previous)
		case u.tc.later != "":
			select {
			case <-u.answered:
			case <-time.After(time.Minute):
			}
			if _, err := io.WriteString(c, u.tc.later); err != nil {
				return
			}
		case strings.HasPrefix(u.tc.answer, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n"):
			return // the body is cut short
		}
	}
}

// run makes the first caller's request and the next caller's through front
// and returns what they saw, waiting for the first connection's close if
// closes. It fails the test if the next caller did not get its own fresh
// answer, or if anything reached the upstream after a protocol switch that
// was refused.
func (u *hostileUpstream) run(t *testing.T, tc hostileCase, front string, closes bool) outcome {
	t.Helper()
	// The caller gives up on 1xx heads beyond the router's bound, as a
	// browser would give up sooner or later.
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxResponseHeaderBytes: MaxHeadBytes}}
	t.Cleanup(client.CloseIdleConnections)
	var got outcome
	method := tc.method
	if method == "" {
		method = http.MethodGet
	}
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("upload")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, front+"/first", body)
	for k, v := range tc.header {
		req.Header[k] = v
	}
	req.Header.Set("Cookie", "session=first-caller")
	res, err := client.Do(req)
	if err == nil {
		got.status = res.StatusCode
		got.header = res.Header.Get(hostileHeader) + res.Header.Get(ErrorHeader)
		if got.status == http.StatusBadGateway {
			got.header = "" // each front's own error
		}
		if _, err := io.ReadAll(res.Body); err != nil {
			got.cut = true
		}
		res.Body.Close()
	}
	close(u.answered)

	// The front closes the first connection at once, once what it
	// expects (a late extra response) has come; or keeps it.
	u.mu.Lock()
	first := u.first
	u.mu.Unlock()
	if first != nil {
		deadline := time.Now().Add(10 * time.Second)
		for {
			u.mu.Lock()
			got.closed = u.closed[first]
			u.mu.Unlock()
			if got.closed || !closes || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got.status != 0 && !got.cut {
		// Another caller, on the connection the first one used if it was
		// kept, and so on whatever the front kept for the upstream.
		next := u.next(t, client, front)
		if next != "fresh" {
			t.Errorf("the next caller got %q, want its own fresh answer", next)
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.tunnelled {
		t.Errorf("bytes reached the upstream through a protocol switch that was not asked for")
	}
	return got
}

// next makes the next caller's request and returns its body, or what went
// wrong.
func (u *hostileUpstream) next(t *testing.T, client *http.Client, front string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front+nextPath, nil)
	res, err := client.Do(req)
	if err != nil {
		return "error: " + err.Error()
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		return "error: " + err.Error()
	}
	if c := res.Header.Get("Set-Cookie"); c != "" {
		return fmt.Sprintf("%d %q with Set-Cookie %q", res.StatusCode, b, c)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Sprintf("%d %q", res.StatusCode, b)
	}
	return string(b)
}
