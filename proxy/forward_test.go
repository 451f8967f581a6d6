package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
)

// TestRouterTrailers checks that trailers pass both ways: the caller's
// request trailers reach the upstream, the upstream's response trailers
// reach the caller, announced in advance or not.
func TestRouterTrailers(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Trailer", "X-Announced")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "%s sum=%s", body, r.Trailer.Get("X-Sum"))
		w.Header().Set("X-Announced", "a")
		w.Header().Set(http.TrailerPrefix+"X-Late", "b")
	}))
	t.Cleanup(up.Close)
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{})

	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tr.front.URL+"/", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Trailer = http.Header{"X-Sum": nil}
	go func() {
		_, _ = io.WriteString(pw, "data")
		req.Trailer.Set("X-Sum", "42") // set before the body ends, as the docs say
		pw.Close()
	}()
	res, body := tr.do(t, req)
	if body != "data sum=42" {
		t.Errorf("upstream answered %q, want %q: the request trailer did not arrive", body, "data sum=42")
	}
	if a, l := res.Trailer.Get("X-Announced"), res.Trailer.Get("X-Late"); a != "a" || l != "b" {
		t.Errorf("response trailers %v, want X-Announced=a and X-Late=b", res.Trailer)
	}
}

// TestRouterEarlyHints checks that 1xx responses reach the caller before the
// final one.
func TestRouterEarlyHints(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		fmt.Fprint(w, "page")
	}))
	t.Cleanup(up.Close)
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{})

	var hints []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, fmt.Sprint(code, " ", h.Get("Link")))
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodGet, tr.front.URL+"/", nil)
	res, body := tr.do(t, req)
	if res.StatusCode != http.StatusOK || body != "page" {
		t.Errorf("got %d %q, want 200 page", res.StatusCode, body)
	}
	if want := "103 </app.css>; rel=preload"; len(hints) != 1 || hints[0] != want {
		t.Errorf("caller saw informational responses %q, want [%q]", hints, want)
	}
	if link := res.Header.Get("Link"); link != "" {
		t.Errorf("final response carries the early hint's Link %q, want none", link)
	}
}

// TestRouterQuery checks that a query the upstream could read differently
// from Go's server (";" separators, bad escapes) loses the parameters Go
// could not parse, as ReverseProxy does, and that any other passes
// unchanged.
func TestRouterQuery(t *testing.T) {
	up := echoUpstream(t, "up")
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{})
	for query, want := range map[string]string{
		"b=2&a=1&c=%41+x": "b=2&a=1&c=%41+x",
		"a=1;admin=true":  "",
		"a=1&b=%zz&c=3":   "a=1&c=3",
		"a=1&b=%4":        "a=1",
	} {
		wantURI := "/x"
		if want != "" {
			wantURI += "?" + want
		}
		if got := tr.getSeen(t, "/x?"+query, nil).RequestURI; got != wantURI {
			t.Errorf("query %q reached the upstream as %q, want %q", query, got, wantURI)
		}
	}
}

// TestRouterUpgradeMismatch: an upstream that switches to another protocol
// than the one asked for gets no connection to the caller.
func TestRouterUpgradeMismatch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
		_, _ = c.Read(make([]byte, 1))
	}()
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, "http://"+ln.Addr().String())}}, nil, Options{})
	res, _ := tr.get(t, "/ws", http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}})
	if res.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502", res.StatusCode)
	}
}

func TestCallerBodyClosed(t *testing.T) {
	b := &callerBody{r: io.NopCloser(strings.NewReader("data"))}
	p := make([]byte, 2)
	if n, err := b.Read(p); n != 2 || err != nil {
		t.Fatalf("read before Close: %d, %v", n, err)
	}
	b.Close()
	if _, err := b.Read(p); !errors.Is(err, errBodyAfterHandler) {
		t.Errorf("read after Close: %v, want %v", err, errBodyAfterHandler)
	}
}

// TestRouterFiltersRequestTrailers: a caller's trailers follow the rules of
// its header fields: one that speaks for a proxy or for tether (forwarding
// fields, which the server's entry vouches for in the head only; hop-by-hop
// fields; X-Tether-*) never reaches the upstream, in any case or spelling.
func TestRouterFiltersRequestTrailers(t *testing.T) {
	got := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		got <- r.Trailer
	}))
	t.Cleanup(up.Close)
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{})

	sent := http.Header{
		"X-Sum":               {"42"},
		"X-Forwarded-For":     {"10.0.0.1"},
		"X-Forwarded_prefix":  {"/admin"},
		"Forwarded":           {"for=10.0.0.1"},
		"X-Real-Ip":           {"10.0.0.1"},
		"X-Tether-Peer-Auth":  {"forged"},
		"Proxy-Authorization": {"Basic x"},
	}
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tr.front.URL+"/", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Trailer = http.Header{}
	for k := range sent {
		req.Trailer[k] = nil
	}
	go func() {
		_, _ = io.WriteString(pw, "data")
		for k, v := range sent {
			req.Trailer[k] = v
		}
		pw.Close()
	}()
	if res, body := tr.do(t, req); res.StatusCode != http.StatusOK {
		t.Fatalf("got %d %q", res.StatusCode, body)
	}
	trailer := <-got
	if v := trailer.Get("X-Sum"); v != "42" {
		t.Errorf("trailer X-Sum = %q, want 42: an ordinary trailer passes", v)
	}
	for k := range sent {
		if k != "X-Sum" && trailer.Get(k) != "" {
			t.Errorf("the caller's trailer %s reached the upstream", k)
		}
	}
}

// TestRouterDropsTetherFields: an upstream's X-Tether-* fields never reach
// the caller, where they would pass for tether's (a fake X-Tether-Error, or
// X-Tether-Peer-Miss, which makes a forwarding replica send the request
// again): not in the head, a 1xx head, the trailers, or a 101's head.
func TestRouterDropsTetherFields(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if r.Header.Get("Upgrade") == "websocket" {
			h.Set("Connection", "Upgrade")
			h.Set("Upgrade", "websocket")
			h.Set("X-Tether-Error", "fake")
			w.WriteHeader(http.StatusSwitchingProtocols)
			c, brw, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = brw.Flush()
				c.Close()
			}
			return
		}
		h.Set("X-Tether-Error", "fake")
		w.WriteHeader(http.StatusEarlyHints)
		h.Del("X-Tether-Error")
		h.Set("Trailer", "X-Tether-Trailer, X-Sum")
		h.Set("X-Tether-Peer-Miss", "1")
		h.Set("x-tether-error", "tunnel_down")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "down")
		h.Set("X-Tether-Trailer", "fake")
		h.Set("X-Sum", "1")
		h.Set(http.TrailerPrefix+"X-Tether-Late", "fake")
	}))
	t.Cleanup(up.Close)
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{})

	var hints []textproto.MIMEHeader
	trace := &httptrace.ClientTrace{Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
		hints = append(hints, h)
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodGet, tr.front.URL+"/", nil)
	res, body := tr.do(t, req)
	if res.StatusCode != http.StatusServiceUnavailable || body != "down" {
		t.Fatalf("got %d %q, want the upstream's 503", res.StatusCode, body)
	}
	noTether := func(where string, h map[string][]string) {
		for k := range h {
			if tetherField(k) {
				t.Errorf("%s carries the upstream's %s", where, k)
			}
		}
	}
	noTether("the head", res.Header)
	noTether("the trailers", res.Trailer)
	if res.Trailer.Get("X-Sum") != "1" {
		t.Errorf("trailers %v, want X-Sum: other trailers pass", res.Trailer)
	}
	if len(hints) != 1 {
		t.Fatalf("%d informational responses, want 1", len(hints))
	}
	noTether("the 103", hints[0])

	c, err := net.Dial("tcp", tr.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	sw, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || sw.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("websocket: %v, %v; want the 101", sw, err)
	}
	noTether("the 101", sw.Header)
}

// TestRouterRefusesUnaskedSwitch: a 101 to a request that asked for no
// upgrade gets the caller 502, and the caller's connection stays the
// caller's: its next request is served as a request, not piped to the
// upstream, which never sees it.
func TestRouterRefusesUnaskedSwitch(t *testing.T) {
	piped := make(chan string, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				if req.URL.Path != "/switch" {
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nplain")
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\n\r\n")
				line, err := br.ReadString('\n')
				if err == nil {
					piped <- line
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nstolen")
				}
			}()
		}
	}()
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, "http://"+ln.Addr().String())}}, nil, Options{})

	c, err := net.Dial("tcp", tr.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "GET /switch HTTP/1.1\r\nHost: a\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusBadGateway || res.Header.Get(ErrorHeader) != CodeUpstreamBadResponse {
		t.Fatalf("got %d %q %q, want 502 %s", res.StatusCode, res.Header.Get(ErrorHeader), b, CodeUpstreamBadResponse)
	}
	_, _ = io.WriteString(c, "GET /other HTTP/1.1\r\nHost: b\r\nCookie: session=secret\r\n\r\n")
	res, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || string(b) != "plain" {
		t.Errorf("the caller's next request got %d %q, want the upstream's answer to it", res.StatusCode, b)
	}
	select {
	case line := <-piped:
		t.Errorf("the upstream read %q after its bare 101", line)
	default:
	}
}
