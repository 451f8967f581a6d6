package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

func TestMain(m *testing.M) {
	registry.BridgeRedisLog(zap.NewNop())
	goleak.VerifyTestMain(m)
}

// webhookRoutes are the routes the test tunnels advertise: the default
// ones (/webhooks buffers) and a route that does not buffer.
var webhookRoutes = []string{
	"/=http://app-proxy:8080",
	"/webhooks=http://webhook-eventsource-svc:12000/",
	"/api=http://api:80",
}

// store is where a test keeps the buffer: the data directory or Redis.
type store struct {
	name string
	// backing returns the Backing of replica id; every call of one store
	// shares its data.
	backing func(t testing.TB, id string) registry.Backing
}

// stores are a bbolt file in a temp dir and a Redis started for the test.
func stores() []store {
	return []store{
		{"data-dir", func() func(testing.TB, string) registry.Backing {
			var s *registry.Store
			return func(t testing.TB, _ string) registry.Backing {
				if s == nil {
					s = openStore(t, t.TempDir())
				}
				return registry.Backing{Store: s}
			}
		}()},
		{"redis", func() func(testing.TB, string) registry.Backing {
			var url string
			return func(t testing.TB, id string) registry.Backing {
				if url == "" {
					url = testutil.StartRedis(t).URL()
				}
				return registry.Backing{Redis: redisConn(t, url, id)}
			}
		}()},
	}
}

// forEachStore runs test against each store, each with its own data.
func forEachStore(t *testing.T, test func(t *testing.T, s store)) {
	for _, s := range stores() {
		t.Run(s.name, func(t *testing.T) { test(t, s) })
	}
}

func openStore(t testing.TB, dir string) *registry.Store {
	t.Helper()
	s, err := registry.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func redisConn(t testing.TB, url, id string) *registry.RedisConn {
	t.Helper()
	conn, err := registry.NewRedisConn(registry.Config{URL: url, Replica: id, Addr: id + ".peers.test:7443"}, "")
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// replica is one server's Forwarder, its remembered routes and its
// stand-in for the sessions.
type replica struct {
	*Forwarder
	routes *registry.Routes
	sender *fakeSender
	up     *upstream
}

// newReplica makes a replica's Forwarder on backing, whose deliveries
// reach up (a new one if nil); the tunnels in seen logged in with
// webhookRoutes.
func newReplica(t testing.TB, backing registry.Backing, cfg Config, log *zap.Logger, up *upstream, seen ...string) *replica {
	t.Helper()
	if log == nil {
		log = zaptest.NewLogger(t)
	}
	if up == nil {
		up = &upstream{}
	}
	routes, err := registry.NewRoutes(registry.RoutesConfig{}, registry.Backing{}, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, tunnel := range seen {
		if err := routes.Remember(tunnel, webhookRoutes); err != nil {
			t.Fatal(err)
		}
	}
	sender := newFakeSender(up)
	f, err := New(cfg, backing, routes, sender, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &replica{Forwarder: f, routes: routes, sender: sender, up: up}
}

// run runs the Forwarder until the test ends, or until the returned stop
// is called; stop waits for Run to return.
func (r *replica) run(t testing.TB) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// tunnelDownEntry is a public entry for tunnels at <tunnel>.tunnels.test
// that none serves: it sets X-Forwarded-* as the server's entry does,
// offers each request to f, and answers what the server would otherwise.
func tunnelDownEntry(f *Forwarder) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tunnel, _, _ := strings.Cut(r.Host, ".")
		r.Header["X-Forwarded-For"] = []string{"192.0.2.7"}
		r.Header["X-Forwarded-Host"] = []string{r.Host}
		r.Header["X-Forwarded-Proto"] = []string{"https"}
		if !f.Offer(w, r, tunnel) {
			proxy.WriteError(w, http.StatusServiceUnavailable, "tunnel_down", "tether: tunnel "+tunnel+" is not connected")
		}
	})
}

// hookSecret signs the test webhooks, as a Git provider does.
const hookSecret = "It's a Secret to Everybody"

// authSecret and cookieSecret are the credentials of every test webhook.
const (
	authSecret   = "aG9vazpjcmVkLTdiMmU="
	cookieSecret = "cookie-secret-91c4"
)

// bodyMarker is in every test webhook's body, so that a test can look for
// bodies where they must not be.
const bodyMarker = "BODY-MARKER-5f3a"

// githubHook is the n-th GitHub-style push webhook for tunnel: a JSON
// body, its signature and GitHub's headers.
func githubHook(t testing.TB, base, tunnel string, n int) *http.Request {
	t.Helper()
	body := fmt.Appendf(nil, `{"ref":"refs/heads/main","n":%d,"marker":%q,"bytes":"\u00e9\r\n"}`, n, bodyMarker)
	req, err := http.NewRequest(http.MethodPost, base+fmt.Sprintf("/webhooks/github?n=%d&token=q-secret", n), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = tunnel + ".tunnels.test"
	mac := hmac.New(sha256.New, []byte(hookSecret))
	mac.Write(body)
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "GitHub-Hookshot/044aadd")
	h.Set("X-GitHub-Event", "push")
	h.Set("X-GitHub-Delivery", fmt.Sprintf("72d3162e-cc78-11e3-81ab-%012d", n))
	h.Set("X-GitHub-Hook-ID", "292430182")
	h.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	h["X-Spaced"] = []string{"two  inner  spaces", "second"}
	// Credentials the upstream checks: delivered as they came, shown
	// nowhere else.
	h.Set("Authorization", "Basic "+authSecret)
	h.Set("Cookie", "session="+cookieSecret)
	return req
}

// validSignature reports whether r's body matches its X-Hub-Signature-256.
func validSignature(r seenRequest) bool {
	mac := hmac.New(sha256.New, []byte(hookSecret))
	mac.Write(r.body)
	return r.header.Get("X-Hub-Signature-256") == "sha256="+hex.EncodeToString(mac.Sum(nil))
}

// post sends req and returns the status, the X-Tether-Buffered and
// X-Tether-Error fields and the body.
func post(t testing.TB, req *http.Request) (status int, id, code string, body []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get(BufferedHeader), resp.Header.Get(proxy.ErrorHeader), body
}

// seenRequest is a delivery as the upstream saw it.
type seenRequest struct {
	tunnel, method, uri string
	header              http.Header
	body                []byte
	at                  time.Time
}

func (r seenRequest) id() string { return r.header.Get(DeliveryHeader) }

func (r seenRequest) attempt() string { return r.header.Get(AttemptHeader) }

// upstream records the deliveries that reached it, from any replica.
type upstream struct {
	mu   sync.Mutex
	seen []seenRequest
}

func (u *upstream) record(r seenRequest) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.seen = append(u.seen, r)
}

// deliveries returns what was delivered so far.
func (u *upstream) deliveries() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.seen)
}

// waitDeliveries waits until n deliveries were made, and returns them.
func (u *upstream) waitDeliveries(t testing.TB, n int) []seenRequest {
	t.Helper()
	var got []seenRequest
	testutil.WaitFor(t, 20*time.Second, func() error {
		if got = u.deliveries(); len(got) < n {
			return fmt.Errorf("%d deliveries, want %d", len(got), n)
		}
		return nil
	})
	return got
}

// fakeSender stands in for a replica's sessions: it serves the tunnels it
// is told to, records each delivery at its upstream, and answers what
// answer says (200 by default).
type fakeSender struct {
	up *upstream

	mu     sync.Mutex
	served map[string]bool
	answer func(ctx context.Context, r seenRequest) (Answer, error)
}

func newFakeSender(up *upstream) *fakeSender {
	return &fakeSender{up: up, served: map[string]bool{}}
}

func (s *fakeSender) serve(tunnel string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.served[tunnel] = on
}

func (s *fakeSender) setAnswer(fn func(ctx context.Context, r seenRequest) (Answer, error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answer = fn
}

func (s *fakeSender) Serves(tunnel string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served[tunnel]
}

func (s *fakeSender) Send(ctx context.Context, tunnel string, req *http.Request) (Answer, error) {
	if !s.Serves(tunnel) {
		return Answer{}, ErrNotServed
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return Answer{}, err
	}
	r := seenRequest{tunnel: tunnel, method: req.Method, uri: req.URL.RequestURI(), header: req.Header.Clone(), body: body, at: time.Now()}
	s.up.record(r)
	s.mu.Lock()
	answer := s.answer
	s.mu.Unlock()
	if answer == nil {
		return Answer{Status: http.StatusOK}, nil
	}
	return answer(ctx, r)
}

// ids are the delivery IDs of rs.
func ids(rs []seenRequest) []string {
	var list []string
	for _, r := range rs {
		list = append(list, r.id())
	}
	return list
}

// testEntry serves f's entry on loopback.
func testEntry(t testing.TB, f *Forwarder) string {
	t.Helper()
	srv := httptest.NewServer(tunnelDownEntry(f))
	t.Cleanup(srv.Close)
	return srv.URL
}
