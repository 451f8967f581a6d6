package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/server/webhook"
)

// hookRequest is a request a webhook receiver got.
type hookRequest struct {
	method, path, body, delivery, signature string
}

// hookReceiver is an upstream that records the requests it gets, and
// answers them with status.
type hookReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []hookRequest
	status int
}

func newHookReceiver(t testing.TB, status int) *hookReceiver {
	t.Helper()
	h := &hookReceiver{status: status}
	h.Server = httptest.NewUnstartedServer(http.HandlerFunc(h.serve))
	return h
}

// startHookReceiver starts a receiver on addr ("" for any free port).
func startHookReceiver(t testing.TB, addr string, status int) *hookReceiver {
	t.Helper()
	h := newHookReceiver(t, status)
	if addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		h.Listener = ln
	}
	h.Start()
	t.Cleanup(h.Close)
	return h
}

func (h *hookReceiver) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.got = append(h.got, hookRequest{method: r.Method, path: r.URL.Path, body: string(b),
		delivery: r.Header.Get(webhook.DeliveryHeader), signature: r.Header.Get("X-Hub-Signature-256")})
	h.mu.Unlock()
	w.WriteHeader(h.status)
}

func (h *hookReceiver) requests() []hookRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookRequest(nil), h.got...)
}

// postHook POSTs a GitHub-style webhook for tunnel name to path.
func (s *testServer) postHook(t testing.TB, name, path, body string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.entry+path, strings.NewReader(body))
	req.Host = name + "." + testDomain
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-Hub-Signature-256", "sha256="+body)
	return do(t, req)
}

// waitDown waits until no session serves tunnel name here and the
// registry lists no holder of it.
func (s *testServer) waitDown(t testing.TB, name string) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if s.members.serves(name) || len(s.registry.Holders(name)) > 0 {
			return fmt.Errorf("tunnel %s is still served", name)
		}
		return nil
	})
}

// waitServed waits until tunnel name answers GET / through the entry.
func (s *testServer) waitServed(t testing.TB, name string) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if code, body, _ := s.get(t, name, "/"); code != http.StatusOK {
			return fmt.Errorf("tunnel %s: %d %s", name, code, body)
		}
		return nil
	})
}

// A webhook POSTed while its tunnel's client is down, once the tunnel
// logged in with the /webhooks route, is answered 202 with its ID and
// delivered, in order and byte for byte with its delivery ID, once the
// client is back; a GET, a route that does not buffer and a tunnel never
// seen get today's 503. /api/tunnels lists the queue of the tunnel that
// has no session.
func TestWebhooksBufferedWhileTunnelDown(t *testing.T) {
	s := startServer(t, func(c *Config) { c.DataDir = t.TempDir() })
	app := backend(t, "app")
	hooks := startHookReceiver(t, "", http.StatusOK)
	specs := []string{"/=" + app.URL, "/webhooks=" + hooks.URL + "/"}
	stop := s.runClientRoutes(t, "acme", s.tunnel, 1, specs...)
	s.waitServed(t, "acme")
	stop()
	s.waitDown(t, "acme")

	// Today's answers, meanwhile: each waits for a reconnecting client.
	type answer struct {
		what string
		code int
		err  string
	}
	answers := make(chan answer, 3)
	go func() {
		code, _, h := s.get(t, "acme", "/webhooks/push")
		answers <- answer{"GET /webhooks/push", code, h.Get(proxy.ErrorHeader)}
	}()
	go func() {
		code, _, h := s.postHook(t, "acme", "/app", "{}")
		answers <- answer{"POST /app (no buffer)", code, h.Get(proxy.ErrorHeader)}
	}()
	go func() {
		code, _, h := s.postHook(t, "never-seen", "/webhooks/push", "{}")
		answers <- answer{"POST for a tunnel never seen", code, h.Get(proxy.ErrorHeader)}
	}()

	var ids []string
	for i := range 3 {
		body := fmt.Sprintf(`{"ref":"refs/heads/main","n":%d}`, i)
		code, text, h := s.postHook(t, "acme", "/webhooks/push", body)
		var receipt struct{ ID, Tunnel string }
		if err := json.Unmarshal([]byte(text), &receipt); code != http.StatusAccepted || err != nil ||
			h.Get(webhook.BufferedHeader) == "" || receipt.ID != h.Get(webhook.BufferedHeader) || receipt.Tunnel != "acme" {
			t.Fatalf("POST %d while the tunnel is down: %d %s %v; want 202 with its ID", i, code, text, h)
		}
		ids = append(ids, receipt.ID)
	}
	for range 3 {
		a := <-answers
		if a.code != http.StatusServiceUnavailable || a.err != "tunnel_down" {
			t.Errorf("%s: %d %s; want today's 503 tunnel_down", a.what, a.code, a.err)
		}
	}

	var list []Info
	_, text, _ := do(t, mustRequest(t, http.MethodGet, s.admin+"/api/tunnels"))
	if err := json.Unmarshal([]byte(text), &list); err != nil || len(list) != 1 || list[0].Name != "acme" ||
		list[0].Session != "" || list[0].Buffer == nil || list[0].Buffer.Queued != 3 {
		t.Errorf("/api/tunnels while down: %s; want acme with 3 queued and no session", text)
	}
	if got := hooks.requests(); len(got) != 0 {
		t.Fatalf("the receiver got %v while the tunnel was down", got)
	}
	if _, metrics, _ := do(t, mustRequest(t, http.MethodGet, s.admin+"/metrics")); !strings.Contains(metrics, `tether_buffered_requests{state="queued",tunnel="acme"} 3`) {
		t.Errorf("/metrics does not show the queue:\n%s", grepLines(metrics, "buffer"))
	}
	reply, err := newProber(t, s).Login(t.Context(), s.keys.token(t, "acme", time.Hour))
	if err != nil || reply.Connected || reply.Buffered != 3 || reply.BufferedSince == nil {
		t.Errorf("login probe while down: %+v %v; want 3 buffered, and since when", reply, err)
	}

	s.runClientRoutes(t, "acme", s.tunnel, 1, specs...)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := len(hooks.requests()); n < 3 {
			return fmt.Errorf("%d of 3 delivered", n)
		}
		return nil
	})
	got := hooks.requests()
	if len(got) != 3 {
		t.Fatalf("delivered %d requests, want 3: %v", len(got), got)
	}
	for i, r := range got {
		body := fmt.Sprintf(`{"ref":"refs/heads/main","n":%d}`, i)
		if r.method != http.MethodPost || r.path != "/push" || r.body != body || r.signature != "sha256="+body || r.delivery != ids[i] {
			t.Errorf("delivery %d: %+v; want POST /push %s signed, delivery %s", i, r, body, ids[i])
		}
	}
}

// A webhook whose upstream refuses the connection while the client is up
// is buffered, and delivered once the upstream listens; an upstream's own
// 500 is passed through, never buffered.
func TestWebhooksUpstreamRefusedBufferedAnd500PassedThrough(t *testing.T) {
	s := startServer(t, func(c *Config) { c.DataDir = t.TempDir() })
	app := backend(t, "app")
	failing := startHookReceiver(t, "", http.StatusInternalServerError)
	hookAddr := testutil.FreeAddr(t)
	s.runClientRoutes(t, "acme", s.tunnel, 1,
		"/="+app.URL, "/webhooks=http://"+hookAddr+"/", "/fail="+failing.URL+"/;buffer")
	s.waitServed(t, "acme")

	code, text, h := s.postHook(t, "acme", "/fail/x", `{"n":1}`)
	if code != http.StatusInternalServerError || h.Get(webhook.BufferedHeader) != "" {
		t.Errorf("upstream's 500: %d %s %v; want the 500 passed through", code, text, h)
	}
	if n := len(failing.requests()); n != 1 {
		t.Errorf("the failing upstream got %d requests, want 1", n)
	}

	code, text, h = s.postHook(t, "acme", "/webhooks/push", `{"n":2}`)
	id := h.Get(webhook.BufferedHeader)
	if code != http.StatusAccepted || id == "" {
		t.Fatalf("POST to a refusing upstream: %d %s %v; want 202", code, text, h)
	}
	_, text, _ = do(t, mustRequest(t, http.MethodGet, s.admin+"/api/tunnels/acme/buffer"))
	var listing webhook.Listing
	if err := json.Unmarshal([]byte(text), &listing); err != nil || len(listing.Requests) != 1 || listing.Requests[0].ID != id {
		t.Errorf("buffer listing: %s; want only %s (the 500 is not buffered)", text, id)
	}

	hooks := startHookReceiver(t, hookAddr, http.StatusOK)
	testutil.WaitFor(t, 15*time.Second, func() error {
		if n := len(hooks.requests()); n < 1 {
			return fmt.Errorf("not delivered yet")
		}
		return nil
	})
	if got := hooks.requests(); len(got) != 1 || got[0].delivery != id || got[0].body != `{"n":2}` || got[0].path != "/push" {
		t.Errorf("delivered %+v; want the one request, delivery %s", got, id)
	}
	if n := len(failing.requests()); n != 1 {
		t.Errorf("the failing upstream got %d requests, want 1: its 500 is not retried", n)
	}
}

// Without --data-dir or Redis buffering is off: a buffered route's POST
// while the tunnel is down gets today's 503.
func TestWebhooksOffWithoutAStore(t *testing.T) {
	s := startServer(t)
	hooks := startHookReceiver(t, "", http.StatusOK)
	stop := s.runClientRoutes(t, "acme", s.tunnel, 1, "/="+hooks.URL, "/webhooks="+hooks.URL+"/")
	s.waitServed(t, "acme")
	stop()
	s.waitDown(t, "acme")
	if code, text, h := s.postHook(t, "acme", "/webhooks/push", "{}"); code != http.StatusServiceUnavailable || h.Get(proxy.ErrorHeader) != "tunnel_down" {
		t.Errorf("POST with buffering off: %d %s; want 503 tunnel_down", code, text)
	}
}

func mustRequest(t testing.TB, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
