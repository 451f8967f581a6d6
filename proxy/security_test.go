package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"
)

// TestNeverOpenProxy sends requests that ask, in every way HTTP allows, to be
// forwarded somewhere else, and checks that only the route's upstream is
// ever dialed: a real listener standing for an internal service must see no
// connection at all.
func TestNeverOpenProxy(t *testing.T) {
	evil, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	evilAddr := evil.Addr().String()

	up := echoUpstream(t, "app-proxy")
	upHost := mustURL(t, up.URL).Host

	var mu sync.Mutex
	var dialed []string
	recordDial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{DialContext: recordDial})
	addr := tr.front.Listener.Addr().String()

	forwarded := []struct {
		name    string
		request []string
		uri     string
	}{
		{"absolute-form target", []string{"GET http://" + evilAddr + "/secret?x=1 HTTP/1.1", "Host: " + evilAddr}, "/secret?x=1"},
		{"absolute-form https target", []string{"GET https://" + evilAddr + "/ HTTP/1.1", "Host: t1"}, "/"},
		{"absolute-form without path", []string{"GET http://" + evilAddr + " HTTP/1.1", "Host: t1"}, "/"},
		{"Host header", []string{"GET /x HTTP/1.1", "Host: " + evilAddr}, "/x"},
		{"X-Forwarded-Host", []string{"GET /x HTTP/1.1", "Host: t1", "X-Forwarded-Host: " + evilAddr}, "/x"},
		{"path that looks like a URL", []string{"GET //" + evilAddr + "/x HTTP/1.1", "Host: t1"}, "//" + evilAddr + "/x"},
	}
	for _, tc := range forwarded {
		t.Run(tc.name, func(t *testing.T) {
			res, body := rawRoundTrip(t, addr, tc.request...)
			s := decodeSeen(t, res, body)
			if s.Upstream != "app-proxy" || s.RequestURI != tc.uri || s.Host != upHost {
				t.Errorf("reached %s as %q with Host %q, want app-proxy as %q with Host %q",
					s.Upstream, s.RequestURI, s.Host, tc.uri, upHost)
			}
		})
	}

	t.Run("CONNECT", func(t *testing.T) {
		res, body := rawRoundTrip(t, addr, "CONNECT "+evilAddr+" HTTP/1.1", "Host: "+evilAddr)
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get(ErrorHeader) != CodeMethodNotAllowed {
			t.Errorf("CONNECT: status %d %s %q, want 405 %s", res.StatusCode, ErrorHeader,
				res.Header.Get(ErrorHeader), CodeMethodNotAllowed)
		}
		if body == "" {
			t.Error("CONNECT: empty body, want a reason")
		}
		if res.Header.Get("Allow") == "" {
			t.Error("CONNECT: 405 without an Allow header")
		}
	})

	// Everything above has been answered, so any connection the router made
	// to evil is in its accept queue by now.
	if err := evil.(*net.TCPListener).SetDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	if c, err := evil.Accept(); err == nil {
		c.Close()
		t.Errorf("the router connected to %s; it must only dial its routes' upstreams", evilAddr)
	} else if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("accept on the unrelated listener: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range dialed {
		if a != upHost {
			t.Errorf("the router dialed %s, want only the upstream %s", a, upHost)
		}
	}
}

// TestEnvironmentProxyIgnored checks that HTTP_PROXY cannot divert
// in-cluster upstream traffic to an egress proxy: the router dials its
// upstreams itself, whatever the environment names.
func TestEnvironmentProxyIgnored(t *testing.T) {
	decoy, decoyConns := countedUpstream(t, echoHandler("egress proxy"))
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"} {
		t.Setenv(k, decoy.URL)
	}
	t.Setenv("NO_PROXY", "")
	up := echoUpstream(t, "up")
	tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, up.URL)}}, nil, Options{})
	if got := tr.getSeen(t, "/x", nil); got.Upstream != "up" {
		t.Errorf("request reached %q, want the upstream", got.Upstream)
	}
	if n := decoyConns.accepted.Load(); n != 0 {
		t.Errorf("the proxy named by HTTP_PROXY received %d connections, want 0", n)
	}
}
