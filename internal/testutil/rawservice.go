package testutil

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
)

// RawService is a hostile tenant's service: it answers whatever arrives on
// a connection, request after request, with "200 OK" and an empty body, and
// keeps the connection, so that it catches anything a poisoned connection
// would carry. It records every request head.
type RawService struct {
	ln    net.Listener
	mu    sync.Mutex
	seen  []SeenRequest
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// SeenRequest is the head of a request a RawService received.
type SeenRequest struct{ Method, Host, Target, Authorization string }

// NewRawService starts a RawService on loopback, stopped when the test ends.
func NewRawService(t testing.TB) *RawService {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &RawService{ln: ln, conns: map[net.Conn]bool{}}
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns[c] = true
			r.mu.Unlock()
			r.wg.Go(func() { r.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		r.mu.Lock()
		for c := range r.conns {
			_ = c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *RawService) serve(c net.Conn) {
	defer func() {
		_ = c.Close()
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
	}()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		r.mu.Lock()
		r.seen = append(r.seen, SeenRequest{req.Method, req.Host, req.RequestURI, req.Header.Get("Authorization")})
		r.mu.Unlock()
		_, _ = io.Copy(io.Discard, req.Body)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"); err != nil {
			return
		}
	}
}

// Port is the loopback port the service listens on.
func (r *RawService) Port() int { return r.ln.Addr().(*net.TCPAddr).Port }

// Requests returns the heads of the requests received so far.
func (r *RawService) Requests() []SeenRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]SeenRequest(nil), r.seen...)
}
