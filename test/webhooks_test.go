package test

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/buffer"
	"github.com/tether-dev/tether/tunnel/server/webhook"
)

// The webhook buffer end to end: webhooks that a tunnel's outage would
// lose are stored, and delivered once it is back; here on a single server
// with --data-dir, in webhooks_fleet_test.go on replicas sharing Redis.

// deliveryWait bounds how long a queue takes to drain once its tunnel is
// back. A replica killed while it delivers leaves its lease to expire
// (10 s) before the next sweep (every 10 s) of another takes over.
const deliveryWait = 60 * time.Second

// hookSecret is the secret GitHub signs the hooks of the tests with.
const hookSecret = "it's a secret to everybody"

// ghHook is a GitHub-style webhook as sent, and the ID its 202 gave it.
type ghHook struct {
	id     string
	uri    string // path and query at the public entry
	header http.Header
	body   string
}

// newHook makes the n-th push event of a test: a body unique to the test
// (marker in it), and GitHub's headers, the signature over the body.
func newHook(marker string, n int) ghHook {
	body := fmt.Sprintf(`{"ref":"refs/heads/main","after":"%040d","marker":%q}`, n, marker)
	mac := hmac.New(sha256.New, []byte(hookSecret))
	mac.Write([]byte(body))
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "GitHub-Hookshot/5b2f3c1")
	h.Set("X-GitHub-Event", "push")
	h.Set("X-GitHub-Delivery", fmt.Sprintf("%s-%04d", marker, n))
	h.Set("X-GitHub-Hook-ID", "424242")
	h.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	return ghHook{uri: "/webhooks/push?source=github", header: h, body: body}
}

// randomMarker is a string that appears nowhere but where a test put it.
func randomMarker() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "marker-" + hex.EncodeToString(b)
}

// send POSTs h to tunnel at s's public entry.
func (s *server) send(t testing.TB, tunnel string, h ghHook) response {
	t.Helper()
	r, err := s.trySend(t, tunnel, h)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (s *server) trySend(t testing.TB, tunnel string, h ghHook) (response, error) {
	req := s.request(t, http.MethodPost, tunnel, h.uri, strings.NewReader(h.body))
	for k, v := range h.header {
		req.Header[k] = slices.Clone(v)
	}
	r, err := do(req)
	if err != nil {
		return r, fmt.Errorf("POST %s%s: %w", tunnel, h.uri, err)
	}
	return r, nil
}

// buffer sends h for tunnel, which is down, requires a 202 with a receipt,
// and returns h with its ID.
func (s *server) buffer(t testing.TB, tunnel string, h ghHook) ghHook {
	t.Helper()
	h, err := s.tryBuffer(t, tunnel, h)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (s *server) tryBuffer(t testing.TB, tunnel string, h ghHook) (ghHook, error) {
	r, err := s.trySend(t, tunnel, h)
	if err != nil {
		return h, err
	}
	var receipt struct {
		ID       string    `json:"id"`
		Tunnel   string    `json:"tunnel"`
		QueuedAt time.Time `json:"queued_at"`
	}
	if err := json.Unmarshal([]byte(r.body), &receipt); r.code != http.StatusAccepted || err != nil ||
		receipt.ID == "" || receipt.Tunnel != tunnel || receipt.QueuedAt.IsZero() ||
		r.header.Get(webhook.BufferedHeader) != receipt.ID {
		return h, fmt.Errorf("webhook %s while %s is down: %d %v %s; want 202 with X-Tether-Buffered and {id, tunnel, queued_at}",
			h.header.Get("X-GitHub-Delivery"), tunnel, r.code, r.header, r.body)
	}
	h.id = receipt.ID
	return h, nil
}

// bufferWaves buffers n hooks made by newHook, sending each through
// via(i), for a tunnel that is down. The entry holds each such request for
// its reconnect wait (3 s) before it stores it, so the hooks go in waves of
// wave at once, one wave after the other. It returns them in the order the
// server stored them, their IDs' order, and checks that each wave was
// stored after the one before.
func bufferWaves(t testing.TB, tunnel, marker string, n, wave int, via func(i int) *server) []ghHook {
	t.Helper()
	var stored []ghHook
	for start := 0; start < n; start += wave {
		hooks := make([]ghHook, min(wave, n-start))
		var wg sync.WaitGroup
		for k := range hooks {
			wg.Go(func() {
				var err error
				if hooks[k], err = via(start+k).tryBuffer(t, tunnel, newHook(marker, start+k)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		slices.SortFunc(hooks, func(a, b ghHook) int { return strings.Compare(a.id, b.id) })
		if len(stored) > 0 && stored[len(stored)-1].id >= hooks[0].id {
			t.Fatalf("webhook %s was stored before %s, which was sent after it returned", hooks[0].id, stored[len(stored)-1].id)
		}
		stored = append(stored, hooks...)
	}
	return stored
}

// adminDo sends method to an admin endpoint.
func (s *server) adminDo(t testing.TB, method, path string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+s.adminAddr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// bufferList reads GET /api/tunnels/{tunnel}/buffer.
func (s *server) bufferList(t testing.TB, tunnel string) []buffer.Entry {
	t.Helper()
	r := s.adminDo(t, http.MethodGet, "/api/tunnels/"+tunnel+"/buffer")
	var l webhook.Listing
	if err := json.Unmarshal([]byte(r.body), &l); r.code != http.StatusOK || err != nil || l.Tunnel != tunnel {
		t.Fatalf("GET /api/tunnels/%s/buffer: %d %v: %s", tunnel, r.code, err, r.body)
	}
	return l.Requests
}

// waitDrained waits until tunnel's buffer holds nothing: every request it
// held was delivered (acknowledged), so none will be delivered again.
func (s *server) waitDrained(t testing.TB, tunnel string) {
	t.Helper()
	testutil.WaitFor(t, deliveryWait, func() error {
		if l := s.bufferList(t, tunnel); len(l) > 0 {
			return fmt.Errorf("%d requests still buffered for %s, the first %+v", len(l), tunnel, l[0])
		}
		return nil
	})
}

// arrival is a request as it reached the receiver.
type arrival struct {
	method, uri string
	header      http.Header
	body        string
}

func (a arrival) id() string { return a.header.Get(webhook.DeliveryHeader) }

func (a arrival) attempt() int {
	n, _ := strconv.Atoi(a.header.Get(webhook.AttemptHeader))
	return n
}

// inbox is an Argo Events stand-in: it records every request to /push,
// and answers each with what answer says (200 by default).
type inbox struct {
	mu  sync.Mutex
	got []arrival
	// answer, when set, is called with each arrival and its index and
	// returns the status to answer; it may block.
	answer func(r *http.Request, n int) int
}

// start serves the inbox on a backend.
func (in *inbox) start(t testing.TB) *backend {
	return newBackend(t, "events", map[string]http.HandlerFunc{"/push": in.serve})
}

// startOn starts the inbox as an upstream listening on port, which was
// refusing connections until now.
func (in *inbox) startOn(t testing.TB, port int) {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("listen on the upstream's port: %v", err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(in.serve))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
}

func (in *inbox) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	in.mu.Lock()
	n := len(in.got)
	in.got = append(in.got, arrival{method: r.Method, uri: r.RequestURI, header: r.Header.Clone(), body: string(b)})
	answer := in.answer
	in.mu.Unlock()
	status := http.StatusOK
	if answer != nil {
		status = answer(r, n)
	}
	w.WriteHeader(status)
}

func (in *inbox) list() []arrival {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.got)
}

// ids returns the delivery IDs of the arrivals, in order.
func (in *inbox) ids() []string {
	var ids []string
	for _, a := range in.list() {
		ids = append(ids, a.id())
	}
	return ids
}

// waitCount waits until n requests arrived.
func (in *inbox) waitCount(t testing.TB, n int) {
	t.Helper()
	testutil.WaitFor(t, deliveryWait, func() error {
		if got := len(in.list()); got < n {
			return fmt.Errorf("%d of %d deliveries arrived", got, n)
		}
		return nil
	})
}

// check fails the test unless a is h, byte for byte: method, path and
// query (the route's prefix replaced), every header the provider set, and
// the body; and it carries h's ID as X-Tether-Delivery.
func (a arrival) check(t testing.TB, h ghHook) {
	t.Helper()
	wantURI := strings.TrimPrefix(h.uri, "/webhooks")
	if a.method != http.MethodPost || a.uri != wantURI || a.body != h.body || a.id() != h.id {
		t.Errorf("delivery %s %s id %s body %q; want POST %s id %s body %q", a.method, a.uri, a.id(), a.body, wantURI, h.id, h.body)
	}
	for k, v := range h.header {
		if got := a.header.Values(k); !slices.Equal(got, v) {
			t.Errorf("delivery %s: header %s is %q, want %q as sent", h.id, k, got, v)
		}
	}
	if got := a.header.Get("Content-Length"); got != strconv.Itoa(len(h.body)) {
		t.Errorf("delivery %s: Content-Length %q, want %d", h.id, got, len(h.body))
	}
}

// checkExactlyOnce fails the test unless the inbox got hooks, in order,
// each once, byte for byte.
func (in *inbox) checkExactlyOnce(t testing.TB, hooks []ghHook) {
	t.Helper()
	got := in.list()
	if len(got) != len(hooks) {
		t.Fatalf("%d deliveries arrived, want %d each once: %v", len(got), len(hooks), in.ids())
	}
	for i, a := range got {
		a.check(t, hooks[i])
	}
}

// knownThenDown starts a client of tunnel with a buffered /webhooks route
// to events on s, then stops it: the server knows the tunnel and its
// routes, and no session serves it.
func knownThenDown(t testing.TB, s *server, o clientOpts) {
	t.Helper()
	startClient(t, s, o).stop()
}

// sendAll POSTs n hooks for tunnel at once and returns the answers.
func sendAll(t testing.TB, s *server, tunnel, marker string, n int) []response {
	t.Helper()
	answers := make([]response, n)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			var err error
			if answers[i], err = s.trySend(t, tunnel, newHook(marker, i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return answers
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

// TestWebhooksGitHubThroughRestarts: ten GitHub pushes while the tunnel is
// down are each answered 202 with their own ID; the server then stops
// gracefully and is started again, then is killed and started again; once
// the client is back every push is delivered, in order, each once, with
// GitHub's headers and body byte for byte (its signature still checks) and
// the ID of its 202. Meanwhile a GET to the route, a POST to a route
// without the buffer option and a POST for a tunnel the server never saw
// get today's answers, and nothing is stored for them.
func TestWebhooksGitHubThroughRestarts(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	dataDir := t.TempDir()
	serverArgs := serverOpts{args: []string{"--data-dir", dataDir, "--log-level", "info"}}
	s := startServer(t, k, serverArgs)
	var in inbox
	events := in.start(t)
	app := newBackend(t, "app", nil)
	routes := []string{"/=" + app.url(), "/webhooks=" + events.url() + "/"}
	token := writeToken(t, k.issue(t, "acme", time.Hour))
	knownThenDown(t, s, clientOpts{tokenFile: token, routes: routes})
	s.waitNoSession(t, "acme")

	marker := randomMarker()
	hooks := bufferWaves(t, "acme", marker, 10, 5, func(int) *server { return s })
	for i := 1; i < len(hooks); i++ {
		if hooks[i].id == hooks[i-1].id {
			t.Fatalf("two webhooks got ID %s", hooks[i].id)
		}
	}

	if r := s.mustGet(t, "acme", "/webhooks/push"); r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != "tunnel_down" ||
		r.header.Get(webhook.BufferedHeader) != "" {
		t.Errorf("GET to the buffered route while down: %d %v; want today's 503 tunnel_down", r.code, r.header)
	}
	unbuffered := newHook(marker, 100)
	unbuffered.uri = "/api/push"
	if r := s.send(t, "acme", unbuffered); r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != "tunnel_down" ||
		r.header.Get(webhook.BufferedHeader) != "" {
		t.Errorf("POST to a route without the buffer option while down: %d %v; want today's 503 tunnel_down", r.code, r.header)
	}
	if r := s.send(t, "ghost", newHook(marker, 101)); r.code == http.StatusAccepted || r.header.Get(webhook.BufferedHeader) != "" {
		t.Errorf("POST for a tunnel the server never saw: %d %v %s; want it not buffered", r.code, r.header, r.body)
	}
	if l := s.bufferList(t, "ghost"); len(l) != 0 {
		t.Errorf("the unknown tunnel's buffer lists %+v; want nothing", l)
	}

	// queued checks that the buffer lists the ten hooks, queued, in order.
	queued := func(when string) {
		t.Helper()
		l := s.bufferList(t, "acme")
		var ids []string
		for _, e := range l {
			ids = append(ids, e.ID)
			if e.State != buffer.Queued || e.Method != http.MethodPost || e.Path != "/webhooks/push" || e.Size < int64(len(hooks[0].body)) {
				t.Errorf("%s: buffered request %+v; want a queued POST /webhooks/push", when, e)
			}
		}
		if want := hookIDs(hooks); !slices.Equal(ids, want) {
			t.Fatalf("%s: the buffer lists %v, want %v", when, ids, want)
		}
	}
	queued("before the restarts")
	if ti, ok := s.tunnels(t)["acme"]; !ok || ti.Buffer == nil || ti.Buffer.Queued != len(hooks) || ti.Buffer.Bytes <= 0 {
		t.Errorf("/api/tunnels while down lists acme as %+v; want its %d queued webhooks", ti, len(hooks))
	}

	s.stop()
	if code, ok := s.wait(stopTimeout); !ok || code != 0 {
		t.Fatalf("server exited %d after SIGTERM; want 0", code)
	}
	s = startServer(t, k, serverArgs)
	queued("after a graceful restart")
	s.kill()
	s = startServer(t, k, serverArgs)
	queued("after a kill -9")

	back := time.Now()
	startClient(t, s, clientOpts{tokenFile: token, routes: routes})
	in.waitCount(t, len(hooks))
	t.Logf("the ten webhooks were delivered %v after the client was started", time.Since(back).Round(time.Millisecond))
	s.waitDrained(t, "acme")
	in.checkExactlyOnce(t, hooks)
	for _, a := range in.list() {
		mac := hmac.New(sha256.New, []byte(hookSecret))
		mac.Write([]byte(a.body))
		if !hmac.Equal([]byte(a.header.Get("X-Hub-Signature-256")), []byte("sha256="+hex.EncodeToString(mac.Sum(nil)))) {
			t.Errorf("delivery %s: the signature does not check against the body", a.id())
		}
		if a.attempt() != 1 {
			t.Errorf("delivery %s: X-Tether-Attempt %d, want 1", a.id(), a.attempt())
		}
	}
	if n := app.hits.Load(); n != 0 {
		t.Errorf("the app behind the unbuffered route got %d requests; want none", n)
	}
}

func hookIDs(hooks []ghHook) []string {
	var ids []string
	for _, h := range hooks {
		ids = append(ids, h.id)
	}
	return ids
}

// TestWebhooksUpstreamAnswers: what the upstream answers a delivery
// decides what becomes of it. A 400 rejects it: listed as rejected, kept
// until the API requeues it, then delivered once the upstream takes it. A
// 500 retries it, X-Tether-Attempt counting the tries, until a 2xx. An
// upstream that refuses connections while the client is up gets its
// webhook buffered, and delivered once it listens.
func TestWebhooksUpstreamAnswers(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	s := startServer(t, k, serverOpts{args: []string{"--data-dir", t.TempDir(), "--log-level", "info"}})
	marker := randomMarker()

	t.Run("rejected then requeued", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		status := http.StatusBadRequest
		in := &inbox{answer: func(*http.Request, int) int {
			mu.Lock()
			defer mu.Unlock()
			return status
		}}
		events := in.start(t)
		o := clientOpts{tokenFile: writeToken(t, k.issue(t, "rejects", time.Hour)), routes: []string{"/webhooks=" + events.url() + "/"}}
		knownThenDown(t, s, o)
		s.waitNoSession(t, "rejects")
		h := s.buffer(t, "rejects", newHook(marker, 0))
		startClient(t, s, o)

		var entry buffer.Entry
		testutil.WaitFor(t, deliveryWait, func() error {
			l := s.bufferList(t, "rejects")
			if len(l) != 1 || l[0].State != buffer.Rejected {
				return fmt.Errorf("the buffer lists %+v; want %s rejected", l, h.id)
			}
			entry = l[0]
			return nil
		})
		if entry.ID != h.id || entry.Attempts != 1 || !strings.Contains(entry.LastError, "400") || entry.Method != http.MethodPost || entry.Path != "/webhooks/push" {
			t.Errorf("rejected entry %+v; want %s, POST /webhooks/push, 1 attempt, the 400 as its error", entry, h.id)
		}
		if got := len(in.list()); got != 1 {
			t.Fatalf("%d deliveries of a rejected webhook; want 1", got)
		}
		in.list()[0].check(t, h)

		if r := s.adminDo(t, http.MethodPost, "/api/tunnels/rejects/buffer/no-such-id/retry"); r.code != http.StatusNotFound {
			t.Errorf("retry of an unknown ID: %d %s; want 404", r.code, r.body)
		}
		mu.Lock()
		status = http.StatusAccepted
		mu.Unlock()
		r := s.adminDo(t, http.MethodPost, "/api/tunnels/rejects/buffer/"+h.id+"/retry")
		var rq struct{ Tunnel, Requeued string }
		if err := json.Unmarshal([]byte(r.body), &rq); r.code != http.StatusOK || err != nil || rq.Tunnel != "rejects" || rq.Requeued != h.id {
			t.Fatalf("POST …/buffer/%s/retry: %d %s; want 200 {tunnel, requeued}", h.id, r.code, r.body)
		}
		in.waitCount(t, 2)
		s.waitDrained(t, "rejects")
		got := in.list()
		if len(got) != 2 {
			t.Fatalf("%d deliveries; want the rejected one and the requeued one", len(got))
		}
		got[1].check(t, h)
		if got[1].attempt() != 2 {
			t.Errorf("requeued delivery: X-Tether-Attempt %d, want 2", got[1].attempt())
		}
	})

	t.Run("500 retried", func(t *testing.T) {
		t.Parallel()
		const failures = 2
		in := &inbox{answer: func(_ *http.Request, i int) int {
			if i < failures {
				return http.StatusInternalServerError
			}
			return http.StatusOK
		}}
		events := in.start(t)
		o := clientOpts{tokenFile: writeToken(t, k.issue(t, "fails", time.Hour)), routes: []string{"/webhooks=" + events.url() + "/"}}
		knownThenDown(t, s, o)
		s.waitNoSession(t, "fails")
		hooks := []ghHook{s.buffer(t, "fails", newHook(marker, 0)), s.buffer(t, "fails", newHook(marker, 1))}
		back := time.Now()
		startClient(t, s, o)
		in.waitCount(t, failures+2)
		s.waitDrained(t, "fails")
		t.Logf("delivered through %d answers 500 in %v", failures, time.Since(back).Round(time.Millisecond))
		got := in.list()
		if len(got) != failures+2 {
			t.Fatalf("%d deliveries (%v); want %d of the first webhook and 1 of the second", len(got), in.ids(), failures+1)
		}
		for i, a := range got {
			want, attempt := hooks[0], i+1
			if i > failures {
				want, attempt = hooks[1], 1
			}
			a.check(t, want)
			if a.attempt() != attempt {
				t.Errorf("delivery %d of %s: X-Tether-Attempt %d, want %d", i, a.id(), a.attempt(), attempt)
			}
		}
	})

	t.Run("upstream refusing connections", func(t *testing.T) {
		t.Parallel()
		var in inbox
		port := freePort(t)
		o := clientOpts{tokenFile: writeToken(t, k.issue(t, "refuses", time.Hour)),
			routes: []string{fmt.Sprintf("/webhooks=http://127.0.0.1:%d/", port)}}
		startClient(t, s, o)
		h := s.buffer(t, "refuses", newHook(marker, 0))
		in.startOn(t, port)
		in.waitCount(t, 1)
		s.waitDrained(t, "refuses")
		in.checkExactlyOnce(t, []ghHook{h})
	})
}

// TestWebhooksQuotas: a tunnel's quota full answers 503 buffer_full; an
// attacker who POSTs to one tunnel while it is down fills only that
// tunnel's quota, and another tunnel that is down still gets 202. The
// server-wide cap answers buffer_full for every tunnel. The bodies are
// tenant data: they appear in no log, in no tether status output, in no
// listing of the admin API.
func TestWebhooksQuotas(t *testing.T) {
	t.Parallel()
	const quota = 3
	k := newKeys(t)
	s := startServer(t, k, serverOpts{args: []string{"--data-dir", t.TempDir(), "--buffer-max-requests", strconv.Itoa(quota)}})
	var in inbox
	events := in.start(t)
	routes := []string{"/webhooks=" + events.url() + "/"}
	for _, name := range []string{"victim", "bystander"} {
		knownThenDown(t, s, clientOpts{tokenFile: writeToken(t, k.issue(t, name, time.Hour)), routes: routes})
		s.waitNoSession(t, name)
	}

	// The attacker's requests go at once: the entry holds each for its
	// reconnect wait before it stores it.
	const attack = quota + 5
	marker := randomMarker()
	answers := sendAll(t, s, "victim", marker, attack)
	var accepted, full int
	for _, r := range answers {
		switch {
		case r.code == http.StatusAccepted && r.header.Get(webhook.BufferedHeader) != "":
			accepted++
		case r.code == http.StatusServiceUnavailable && r.header.Get("X-Tether-Error") == webhook.CodeBufferFull &&
			r.header.Get(webhook.BufferedHeader) == "" && strings.Contains(r.body, "victim"):
			full++
		default:
			t.Errorf("POST for victim: %d %v %q; want 202, or 503 buffer_full naming the tunnel", r.code, r.header, r.body)
		}
	}
	if accepted != quota || full != attack-quota {
		t.Fatalf("%d POSTs for victim: %d stored and %d buffer_full; want %d and %d", attack, accepted, full, quota, attack-quota)
	}
	s.buffer(t, "bystander", newHook(marker, 100))
	if got := s.metric(t, "tether_buffer_requests_total", "outcome", "full"); got != attack-quota {
		t.Errorf("tether_buffer_requests_total{outcome=full} = %v, want %d", got, attack-quota)
	}

	// Where the bodies must not show.
	exposed := map[string]string{"the server's output": s.Output()}
	for _, path := range []string{"/api/tunnels", "/api/tunnels/victim/buffer", "/api/tunnels/bystander/buffer", "/metrics"} {
		r := s.adminDo(t, http.MethodGet, path)
		exposed["GET "+path] = r.body
	}
	for _, args := range [][]string{{}, {"-o", "json"}, {"-o", "wide"}} {
		code, stdout, stderr := runTether(t, nil, append([]string{"status", "--admin", s.adminAddr}, args...)...)
		if code != 0 {
			t.Fatalf("tether status %v: exit %d: %s", args, code, stderr)
		}
		if !strings.Contains(stdout, "victim") {
			t.Errorf("tether status %v does not list the victim's buffer: %s", args, stdout)
		}
		exposed[fmt.Sprintf("tether status %v", args)] = stdout + stderr
	}
	for where, text := range exposed {
		if strings.Contains(text, marker) {
			t.Errorf("a buffered body appears in %s", where)
		}
	}
}

// TestWebhooksServerWideCap: past --buffer-max-total-bytes every tunnel's
// webhooks are answered buffer_full, one that has stored nothing
// included.
func TestWebhooksServerWideCap(t *testing.T) {
	t.Parallel()
	const maxBytes = 4096 // a tunnel's quota and the server's: one tunnel fills both
	k := newKeys(t)
	s := startServer(t, k, serverOpts{args: []string{"--data-dir", t.TempDir(), "--log-level", "info",
		"--buffer-max-body", "1024", "--buffer-max-bytes", strconv.Itoa(maxBytes), "--buffer-max-total-bytes", strconv.Itoa(maxBytes)}})
	var in inbox
	events := in.start(t)
	routes := []string{"/webhooks=" + events.url() + "/"}
	for _, name := range []string{"hog", "starved"} {
		knownThenDown(t, s, clientOpts{tokenFile: writeToken(t, k.issue(t, name, time.Hour)), routes: routes})
		s.waitNoSession(t, name)
	}
	// Sent at once: the entry holds each for its reconnect wait before it
	// stores it.
	const most = 20 // more than maxBytes holds
	marker := randomMarker()
	stored := 0
	for _, r := range sendAll(t, s, "hog", marker, most) {
		switch {
		case r.code == http.StatusAccepted:
			stored++
		case r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != webhook.CodeBufferFull:
			t.Fatalf("POST for hog: %d %v %q; want 202 or 503 buffer_full", r.code, r.header, r.body)
		}
	}
	if stored == 0 || stored == most {
		t.Fatalf("stored %d of %d webhooks of hog under caps of %d bytes; want the caps to stop some", stored, most, maxBytes)
	}
	hook := newHook(marker, most)
	r := s.send(t, "starved", hook)
	if r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != webhook.CodeBufferFull {
		t.Errorf("POST for a tunnel with nothing stored, past the server-wide cap: %d %v %q; want 503 buffer_full", r.code, r.header, r.body)
	}
	if l := s.bufferList(t, "starved"); len(l) != 0 {
		t.Errorf("starved's buffer lists %+v past the server-wide cap; want nothing", l)
	}
}
