package client

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
)

// streamPair returns the two ends of one yamux stream over net.Pipe: the
// server's, which asks for a dial, and the client's, which upstreams.serve
// answers. A yamux stream half-closes as the session's streams do.
func streamPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	cfg := tunnel.MuxConfig(15*time.Second, zap.NewNop())
	srvSess, err := yamux.Client(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cliSess, err := yamux.Server(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srvSess.Close(); _ = cliSess.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		s, err := cliSess.AcceptStream()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- s
	}()
	server, err = srvSess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	client, ok := <-accepted
	if !ok {
		t.Fatal("the client side accepted no stream")
	}
	return server, client
}

// halfCloseUpstream accepts one connection, greets it, reads until the
// other side half-closes, then answers with what it read and half-closes in
// turn.
func halfCloseUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { _ = ln.Close() })
	wg.Go(func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("hello\n")); err != nil {
			return
		}
		got, err := io.ReadAll(conn) // until the stream's FIN
		if err != nil {
			return
		}
		_, _ = conn.Write(append([]byte("got "), got...))
		_ = conn.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, conn)
	})
	return ln.Addr().String()
}

func TestUpstreamsServe(t *testing.T) {
	upstream := halfCloseUpstream(t)
	other := halfCloseUpstream(t)
	closed := testutil.ClosedAddr(t)
	routes := []proxy.Route{
		mustRoute(t, "/argo-cd=http://"+upstream),
		mustRoute(t, "/refused=http://"+closed),
		mustRoute(t, "/missing=http://no-such-service.invalid:8080"),
	}

	tests := []struct {
		name      string
		request   []byte // what the server sends
		wantCode  tunnel.DialCode
		wantReply bool   // a dial reply comes back
		dialed    string // the address dialed, "" for none
		metric    []string
	}{
		{
			name: "allowed", request: dialRequest(t, upstream),
			wantCode: tunnel.DialOK, wantReply: true, dialed: upstream, metric: []string{"argo-cd", "ok"},
		},
		{
			name: "not allowed", request: dialRequest(t, other),
			wantCode: tunnel.DialNotAllowed, wantReply: true, metric: []string{"", "not_allowed"},
		},
		{
			name: "refused", request: dialRequest(t, closed),
			wantCode: tunnel.DialRefused, wantReply: true, dialed: closed, metric: []string{"custom", "refused"},
		},
		{
			name: "host not found", request: dialRequest(t, "no-such-service.invalid:8080"),
			wantCode: tunnel.DialNotFound, wantReply: true, dialed: "no-such-service.invalid:8080", metric: []string{"custom", "not_found"},
		},
		{name: "not a dial request", request: []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{name: "another version", request: []byte{'D', 9, 0, 1, 'x'}},
		{name: "truncated address", request: []byte{'D', 1, 0, 20, 'a', 'b'}},
		{name: "address over the bound", request: append([]byte{'D', 1, 0xff, 0xff}, bytes.Repeat([]byte("a"), 64)...)},
		{name: "nothing", request: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			u := newUpstreams(routes, reg)
			var dialed []string
			var mu sync.Mutex
			dial := u.dial
			u.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				mu.Lock()
				dialed = append(dialed, addr)
				mu.Unlock()
				return dial(ctx, network, addr)
			}
			srv, cli := streamPair(t)
			done := make(chan struct{})
			go func() { defer close(done); u.serve(cli, zaptest.NewLogger(t)) }()

			if _, err := srv.Write(tc.request); err != nil {
				t.Fatal(err)
			}
			if !tc.wantReply {
				// Half-close: a request that stops short ends too.
				_ = srv.Close()
				if _, err := io.ReadAll(srv); err != nil {
					t.Errorf("read after a bad request: %v, want the stream closed", err)
				}
			} else {
				code, msg, err := tunnel.ReadDialReply(srv)
				if err != nil {
					t.Fatal(err)
				}
				if code != tc.wantCode {
					t.Errorf("dial reply %d (%q), want %d", code, msg, tc.wantCode)
				}
				if code == tunnel.DialOK {
					copyBothWays(t, srv)
				} else if b, err := io.ReadAll(srv); err != nil || len(b) != 0 {
					t.Errorf("after a refusal the stream gave %q, %v; want it closed", b, err)
				}
				_ = srv.Close()
			}
			<-done

			mu.Lock()
			defer mu.Unlock()
			switch {
			case tc.dialed == "" && len(dialed) > 0:
				t.Errorf("dialed %q, want nothing dialed", dialed)
			case tc.dialed != "" && (len(dialed) != 1 || dialed[0] != tc.dialed):
				t.Errorf("dialed %q, want %q once", dialed, tc.dialed)
			}
			wantDials := 0.0
			if tc.metric != nil {
				wantDials = 1
				if n := promtest.ToFloat64(u.dials.WithLabelValues(tc.metric...)); n != 1 {
					t.Errorf("tether_client_upstream_dials_total%q = %v, want 1", tc.metric, n)
				}
			}
			// Every result's series exists from the start: only the one
			// above may have counted.
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			total := 0.0
			for _, f := range families {
				for _, m := range f.GetMetric() {
					total += m.GetCounter().GetValue()
				}
			}
			if total != wantDials {
				t.Errorf("%v dials counted, want %v", total, wantDials)
			}
		})
	}
}

// copyBothWays checks the connected stream against halfCloseUpstream:
// bytes flow both ways, and each side's end of writing reaches the other
// while it can still answer.
func copyBothWays(t *testing.T, stream net.Conn) {
	t.Helper()
	greeting := make([]byte, len("hello\n"))
	if _, err := io.ReadFull(stream, greeting); err != nil || string(greeting) != "hello\n" {
		t.Fatalf("greeting %q, %v; want the upstream's hello", greeting, err)
	}
	if _, err := stream.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close() // FIN: the upstream reads EOF, the stream still reads
	rest, err := io.ReadAll(stream)
	if err != nil || string(rest) != "got ping" {
		t.Errorf("after the half-close the upstream answered %q, %v; want %q", rest, err, "got ping")
	}
}

func dialRequest(t *testing.T, addr string) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := tunnel.WriteDialRequest(&b, addr); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func mustRoute(t *testing.T, spec string) proxy.Route {
	t.Helper()
	r, err := proxy.ParseRoute(spec)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The allow-list is the routes' DialAddr: an upstream named without a port
// is dialed at its scheme's default port, never at another.
func TestUpstreamsAllowDialAddr(t *testing.T) {
	u := newUpstreams([]proxy.Route{
		mustRoute(t, "/=http://app-proxy"),
		mustRoute(t, "/workflows=https://argo-server/"),
		mustRoute(t, "/argo-cd=http://argocd-server:8080"),
	}, prometheus.NewRegistry())
	for addr, want := range map[string]bool{
		"app-proxy:80": true, "argo-server:443": true, "argocd-server:8080": true,
		"app-proxy:443": false, "argo-server:80": false, "argocd-server:80": false, "app-proxy": false,
	} {
		if _, got := u.allowed[addr]; got != want {
			t.Errorf("%s allowed = %v, want %v", addr, got, want)
		}
	}
}
