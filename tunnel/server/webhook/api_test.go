package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/buffer"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// adminToken stands for the server's admin-token check around the
// endpoints.
const adminToken = "admin-secret"

func requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+adminToken {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// testAPI serves r's admin endpoints on loopback.
func testAPI(t testing.TB, r *replica) string {
	t.Helper()
	mux := http.NewServeMux()
	r.Register(mux, requireToken)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// call makes an admin request and returns its status and body.
func call(t testing.TB, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func listing(t testing.TB, api, tunnel string) Listing {
	t.Helper()
	status, body := call(t, http.MethodGet, api+"/api/tunnels/"+tunnel+"/buffer")
	if status != http.StatusOK {
		t.Fatalf("GET buffer: %d %s", status, body)
	}
	var l Listing
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatalf("GET buffer: %v in %s", err, body)
	}
	return l
}

// tenantSecrets are what a listing, a log line or a metric must never
// show: the body, the query, the headers' values, credentials above all.
var tenantSecrets = []string{bodyMarker, "q-secret", "sha256=", "GitHub-Hookshot", "292430182", authSecret, cookieSecret}

func showsSecret(s string) string {
	for _, secret := range tenantSecrets {
		if strings.Contains(s, secret) {
			return secret
		}
	}
	return ""
}

// TestRejectListRequeue: a 4xx from the upstream rejects the request and
// delivery goes on with the next; the admin API lists it (metadata only),
// requeues it, and it is then delivered with its attempt counted; DELETE
// drops one or all.
func TestRejectListRequeue(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		r := newReplica(t, s.backing(t, "a"), Config{}, nil, nil, "acme")
		api := testAPI(t, r)
		first := offer(t, r, githubHook(t, "", "acme", 0))
		second := offer(t, r, githubHook(t, "", "acme", 1))
		refuse := true
		r.sender.setAnswer(func(_ context.Context, sr seenRequest) (Answer, error) {
			if sr.id() == first && refuse {
				return Answer{Status: http.StatusBadRequest}, nil
			}
			return Answer{Status: http.StatusNoContent}, nil
		})
		r.sender.serve("acme", true)
		r.run(t)
		r.Kick("acme")
		r.up.waitDeliveries(t, 2)
		var l Listing
		testutil.WaitFor(t, 10*time.Second, func() error {
			if l = listing(t, api, "acme"); len(l.Requests) != 1 {
				return fmt.Errorf("listing %+v, want the rejected request alone", l)
			}
			return nil
		})
		e := l.Requests[0]
		if e.ID != first || e.State != buffer.Rejected || e.Attempts != 1 || e.Method != http.MethodPost ||
			e.Path != "/webhooks/github" || e.Size == 0 || e.LastError != "the upstream answered 400 Bad Request" {
			t.Errorf("rejected entry %+v, want %s rejected after 1 attempt by a 400", e, first)
		}
		_, raw := call(t, http.MethodGet, api+"/api/tunnels/acme/buffer")
		if secret := showsSecret(raw); secret != "" {
			t.Errorf("the listing shows %q: %s", secret, raw)
		}
		if status, body := call(t, http.MethodPost, api+"/api/tunnels/acme/buffer/"+second+"/retry"); status != http.StatusNotFound {
			t.Errorf("retry of a delivered request: %d %s, want 404", status, body)
		}

		r.sender.setAnswer(func(context.Context, seenRequest) (Answer, error) { return Answer{Status: http.StatusOK}, nil })
		if status, body := call(t, http.MethodPost, api+"/api/tunnels/acme/buffer/"+first+"/retry"); status != http.StatusOK || !strings.Contains(body, first) {
			t.Fatalf("retry: %d %s, want 200", status, body)
		}
		got := r.up.waitDeliveries(t, 3)
		if last := got[2]; last.id() != first || last.attempt() != "2" {
			t.Errorf("after the retry: delivered %s attempt %s, want %s attempt 2", last.id(), last.attempt(), first)
		}
		testutil.WaitFor(t, 10*time.Second, func() error {
			if l := listing(t, api, "acme"); len(l.Requests) != 0 {
				return fmt.Errorf("listing %+v, want none", l)
			}
			return nil
		})

		// Dropping: one, then all.
		r.sender.serve("acme", false)
		ids := []string{offer(t, r, githubHook(t, "", "acme", 2)), offer(t, r, githubHook(t, "", "acme", 3)), offer(t, r, githubHook(t, "", "acme", 4))}
		if l := listing(t, api, "acme"); len(l.Requests) != 3 || l.Requests[0].State != buffer.Queued {
			t.Fatalf("listing %+v, want 3 queued", l)
		}
		if status, body := call(t, http.MethodDelete, api+"/api/tunnels/acme/buffer/"+ids[1]); status != http.StatusOK || !strings.Contains(body, `"dropped": 1`) {
			t.Errorf("DELETE one: %d %s", status, body)
		}
		if status, body := call(t, http.MethodDelete, api+"/api/tunnels/acme/buffer/"+ids[1]); status != http.StatusNotFound {
			t.Errorf("DELETE it again: %d %s, want 404", status, body)
		}
		if status, body := call(t, http.MethodDelete, api+"/api/tunnels/acme/buffer"); status != http.StatusOK || !strings.Contains(body, `"dropped": 2`) {
			t.Errorf("DELETE all: %d %s", status, body)
		}
		if l := listing(t, api, "acme"); len(l.Requests) != 0 {
			t.Errorf("listing after DELETE %+v, want none", l)
		}
		if c := r.buf.Counts(); c.Dropped != 3 || c.Rejected != 1 || c.Delivered != 2 {
			t.Errorf("counts %+v, want 3 dropped, 1 rejected, 2 delivered", c)
		}
	})
}

// TestAPIRefuses: the endpoints sit behind the wrapper they are given, and
// refuse what names no tunnel.
func TestAPIRefuses(t *testing.T) {
	r := newReplica(t, registryBacking(t), Config{}, nil, nil)
	api := testAPI(t, r)
	resp, err := http.Get(api + "/api/tunnels/acme/buffer")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without the admin token: %d, want 401", resp.StatusCode)
	}
	for _, name := range []string{"ACME", "a_b", "-a", strings.Repeat("a", 64)} {
		if status, body := call(t, http.MethodGet, api+"/api/tunnels/"+name+"/buffer"); status != http.StatusBadRequest {
			t.Errorf("GET %s: %d %s, want 400", name, status, body)
		}
	}
	if l := listing(t, api, "nobody"); l.Tunnel != "nobody" || l.Requests == nil || len(l.Requests) != 0 {
		t.Errorf("an empty buffer: %+v, want an empty list", l)
	}
}

// TestSummaries: per tunnel, what /api/tunnels and tether status show.
func TestSummaries(t *testing.T) {
	r := newReplica(t, registryBacking(t), Config{}, nil, nil, "acme", "other")
	start := time.Now().Add(-time.Millisecond)
	offer(t, r, githubHook(t, "", "acme", 0))
	offer(t, r, githubHook(t, "", "acme", 1))
	offer(t, r, githubHook(t, "", "other", 0))
	all, err := r.Summaries(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	acme := all["acme"]
	if len(all) != 2 || acme.Queued != 2 || acme.Rejected != 0 || acme.Bytes < 2*400 || acme.Oldest.Before(start.Truncate(time.Millisecond)) || all["other"].Queued != 1 {
		t.Errorf("summaries %+v, want acme 2 queued and other 1", all)
	}
	one, err := r.Summary(t.Context(), "acme")
	if err != nil || one != acme {
		t.Errorf("summary of acme %+v %v, want %+v", one, err, acme)
	}
	if none, err := r.Summary(t.Context(), "nobody"); err != nil || none != (Summary{}) {
		t.Errorf("summary of an empty buffer %+v %v, want zero", none, err)
	}
	b, err := json.Marshal(Summary{Queued: 1, Bytes: 2, Oldest: time.Unix(0, 0).UTC(), OldestAgeSeconds: 3})
	if err != nil || string(b) != `{"queued":1,"rejected":0,"bytes":2,"oldest":"1970-01-01T00:00:00Z","oldest_age_seconds":3}` {
		t.Errorf("summary as JSON: %s %v", b, err)
	}
}

// TestMetrics: the outcome counters exist from the start; the gauges show
// each tunnel's stored requests by state, bytes and the oldest one's age.
func TestMetrics(t *testing.T) {
	r := newReplica(t, registryBacking(t), Config{}, nil, nil, "acme")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.Collector())
	outcomes := func(accepted, rejected int) map[string]float64 {
		m := map[string]float64{}
		for _, o := range []string{"accepted", "full", "delivered", "rejected", "expired", "dropped"} {
			m[fmt.Sprintf(`tether_buffer_requests_total{outcome=%q}`, o)] = 0
		}
		m[`tether_buffer_requests_total{outcome="accepted"}`] = float64(accepted)
		m[`tether_buffer_requests_total{outcome="rejected"}`] = float64(rejected)
		return m
	}
	if got, want := gather(t, reg), outcomes(0, 0); !maps.Equal(got, want) {
		t.Errorf("at start: %v\nwant %v", got, want)
	}
	id := offer(t, r, githubHook(t, "", "acme", 0))
	offer(t, r, githubHook(t, "", "acme", 1))
	l, err := r.buf.Acquire(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Reject(t.Context(), id, "the upstream answered 400 Bad Request"); err != nil {
		t.Fatal(err)
	}
	st, err := r.buf.Stats(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	want := outcomes(2, 1)
	want[`tether_buffered_requests{state="queued",tunnel="acme"}`] = 1
	want[`tether_buffered_requests{state="rejected",tunnel="acme"}`] = 1
	want[`tether_buffered_bytes{tunnel="acme"}`] = float64(st.Bytes)
	got := gather(t, reg)
	const oldest = `tether_buffer_oldest_age_seconds{tunnel="acme"}`
	if age, ok := got[oldest]; !ok || age < 0 || age > time.Since(st.Oldest).Seconds() {
		t.Errorf("%s = %v (present %v), want the age of the oldest request, at most %v", oldest, age, ok, time.Since(st.Oldest).Seconds())
	}
	delete(got, oldest)
	if !maps.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

// gather returns each series of reg and its value.
func gather(t testing.TB, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// registryBacking is a data directory for one test.
func registryBacking(t testing.TB) registry.Backing {
	return registry.Backing{Store: openStore(t, t.TempDir())}
}

// TestNoTenantDataInLogs: neither bodies nor header values nor queries
// appear in any log line, at any level, through acceptance, retries,
// rejection, the admin API and delivery.
func TestNoTenantDataInLogs(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	r := newReplica(t, registryBacking(t), Config{RetryFirst: time.Millisecond, RetryMax: time.Millisecond}, zap.New(core), nil, "acme")
	api := testAPI(t, r)
	base := testEntry(t, r.Forwarder)
	for n := range 3 {
		post(t, githubHook(t, base, "acme", n))
	}
	calls := 0
	r.sender.setAnswer(func(context.Context, seenRequest) (Answer, error) {
		calls++
		switch calls {
		case 1:
			return Answer{Status: http.StatusInternalServerError}, nil
		case 2:
			return Answer{Status: http.StatusBadRequest}, nil
		}
		return Answer{Status: http.StatusOK}, nil
	})
	r.sender.serve("acme", true)
	r.run(t)
	r.Kick("acme")
	r.up.waitDeliveries(t, 4)
	l := listing(t, api, "acme")
	if len(l.Requests) == 1 {
		call(t, http.MethodPost, api+"/api/tunnels/acme/buffer/"+l.Requests[0].ID+"/retry")
	}
	call(t, http.MethodDelete, api+"/api/tunnels/acme/buffer")
	entries := logs.All()
	if len(entries) < 5 {
		t.Fatalf("%d log lines; the test means to look at more", len(entries))
	}
	for _, e := range entries {
		line := e.Message + fmt.Sprint(e.ContextMap())
		if secret := showsSecret(line); secret != "" {
			t.Errorf("a log line shows %q: %s", secret, line)
		}
	}
	messages := slices.Collect(func(yield func(string) bool) {
		for _, e := range entries {
			if !yield(e.Message) {
				return
			}
		}
	})
	for _, want := range []string{"request buffered", "buffered request not delivered; retrying", "buffered request delivered"} {
		if !slices.Contains(messages, want) {
			t.Errorf("no %q log line among %q", want, messages)
		}
	}
}

// TestBufferingOff: without a data directory or Redis, New says buffering
// is off, and the nil Forwarder the server keeps then does nothing.
func TestBufferingOff(t *testing.T) {
	routes, err := registry.NewRoutes(registry.RoutesConfig{}, registry.Backing{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	f, err := New(Config{}, registry.Backing{}, routes, newFakeSender(&upstream{}), zap.NewNop())
	if !errors.Is(err, buffer.ErrDisabled) || f != nil || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("New without a store: %v, %v; want buffer.ErrDisabled naming --data-dir", f, err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/webhooks/github", strings.NewReader("{}"))
	if f.Offer(rec, req, "acme") || rec.Code != http.StatusOK || rec.Body.Len() != 0 || len(rec.Header()) != 0 {
		t.Errorf("Offer on a nil Forwarder answered %d %q", rec.Code, rec.Body)
	}
	f.Kick("acme")
	if all, err := f.Summaries(t.Context()); all != nil || err != nil {
		t.Errorf("Summaries on a nil Forwarder: %v %v", all, err)
	}
}

// TestConfigRefused: New reports every problem of its configuration,
// naming the flags.
func TestConfigRefused(t *testing.T) {
	cfg := Config{MaxBody: 2 << 20, Buffer: buffer.Config{MaxBytes: 1 << 20}, BodyIdleTimeout: -1, RetryFirst: time.Minute, RetryMax: time.Second}
	_, err := New(cfg, registryBacking(t), nil, nil, zap.NewNop())
	for _, want := range []string{"--buffer-max-body 2097152 is above --buffer-max-bytes 1048576", "--body-idle-timeout -1ns", "retry backoff 1m0s to 1s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v; want it to say %q", err, want)
		}
	}
}
