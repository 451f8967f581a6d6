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
