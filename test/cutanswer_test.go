package test

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// TestStockFRPCAnswerCutBeforeBody: a stock frpc's service that sends an
// answer's head and goes away before its body leaves the caller tether's
// 502, without the service's fields, not a connection closed without a
// word. (frp's vhost holds the head until the body's first byte, as
// tether's router does, and fails the exchange: tether answers it.)
func TestStockFRPCAnswerCutBeforeBody(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	b := newBackend(t, "cut", map[string]http.HandlerFunc{
		"/cut": func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nSet-Cookie: upstream=1\r\n\r\n")
			_ = conn.Close()
		},
	})
	startFRPC(t, "frpc cut", frpcConfig(srv, k.issue(t, "cut", time.Hour), frpcHTTPProxy("cut", b)))
	srv.waitServed(t, "cut")
	res, err := srv.get("cut", "/cut")
	if err != nil {
		t.Fatalf("the caller got no answer at all (%v); want tether's 502", err)
	}
	if res.code != http.StatusBadGateway || res.header.Get("X-Tether-Error") == "" || res.header.Get("Set-Cookie") != "" {
		t.Errorf("got %d %q (Set-Cookie %q); want tether's 502 without the service's fields", res.code, res.header.Get("X-Tether-Error"), res.header.Get("Set-Cookie"))
	}
}
