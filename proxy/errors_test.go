package proxy

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tether-dev/tether/internal/testutil"
)

// quietTLSServer is an https upstream that does not print handshake
// failures, which some tests cause on purpose.
func quietTLSServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	ts := httptest.NewUnstartedServer(h)
	ts.Config.ErrorLog = log.New(io.Discard, "", 0)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts
}

func TestUpstreamErrors(t *testing.T) {
	blocked := make(chan struct{})
	defer close(blocked)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-blocked:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	hangup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
	}))
	t.Cleanup(hangup.Close)
	plain := echoUpstream(t, "plain")
	tlsUp := quietTLSServer(t, echoHandler("tls"))
	refused := "http://" + testutil.ClosedAddr(t)

	dnsFail := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: &net.DNSError{
			Name: strings.Split(addr, ":")[0], Err: "no such host", IsNotFound: true,
		}}
	}
	noAnswer := func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
	}

	tests := []struct {
		name   string
		route  Route
		opts   Options
		status int
		code   string
		body   string
	}{
		{
			name:   "refused",
			route:  Route{Prefix: "/", Upstream: mustURL(t, refused), Adapter: "argo-cd"},
			status: http.StatusBadGateway, code: CodeUpstreamUnreachable,
			body: "tether: the upstream of route / (argo-cd) is unreachable: connection refused",
		},
		{
			name:   "unknown host",
			route:  Route{Prefix: "/", Upstream: mustURL(t, "http://argocd-server:80"), Adapter: "argo-cd"},
			opts:   Options{DialContext: dnsFail},
			status: http.StatusBadGateway, code: CodeUpstreamUnreachable,
			body: "tether: the upstream of route / (argo-cd) is unreachable: its host name is not found",
		},
		{
			name:   "no answer within the dial timeout",
			route:  Route{Prefix: "/", Upstream: mustURL(t, "http://app-proxy:8080")},
			opts:   Options{DialContext: noAnswer, DialTimeout: 50 * time.Millisecond},
			status: http.StatusBadGateway, code: CodeUpstreamUnreachable,
			body: "tether: the upstream of route / (custom) is unreachable: no answer within 50ms",
		},
		{
			name:   "no response headers within the route's timeout",
			route:  Route{Prefix: "/", Upstream: mustURL(t, slow.URL), Timeout: 100 * time.Millisecond, Adapter: "argo-events"},
			status: http.StatusGatewayTimeout, code: CodeUpstreamTimeout,
			body: "tether: the upstream of route / (argo-events) sent no response headers within 100ms, the route's timeout",
		},
		{
			name:   "untrusted certificate",
			route:  Route{Prefix: "/", Upstream: mustURL(t, tlsUp.URL), Adapter: "argo-workflows"},
			status: http.StatusBadGateway, code: CodeUpstreamTLS,
			body: "tether: the upstream of route / (argo-workflows) failed TLS verification; " +
				"set insecure-skip-verify on the route if it uses a self-signed certificate",
		},
		{
			name:   "https to a plain http upstream",
			route:  Route{Prefix: "/", Upstream: mustURL(t, strings.Replace(plain.URL, "http:", "https:", 1))},
			status: http.StatusBadGateway, code: CodeUpstreamTLS,
			body: "tether: the upstream of route / (custom) does not speak TLS; use an http:// upstream URL",
		},
		{
			name:   "connection closed before a response",
			route:  Route{Prefix: "/", Upstream: mustURL(t, hangup.URL)},
			status: http.StatusBadGateway, code: CodeUpstreamFailed,
			body: "tether: the upstream of route / (custom) failed: it closed the connection before responding",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			tr := newTestRouter(t, []Route{tc.route}, zap.New(core), tc.opts)
			res, body := tr.get(t, "/x", http.Header{
				"Cookie":        {"argocd.token=cookie-secret"},
				"Authorization": {"Bearer header-secret"},
			})
			if res.StatusCode != tc.status {
				t.Errorf("status %d, want %d", res.StatusCode, tc.status)
			}
			if got := res.Header.Get(ErrorHeader); got != tc.code {
				t.Errorf("%s %q, want %q", ErrorHeader, got, tc.code)
			}
			if body != tc.body+"\n" {
				t.Errorf("body\n got %q\nwant %q", body, tc.body+"\n")
			}
			// The caller learns the route, never where it leads.
			if u := tc.route.Upstream; strings.Contains(body, u.Host) || strings.Contains(body, u.Hostname()) {
				t.Errorf("body %q names the upstream %s", body, u)
			}

			warns := logs.FilterLevelExact(zapcore.WarnLevel).FilterMessage("upstream request failed").All()
			if len(warns) != 1 {
				t.Fatalf("logged %d warnings %v, want 1", len(warns), logs.All())
			}
			fields := warns[0].ContextMap()
			if fields["route"] != "/" || fields["upstream"] != tc.route.Upstream.String() || fields["error"] == nil {
				t.Errorf("warning fields %v, want route, upstream and error", fields)
			}
			for _, e := range logs.All() {
				line := fmt.Sprint(e.Message, e.ContextMap())
				if strings.Contains(line, "secret") {
					t.Errorf("log entry reveals a credential: %s", line)
				}
			}
		})
	}

	t.Run("insecure-skip-verify accepts the self-signed certificate", func(t *testing.T) {
		tr := newTestRouter(t, []Route{{Prefix: "/", Upstream: mustURL(t, tlsUp.URL), InsecureSkipVerify: true}}, nil, Options{})
		if s := tr.getSeen(t, "/x", nil); s.Upstream != "tls" {
			t.Errorf("reached %q, want the tls upstream", s.Upstream)
		}
	})
}

// TestCallerCanceled checks that a caller going away is not an upstream
// failure: no warning, a debug line, and the upstream request ends too.
func TestCallerCanceled(t *testing.T) {
	started := make(chan struct{})
	upstreamDone := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		close(upstreamDone)
	}))
	t.Cleanup(up.Close)

	core, logs := observer.New(zapcore.DebugLevel)
	r, err := NewRouter([]Route{{Prefix: "/", Upstream: mustURL(t, up.URL), Timeout: time.Minute}}, zap.New(core), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	served := make(chan struct{})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		defer close(served)
		r.ServeHTTP(w, req)
	}))
	t.Cleanup(front.Close)

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/watch", nil)
		res, err := front.Client().Do(req)
		if err == nil {
			res.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; err == nil {
		t.Error("the canceled request succeeded")
	}
	<-served
	<-upstreamDone

	if n := logs.FilterLevelExact(zapcore.WarnLevel).Len() + logs.FilterLevelExact(zapcore.ErrorLevel).Len(); n != 0 {
		t.Errorf("logged %d warnings or errors for a canceled request, want 0: %v", n, logs.All())
	}
	if logs.FilterMessage("request canceled by caller").FilterLevelExact(zapcore.DebugLevel).Len() != 1 {
		t.Errorf("logs %v, want one debug line %q", logs.All(), "request canceled by caller")
	}
}
