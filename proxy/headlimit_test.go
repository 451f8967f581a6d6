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
	"sync/atomic"
	"testing"
	"time"
)

// rawUpstream answers the requests of every connection with answer(n), n
// counting the requests of the connection from 0. It counts connections.
func rawUpstream(t *testing.T, answer func(n int) string) (addr string, conns *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns = new(atomic.Int32)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if _, err := io.WriteString(c, answer(n)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), conns
}

// fieldsHead is a 200 head with n header fields and a two-byte body.
func fieldsHead(n int) string {
	var b strings.Builder
	b.WriteString("HTTP/1.1 200 OK\r\n")
	for i := range n {
		fmt.Fprintf(&b, "X-F%d: v\r\n", i)
	}
	b.WriteString("Content-Length: 2\r\n\r\nok")
	return b.String()
}

// TestLimitHeads: an http.Transport through LimitHeads refuses heads beyond
// MaxHeadFields (http.Transport counts bytes only), counts the heads of
// each response on a kept-alive connection from its start, and the 1xx
// heads of an exchange with its final head, even behind
// httputil.ReverseProxy, whose trace would reset http.Transport's own
// count at each 1xx head.
func TestLimitHeads(t *testing.T) {
	half := MaxHeadFields / 2
	tests := []struct {
		name   string
		answer func(n int) string
		ok     []bool // the outcome of each request in turn
	}{
		{"fields at the bound, again and again on one connection",
			func(int) string { return fieldsHead(MaxHeadFields - 1) }, []bool{true, true, true}},
		{"one field too many", func(int) string { return fieldsHead(MaxHeadFields + 1) }, []bool{false}},
		{"1xx heads count with the final one", func(int) string {
			return "HTTP/1.1 103 Early Hints\r\n" + strings.Repeat("Link: <a>\r\n", half+1) + "\r\n" + fieldsHead(half)
		}, []bool{false}},
		{"a body of many lines is no head", func(int) string {
			return "HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n" + strings.Repeat("\n", 3000)
		}, []bool{true, true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr, conns := rawUpstream(t, tc.answer)
			tr := &http.Transport{Proxy: nil}
			t.Cleanup(tr.CloseIdleConnections)
			rp := &httputil.ReverseProxy{
				Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(mustURL(t, "http://"+addr)) },
				Transport: LimitHeads(tr),
				ErrorLog:  log.New(io.Discard, "", 0),
				ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
					if errors.Is(err, ErrBadResponse) {
						w.Header().Set(ErrorHeader, CodeUpstreamBadResponse)
					}
					w.WriteHeader(http.StatusBadGateway)
				},
			}
			front := httptest.NewServer(rp)
			t.Cleanup(front.Close)
			for i, ok := range tc.ok {
				res, err := front.Client().Get(front.URL)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if got := res.StatusCode == http.StatusOK; got != ok {
					t.Errorf("request %d: %d %q; want passed on: %v", i, res.StatusCode, res.Header.Get(ErrorHeader), ok)
				}
				if !ok && res.Header.Get(ErrorHeader) != CodeUpstreamBadResponse {
					t.Errorf("request %d: the error is not ErrBadResponse", i)
				}
			}
			if n := conns.Load(); tc.ok[0] && n != 1 {
				t.Errorf("%d connections for %d requests, want one kept alive", n, len(tc.ok))
			}
		})
	}
}

// TestRouterRefusesHugeHeads: heads of a megabyte of short fields, whose
// body never comes, are refused with 502 over either kind of connection,
// whatever the reads' sizes: a read error that comes after part of a line
// is dropped by bufio.Reader.ReadLine, so the fault must stay.
func TestRouterRefusesHugeHeads(t *testing.T) {
	var b strings.Builder
	b.WriteString("HTTP/1.1 200 OK\r\n")
	for i := 0; b.Len() < (1<<20)-4096; i++ {
		fmt.Fprintf(&b, "X-%x: v\r\n", i)
	}
	b.WriteString("Content-Length: 100\r\n\r\n")
	head := b.String()
	addr, _ := rawUpstream(t, func(int) string { return head })
	for _, d := range dialers {
		t.Run(d.name, func(t *testing.T) {
			tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, "http://"+addr)}}, nil, Options{DialContext: d.dial(t)})
			// The body never comes: a router that passes the head on would
			// leave the caller waiting.
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, tr.front.URL+"/x", nil)
			res, body := tr.do(t, req)
			if res.StatusCode != http.StatusBadGateway || res.Header.Get(ErrorHeader) != CodeUpstreamBadResponse {
				t.Errorf("got %d %q %.60q, want 502 %s", res.StatusCode, res.Header.Get(ErrorHeader), body, CodeUpstreamBadResponse)
			}
		})
	}
}
