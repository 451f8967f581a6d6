package server

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tether-dev/tether/internal/testutil"
)

// seenIDs is an upstream that records the X-Request-Id of each request.
type seenIDs struct {
	mu  sync.Mutex
	ids []string
}

func (s *seenIDs) handler(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.ids = append(s.ids, r.Header.Get(requestIDHeader))
	s.mu.Unlock()
	w.Header().Set(requestIDHeader, "the-upstream-s-own")
	fmt.Fprint(w, "hello")
}

func (s *seenIDs) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[len(s.ids)-1]
}

// accessLines returns the access log's lines so far, as maps of fields.
func accessLines(logs *observer.ObservedLogs) []map[string]any {
	var out []map[string]any
	for _, e := range logs.FilterLoggerName("access").All() {
		out = append(out, e.ContextMap())
	}
	return out
}

// waitAccessLine waits for the access log's line of the request with ID id.
func waitAccessLine(t testing.TB, logs *observer.ObservedLogs, id string) map[string]any {
	t.Helper()
	var line map[string]any
	testutil.WaitFor(t, 5*time.Second, func() error {
		for _, l := range accessLines(logs) {
			if l["request_id"] == id {
				line = l
				return nil
			}
		}
		return fmt.Errorf("no access log line with request_id %q in %v", id, accessLines(logs))
	})
	return line
}

func observedServer(t testing.TB, f *fleet, k *keys, id string) (*testServer, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Core(), core))
	if f == nil {
		return startServerWith(t, serverSetup{keys: k, log: log}, func(c *Config) { c.AccessLog, c.ReplicaID = true, id }), logs
	}
	secret := t.TempDir() + "/peer-secret"
	writeFile(t, secret, peerSecretForTests)
	peer := listen(t)
	return startServerWith(t, serverSetup{keys: k, log: log, opts: []Option{WithRegistry(f.replica(id, peer.Addr().String()))}, peer: peer},
		func(c *Config) { c.AccessLog, c.ReplicaID, c.PeerSecretFile = true, id, secret }), logs
}

// TestAccessLog: one line per public request, with what an operator needs
// to find it (tunnel, route, method, path, status, tether's error code,
// duration, bytes, request ID, replica) and nothing a caller could hide a
// secret in (no query string, no header). The request ID reaches the
// upstream and comes back to the caller: the caller's own when it is fit
// to log, a new one otherwise.
func TestAccessLog(t *testing.T) {
	s, logs := observedServer(t, nil, newKeys(t), "r1")
	up := &seenIDs{}
	s.startClientRoutes(t, "alpha", "/="+backend(t, "root").URL, "/api="+newHTTPTestServer(t, http.HandlerFunc(up.handler)).URL)

	req, _ := http.NewRequest(http.MethodPost, s.entry+"/api/items?token=s3cret-query", strings.NewReader("body-s3cret"))
	req.Host = "alpha." + testDomain
	req.Header.Set("Authorization", "Bearer s3cret-header")
	req.Header.Set(requestIDHeader, "caller-id-42")
	code, body, h := do(t, req)
	if code != http.StatusOK || body != "hello" {
		t.Fatalf("POST: %d %q", code, body)
	}
	if got := up.last(); got != "caller-id-42" {
		t.Errorf("the upstream saw X-Request-Id %q, want the caller's caller-id-42", got)
	}
	if got := h.Values(requestIDHeader); len(got) != 1 || got[0] != "caller-id-42" {
		t.Errorf("the caller got X-Request-Id %q, want the caller's caller-id-42 (not the upstream's)", got)
	}
	line := waitAccessLine(t, logs, "caller-id-42")
	want := map[string]any{
		"tunnel": "alpha", "route": "/api", "method": "POST", "path": "/api/items", "status": int64(200),
		"error": "", "bytes": int64(5), "replica": "r1", "forwarded": false,
	}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("access log %s = %#v, want %#v", k, line[k], v)
		}
	}
	if d, ok := line["duration"].(time.Duration); !ok || d <= 0 {
		t.Errorf("access log duration = %#v, want the time it took", line["duration"])
	}
	if all := fmt.Sprint(line); strings.Contains(all, "s3cret") {
		t.Errorf("the access log line holds a query, header or body value: %s", all)
	}

	// A request ID unfit to log is replaced; tether's own answers carry
	// their error code.
	for _, bad := range []string{strings.Repeat("x", maxRequestIDLen+1), "has space", "caf\xc3\xa9"} {
		req, _ = http.NewRequest(http.MethodGet, s.entry+"/nowhere", nil)
		req.Host = "elsewhere.example.com"
		req.Header.Set(requestIDHeader, bad)
		code, _, h = do(t, req)
		id := h.Get(requestIDHeader)
		if code != http.StatusNotFound || id == bad || !validRequestID(id) {
			t.Errorf("request ID %q: %d with X-Request-Id %q, want 404 with a new valid ID", bad, code, id)
			continue
		}
		line = waitAccessLine(t, logs, id)
		if line["tunnel"] != "" || line["status"] != int64(404) || line["error"] != "unknown_host" || line["route"] != "" {
			t.Errorf("access log of a request for no tunnel: %v", line)
		}
	}
	// Without one, the caller gets a new one, and so does the upstream.
	code, _, h = s.get(t, "alpha", "/api/x")
	if id := h.Get(requestIDHeader); code != http.StatusOK || !validRequestID(id) || up.last() != id {
		t.Errorf("without X-Request-Id: %d, the caller got %q, the upstream %q; want one new ID for both", code, id, up.last())
	}
}

// TestAccessLogForwarded: a request forwarded to the replica that serves
// its tunnel is logged once, by the replica that received it, as
// forwarded, and its request ID reaches the upstream through both.
func TestAccessLogForwarded(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a, aLogs := observedServer(t, f, k, "a")
	b, bLogs := observedServer(t, f, k, "b")
	up := &seenIDs{}
	a.runClient(t, "alpha", a.tunnel, 1, newHTTPTestServer(t, http.HandlerFunc(up.handler)).URL)
	a.waitSessions(t, "alpha", 1)
	b.waitHolders(t, "alpha", 1)
	code, _, h := b.get(t, "alpha", "/x")
	id := h.Get(requestIDHeader)
	if code != http.StatusOK || up.last() != id {
		t.Fatalf("through replica b: %d, the caller got X-Request-Id %q, the upstream %q", code, id, up.last())
	}
	line := waitAccessLine(t, bLogs, id)
	if line["forwarded"] != true || line["forwarded_to"] != "a" || line["replica"] != "b" || line["status"] != int64(200) {
		t.Errorf("b's access log of a request forwarded to a: %v", line)
	}
	for _, l := range accessLines(aLogs) {
		if l["request_id"] == id {
			t.Errorf("the replica a request was forwarded to logged it too: %v", l)
		}
	}
}

// BenchmarkAccessLog measures what the request ID and the access log add
// to each public request, over a handler that answers at once.
func BenchmarkAccessLog(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("log=%v", on), func(b *testing.B) {
			cfg := &Config{Domain: testDomain, ReplicaID: "r1", AccessLog: on}
			log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))
			h := newAccessLog(cfg, log).wrap(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
			req := httptest.NewRequest(http.MethodGet, "http://alpha."+testDomain+"/x?q=1", nil)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				delete(req.Header, requestIDHeader)
				h.ServeHTTP(w, req)
			}
		})
	}
}
