package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// deliveries records the webhooks an Argo Events stand-in received.
type deliveries struct {
	mu  sync.Mutex
	got []delivered
}

type delivered struct {
	id, body, signature string
}

// receiver is an echo backend whose /push records each webhook.
func (d *deliveries) receiver(t testing.TB) *backend {
	return newBackend(t, "events", map[string]http.HandlerFunc{"POST /push": func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		d.mu.Lock()
		d.got = append(d.got, delivered{id: r.Header.Get("X-Tether-Delivery"), body: string(b), signature: r.Header.Get("X-Hub-Signature-256")})
		d.mu.Unlock()
	}})
}

func (d *deliveries) list() []delivered {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]delivered(nil), d.got...)
}

// waitFor waits until n webhooks arrived, and checks that they are the
// ones ids names, in that order, byte for byte, each once.
func (d *deliveries) waitFor(t testing.TB, ids []string, bodies []string) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if got := len(d.list()); got < len(ids) {
			return fmt.Errorf("%d of %d webhooks delivered", got, len(ids))
		}
		return nil
	})
	got := d.list()
	if len(got) != len(ids) {
		t.Fatalf("delivered %d webhooks, want %d: %+v", len(got), len(ids), got)
	}
	for i, g := range got {
		if g.id != ids[i] || g.body != bodies[i] || g.signature != signature(bodies[i]) {
			t.Errorf("delivery %d: %+v; want id %s, body %s, its signature", i, g, ids[i], bodies[i])
		}
	}
}

func signature(body string) string {
	return "sha256=" + strings.Repeat("ab", 8) + fmt.Sprint(len(body))
}

// postHook POSTs a GitHub-style webhook to tunnel's /webhooks/push and
// returns the answer.
func (s *server) postHook(t testing.TB, tunnel, body string) response {
	t.Helper()
	req := s.request(t, http.MethodPost, tunnel, "/webhooks/push", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-Hub-Signature-256", signature(body))
	r, err := do(req)
	if err != nil {
		t.Fatalf("POST %s/webhooks/push: %v", tunnel, err)
	}
	return r
}

// bufferHooks POSTs n webhooks for tunnel, which is down, and returns
// their IDs and bodies; each must be answered 202.
func (s *server) bufferHooks(t testing.TB, tunnel string, n int) (ids, bodies []string) {
	t.Helper()
	for i := range n {
		body := fmt.Sprintf(`{"ref":"refs/heads/main","after":"%040d"}`, i)
		r := s.postHook(t, tunnel, body)
		var receipt struct{ ID string }
		if err := json.Unmarshal([]byte(r.body), &receipt); r.code != http.StatusAccepted || err != nil ||
			receipt.ID == "" || r.header.Get("X-Tether-Buffered") != receipt.ID {
			t.Fatalf("webhook %d while %s is down: %d %v %s; want 202 with X-Tether-Buffered", i, tunnel, r.code, r.header, r.body)
		}
		ids, bodies = append(ids, receipt.ID), append(bodies, body)
	}
	return ids, bodies
}

// waitNoSession waits until s lists no session of tunnel.
func (s *server) waitNoSession(t testing.TB, tunnel string) {
	t.Helper()
	testutil.WaitFor(t, 15*time.Second, func() error {
		for _, ti := range s.sessions(t) {
			if ti.Name == tunnel && ti.Session != "" {
				return fmt.Errorf("%s still has session %s", tunnel, ti.Session)
			}
		}
		return nil
	})
}

// A single server with --data-dir keeps the webhooks it accepted while a
// tunnel was down through a kill -9, and delivers them, in order and byte
// for byte, when the tunnel's client is back; a GET meanwhile gets
// today's 503.
func TestWebhooksOutliveAServerKill(t *testing.T) {
	k := newKeys(t)
	dataDir := t.TempDir()
	s := startServer(t, k, serverOpts{args: []string{"--data-dir", dataDir}})
	var d deliveries
	events := d.receiver(t)
	app := newBackend(t, "app", nil)
	token := writeToken(t, k.issue(t, "acme", time.Hour))
	routes := []string{"/=" + app.url(), "/webhooks=" + events.url() + "/"}
	c := startClient(t, s, clientOpts{tokenFile: token, routes: routes})
	c.stop()
	s.waitNoSession(t, "acme")

	ids, bodies := s.bufferHooks(t, "acme", 3)
	if r := s.mustGet(t, "acme", "/webhooks/push"); r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != "tunnel_down" {
		t.Errorf("GET while down: %d %v; want today's 503 tunnel_down", r.code, r.header)
	}
	var list []tunnelInfo
	if r, err := s.admin("/api/tunnels"); err != nil || json.Unmarshal([]byte(r.body), &list) != nil ||
		len(list) != 1 || list[0].Buffer == nil || list[0].Buffer.Queued != 3 {
		t.Errorf("/api/tunnels while down: %v %s; want acme with 3 queued", err, r.body)
	}

	s.kill()
	s = startServer(t, k, serverOpts{args: []string{"--data-dir", dataDir}})
	startClient(t, s, clientOpts{tokenFile: token, routes: routes})
	d.waitFor(t, ids, bodies)
}

// Three replicas on Redis: a webhook one replica accepted while the tunnel
// was down is delivered, once, when its client connects to another.
func TestWebhooksAcrossReplicas(t *testing.T) {
	f := newFleet(t, 3)
	var d deliveries
	events := d.receiver(t)
	app := newBackend(t, "app", nil)
	token := writeToken(t, f.keys.issue(t, "acme", time.Hour))
	routes := []string{"/=" + app.url(), "/webhooks=" + events.url() + "/"}
	first, accepting, last := f.replica(0), f.replica(1), f.replica(2)

	c := startClient(t, first.server, clientOpts{server: first.tunnelAddr, tokenFile: token, routes: routes})
	c.stop()
	first.waitNoSession(t, "acme")
	testutil.WaitFor(t, 15*time.Second, func() error {
		r, err := accepting.admin("/api/fleet")
		if err != nil || strings.Contains(r.body, `"acme"`) {
			return fmt.Errorf("the fleet still lists acme: %v %s", err, r.body)
		}
		return nil
	})

	ids, bodies := accepting.bufferHooks(t, "acme", 2)
	startClient(t, last.server, clientOpts{server: last.tunnelAddr, tokenFile: token, routes: routes})
	d.waitFor(t, ids, bodies)
}
