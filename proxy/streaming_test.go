package proxy

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// streamWait bounds waits that only a broken router would reach, so that a
// regression fails with a message instead of hanging the test binary.
const streamWait = 20 * time.Second

// recvWithin receives from ch or fails the test after streamWait.
func recvWithin[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(streamWait):
		t.Fatalf("%s: nothing within %s; the router is buffering", what, streamWait)
		panic("unreachable")
	}
}

func TestServerSentEvents(t *testing.T) {
	next := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: two\n\n")
	}))
	t.Cleanup(up.Close)

	for _, dialer := range dialers {
		for _, timeout := range []time.Duration{0, time.Minute} {
			t.Run(dialer.name+"/timeout="+timeout.String(), func(t *testing.T) {
				route := Route{Prefix: "/workflows", Upstream: mustURL(t, up.URL+"/"), Timeout: timeout}
				tr := newTestRouter(t, []Route{route}, nil, Options{DialContext: dialer.dial(t)})
				req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, tr.front.URL+"/workflows/api/v1/workflow-events/argo", nil)
				if err != nil {
					t.Fatal(err)
				}
				res, err := tr.client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				events := make(chan string, 2)
				go readEvents(res.Body, events)

				// The upstream holds the second event until the first has
				// reached the caller: a buffering router never delivers it.
				if got := recvWithin(t, events, "first event"); got != "data: one" {
					t.Fatalf("first event %q, want %q", got, "data: one")
				}
				next <- struct{}{}
				if got := recvWithin(t, events, "second event"); got != "data: two" {
					t.Fatalf("second event %q, want %q", got, "data: two")
				}
			})
		}
	}
}

// A tunnel stream's response is read through a reader of waiterBufSize: a
// head line longer than that, and chunks whose size lines and data straddle
// its edges, arrive whole, over either dialer.
func TestResponsesLargerThanTheReader(t *testing.T) {
	long := strings.Repeat("v", 3*waiterBufSize)
	var chunks []string
	for i, n := range []int{1, waiterBufSize - 7, waiterBufSize, waiterBufSize + 3, 5 * waiterBufSize} {
		chunks = append(chunks, strings.Repeat(string(rune('a'+i)), n))
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Long", long)
		rc := http.NewResponseController(w)
		for _, c := range chunks {
			_, _ = io.WriteString(w, c)
			_ = rc.Flush() // one chunk each
		}
	}))
	t.Cleanup(up.Close)
	for _, dialer := range dialers {
		t.Run(dialer.name, func(t *testing.T) {
			tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{DialContext: dialer.dial(t)})
			for range 2 { // on a new connection, then on the kept-alive one
				res, body := tr.get(t, "/chunks", nil)
				if res.StatusCode != http.StatusOK || res.Header.Get("X-Long") != long {
					t.Fatalf("status %d, X-Long of %d bytes; want 200 and the upstream's %d", res.StatusCode, len(res.Header.Get("X-Long")), len(long))
				}
				if want := strings.Join(chunks, ""); body != want {
					t.Fatalf("body of %d bytes, want the upstream's %d chunks, %d bytes", len(body), len(chunks), len(want))
				}
			}
		})
	}
}

// TestStreamHeadBeforeBody: a stream's head reaches the caller as soon as
// the upstream sent it, before any of its body. An event stream often sends
// nothing until something happens, and a caller (a browser's EventSource,
// a watch client with a timeout on its response) waits for the head.
func TestStreamHeadBeforeBody(t *testing.T) {
	for _, tc := range []struct{ name, contentType string }{
		{"event stream", "text/event-stream"},
		{"body of unknown length", "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headSeen := make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				w.WriteHeader(http.StatusOK)
				http.NewResponseController(w).Flush()
				select {
				case <-headSeen:
				case <-r.Context().Done():
					return
				}
				fmt.Fprint(w, "data: after the head\n\n")
			}))
			t.Cleanup(up.Close)
			tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL), Timeout: time.Minute}}, nil, Options{})
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, tr.front.URL+"/watch", nil)
			if err != nil {
				t.Fatal(err)
			}
			type head struct {
				res *http.Response
				err error
			}
			heads := make(chan head, 1)
			go func() {
				res, err := tr.client.Do(req)
				heads <- head{res, err}
			}()
			// The upstream sends its body only once the caller has the
			// head: a router that holds the head back until the first body
			// byte never delivers either.
			h := recvWithin(t, heads, "response head")
			if h.err != nil {
				t.Fatalf("GET /watch: %v", h.err)
			}
			res := h.res
			defer res.Body.Close()
			close(headSeen)
			if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != tc.contentType {
				t.Fatalf("head: status %d, Content-Type %q; want 200, %q", res.StatusCode, res.Header.Get("Content-Type"), tc.contentType)
			}
			body, err := io.ReadAll(res.Body)
			if err != nil || string(body) != "data: after the head\n\n" {
				t.Fatalf("body %q (%v), want the event sent after the head", body, err)
			}
		})
	}
}

// readEvents sends each server-sent event read from r to events, then
// closes it.
func readEvents(r io.Reader, events chan<- string) {
	defer close(events)
	sc := bufio.NewScanner(r)
	var ev []string
	for sc.Scan() {
		if sc.Text() != "" {
			ev = append(ev, sc.Text())
			continue
		}
		events <- strings.Join(ev, "\n")
		ev = nil
	}
}

func TestWebsocket(t *testing.T) {
	up := httptest.NewServer(websocket.Handler(func(c *websocket.Conn) {
		_, _ = io.Copy(c, c)
	}))
	t.Cleanup(up.Close)

	tests := []struct {
		name  string
		route Route
		path  string
	}{
		{"kept prefix", Route{Prefix: "/argo-cd", Upstream: mustURL(t, up.URL)}, "/argo-cd/terminal"},
		{"stripped prefix with timeout", Route{Prefix: "/workflows", Upstream: mustURL(t, up.URL+"/"), Timeout: time.Minute}, "/workflows/ws"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTestRouter(t, []Route{tc.route}, nil, Options{})
			wsURL := "ws" + strings.TrimPrefix(tr.front.URL, "http") + tc.path
			c, err := websocket.Dial(wsURL, "", tr.front.URL)
			if err != nil {
				t.Fatalf("websocket dial %s: %v", wsURL, err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(streamWait))
			for _, msg := range []string{"hello", "through the tunnel"} {
				if err := websocket.Message.Send(c, msg); err != nil {
					t.Fatalf("send %q: %v", msg, err)
				}
				var got string
				if err := websocket.Message.Receive(c, &got); err != nil {
					t.Fatalf("receive: %v", err)
				}
				if got != msg {
					t.Errorf("echo %q, want %q", got, msg)
				}
			}
		})
	}
}

func TestChunkedUploadStreams(t *testing.T) {
	gotFirst := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, first); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		gotFirst <- string(first)
		rest, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s%s %v", first, rest, r.TransferEncoding)
	}))
	t.Cleanup(up.Close)
	tr := newTestRouter(t, []Route{{Prefix: "/webhooks", Upstream: mustURL(t, up.URL+"/"), Timeout: time.Minute}}, nil, Options{})

	pr, pw := io.Pipe()
	defer pw.Close() // ends the request if the test fails half-way
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tr.front.URL+"/webhooks/push", pr)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		res  *http.Response
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		res, err := tr.client.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		done <- result{res: res, body: string(b), err: err}
	}()

	if _, err := io.WriteString(pw, "hello"); err != nil {
		t.Fatal(err)
	}
	// The rest of the body is not sent until the upstream has the start.
	if got := recvWithin(t, gotFirst, "first upload chunk at the upstream"); got != "hello" {
		t.Fatalf("upstream received %q first, want %q", got, "hello")
	}
	if _, err := io.WriteString(pw, ", world"); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	r := recvWithin(t, done, "response")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if want := "hello, world [chunked]"; r.body != want {
		t.Errorf("upstream echoed %q, want %q", r.body, want)
	}
}

// TestExpectContinue checks that "Expect: 100-continue" works through the
// router: the caller sends its body only after a 100 Continue, which must
// come back through the hop (curl sends it for bodies over 1 MiB).
func TestExpectContinue(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s", r.Header.Get("Expect"), b)
	}))
	t.Cleanup(up.Close)
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL), Timeout: time.Minute}}, nil, Options{})
	// The client waits for 100 Continue for an hour: without one, the test
	// fails on its wait below rather than passing late.
	transport := &http.Transport{ExpectContinueTimeout: time.Hour}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tr.front.URL+"/upload", strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Expect", "100-continue")
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		res, err := client.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		done <- result{string(b), err}
	}()
	r := recvWithin(t, done, "response to an Expect: 100-continue upload")
	if r.err != nil || r.body != "100-continue payload" {
		t.Errorf("got %q, %v; want %q", r.body, r.err, "100-continue payload")
	}
}

// TestFullDuplex checks that an upstream may answer while the request body
// still streams in: each line sent is echoed before the next is written.
func TestFullDuplex(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			t.Errorf("upstream: enable full duplex: %v", err)
		}
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		sc := bufio.NewScanner(r.Body)
		for sc.Scan() {
			fmt.Fprintln(w, "echo "+sc.Text())
			_ = rc.Flush()
		}
	}))
	t.Cleanup(up.Close)
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{})

	lines := make(chan string)
	// Runs last: once the body is closed, the reader ends.
	defer func() {
		for range lines {
		}
	}()
	pr, pw := io.Pipe()
	defer pw.Close()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tr.front.URL+"/stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	// Without full duplex, a hop holds the response headers until the body
	// ends, so Do itself would block.
	go func() {
		defer close(lines)
		res, err := tr.client.Do(req)
		if err != nil {
			t.Errorf("POST /stream: %v", err)
			return
		}
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for i := range 3 {
		msg := "ping " + strconv.Itoa(i)
		if _, err := io.WriteString(pw, msg+"\n"); err != nil {
			t.Fatal(err)
		}
		if got := recvWithin(t, lines, "echo of "+msg); got != "echo "+msg {
			t.Fatalf("got %q, want %q", got, "echo "+msg)
		}
	}
}

// pattern is a reader of n generated bytes, so large bodies need no memory.
type pattern struct{ n, off int64 }

func (p *pattern) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off)]
	for i := range b {
		x := p.off + int64(i)
		b[i] = byte(x ^ x>>11)
	}
	p.off += int64(len(b))
	return len(b), nil
}

func sumOf(r io.Reader) (int64, string, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return n, hex.EncodeToString(h.Sum(nil)), err
}

// TestLargeBodies moves a 64 MiB body each way through the router, over
// each of the dialers, and checks that nothing buffers a body whole or
// copies it in small pieces.
func TestLargeBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 256 MiB")
	}
	const size = 64 << 20
	want, wantSum, _ := sumOf(&pattern{n: size})

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPut:
			n, sum, err := sumOf(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fmt.Fprintf(w, "%d %s", n, sum)
		case http.MethodGet:
			w.Header().Set("Content-Length", strconv.Itoa(size))
			_, _ = io.Copy(w, &pattern{n: size})
		}
	}))
	t.Cleanup(up.Close)
	for _, dialer := range dialers {
		t.Run(dialer.name, func(t *testing.T) {
			tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{DialContext: dialer.dial(t)})

			var before runtime.MemStats
			runtime.ReadMemStats(&before)

			// Upload, chunked: the body's length is unknown to the client.
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, tr.front.URL+"/upload", io.MultiReader(&pattern{n: size}))
			if err != nil {
				t.Fatal(err)
			}
			res, body := tr.do(t, req)
			if res.StatusCode != http.StatusOK || body != fmt.Sprintf("%d %s", want, wantSum) {
				t.Errorf("upload: status %d, upstream received %q, want %d bytes with sha256 %s", res.StatusCode, body, want, wantSum)
			}

			// Download.
			req, err = http.NewRequestWithContext(t.Context(), http.MethodGet, tr.front.URL+"/download", nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err = tr.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			n, sum, err := sumOf(res.Body)
			res.Body.Close()
			if err != nil || n != want || sum != wantSum {
				t.Errorf("download: got %d bytes with sha256 %s (%v), want %d with %s", n, sum, err, want, wantSum)
			}

			// 128 MiB went through three HTTP hops; buffering either body
			// whole would allocate at least its size, and so would copying
			// it in pieces of a few KiB under -race, where pooled buffers
			// are often dropped.
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("allocated %d KiB", alloc>>10)
			if alloc > size/4 {
				t.Errorf("allocated %d MiB moving two %d MiB bodies, want under %d MiB: something buffers",
					alloc>>20, size>>20, size>>22)
			}
		})
	}
}
