package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/buffer"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// TestAcceptAndDeliver: ten GitHub webhooks to a tunnel that is down are
// each answered 202 with an ID once stored; when the tunnel is served
// again they are delivered in order, each once, with their method, URI,
// headers and body byte for byte (the signature still valid), the entry's
// X-Forwarded-* and the delivery's ID and attempt.
func TestAcceptAndDeliver(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		r := newReplica(t, s.backing(t, "a"), Config{}, nil, nil, "acme")
		base := testEntry(t, r.Forwarder)
		var sent []*http.Request
		var accepted []string
		for n := range 10 {
			req := githubHook(t, base, "acme", n)
			sent = append(sent, req.Clone(context.Background()))
			start := time.Now().Add(-time.Millisecond)
			status, id, _, body := post(t, req)
			if status != http.StatusAccepted || id == "" {
				t.Fatalf("webhook %d: got %d %q %s, want 202 with X-Tether-Buffered", n, status, id, body)
			}
			var rc receipt
			if err := json.Unmarshal(body, &rc); err != nil || rc.ID != id || rc.Tunnel != "acme" || rc.QueuedAt.Before(start.Truncate(time.Millisecond)) {
				t.Fatalf("webhook %d: body %s (%v), want {id: %s, tunnel: acme, queued_at: now}", n, body, err, id)
			}
			accepted = append(accepted, id)
		}
		if !slices.IsSorted(accepted) || len(slices.Compact(slices.Clone(accepted))) != 10 {
			t.Fatalf("IDs not unique and in order of arrival: %q", accepted)
		}

		r.run(t)
		r.sender.serve("acme", true)
		r.Kick("acme")
		got := r.up.waitDeliveries(t, 10)
		if !slices.Equal(ids(got), accepted) {
			t.Fatalf("delivered %q, want %q in that order", ids(got), accepted)
		}
		for n, d := range got {
			want := sent[n]
			if d.method != http.MethodPost || d.uri != want.URL.RequestURI() || d.tunnel != "acme" {
				t.Errorf("delivery %d: %s %s to %s, want POST %s to acme", n, d.method, d.uri, d.tunnel, want.URL.RequestURI())
			}
			wantBody, _ := io.ReadAll(must(want.GetBody()))
			if !bytes.Equal(d.body, wantBody) || !validSignature(d) {
				t.Errorf("delivery %d: body %q, want %q with a valid signature", n, d.body, wantBody)
			}
			for k, vs := range want.Header {
				if !slices.Equal(d.header[k], vs) {
					t.Errorf("delivery %d: %s %q, want %q", n, k, d.header[k], vs)
				}
			}
			for k, v := range map[string]string{
				"X-Forwarded-For": "192.0.2.7", "X-Forwarded-Host": "acme.tunnels.test", "X-Forwarded-Proto": "https",
				DeliveryHeader: accepted[n], AttemptHeader: "1",
			} {
				if got := d.header.Values(k); len(got) != 1 || got[0] != v {
					t.Errorf("delivery %d: %s %q, want %q", n, k, got, v)
				}
			}
			if d.header["Content-Length"] != nil {
				t.Errorf("delivery %d: stored Content-Length %q; a delivery sets its own", n, d.header["Content-Length"])
			}
		}
		testutil.WaitFor(t, 10*time.Second, func() error {
			if all, err := r.buf.All(t.Context()); err != nil || len(all) != 0 {
				return fmt.Errorf("buffers left: %v %v", all, err)
			}
			if c := r.buf.Counts(); c.Accepted != 10 || c.Delivered != 10 {
				return fmt.Errorf("counts: %+v, want 10 accepted and delivered", c)
			}
			return nil
		})
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestStoredHeaders: what describes one hop, the body's framing and a
// caller's own X-Tether-Delivery/-Attempt are not stored; everything else
// is, byte for byte.
func TestStoredHeaders(t *testing.T) {
	in := http.Header{
		"Connection":          {"keep-alive, X-Hop"},
		"X-Hop":               {"1"},
		"Keep-Alive":          {"timeout=5"},
		"Proxy-Authorization": {"Basic eA=="},
		"Te":                  {"trailers"},
		"Transfer-Encoding":   {"chunked"},
		"Upgrade":             {"h2c"},
		"Content-Length":      {"12"},
		"Expect":              {"100-continue"},
		"X-Tether-Delivery":   {"forged"},
		"X-Tether_Attempt":    {"9"},
		"Authorization":       {"Bearer t"},
		"X-Gitlab-Token":      {"  tok  "},
		"X-Hub-Signature-256": {"sha256=00"},
		"X-Forwarded-For":     {"192.0.2.7"},
		"X-Multi":             {"a", "b"},
	}
	got := storedHeader(in)
	want := http.Header{
		"Authorization":       {"Bearer t"},
		"X-Gitlab-Token":      {"  tok  "},
		"X-Hub-Signature-256": {"sha256=00"},
		"X-Forwarded-For":     {"192.0.2.7"},
		"X-Multi":             {"a", "b"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("stored %v\nwant %v", got, want)
	}
}

// TestNotBuffered: requests that are not to be stored get today's answer
// and leave nothing in the store.
func TestNotBuffered(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		r := newReplica(t, s.backing(t, "a"), Config{MaxBody: 1 << 10}, nil, nil, "acme", "gone")
		r.routes.Left("gone")
		base := testEntry(t, r.Forwarder)
		tests := []struct {
			name   string
			method string
			tunnel string
			path   string
			body   io.Reader
			length int64 // -1 sends the body chunked
		}{
			{"GET", http.MethodGet, "acme", "/webhooks/github", nil, 0},
			{"DELETE", http.MethodDelete, "acme", "/webhooks/github", nil, 0},
			{"declared too large", http.MethodPost, "acme", "/webhooks/github", bytes.NewReader(make([]byte, 1<<10+1)), 1<<10 + 1},
			{"chunked too large", http.MethodPost, "acme", "/webhooks/github", io.LimitReader(zeros{}, 1<<20), -1},
			{"unknown tunnel", http.MethodPost, "nobody", "/webhooks/github", strings.NewReader("{}"), 2},
			{"route without buffer", http.MethodPost, "acme", "/api/hooks", strings.NewReader("{}"), 2},
			{"root route", http.MethodPost, "acme", "/webhooksx", strings.NewReader("{}"), 2},
			{"not seen within the retention", http.MethodPost, "gone", "/webhooks/github", strings.NewReader("{}"), 2},
		}
		// The retention of "gone" ends a moment after it left.
		routes, err := registry.NewRoutes(registry.RoutesConfig{Retention: time.Millisecond}, registry.Backing{}, r.log)
		if err != nil {
			t.Fatal(err)
		}
		if err := routes.Remember("gone", webhookRoutes); err != nil {
			t.Fatal(err)
		}
		routes.Left("gone")
		r.routes, r.Forwarder.routes = routes, routes
		testutil.WaitFor(t, 5*time.Second, func() error {
			if _, seen, _ := routes.Lookup(t.Context(), "gone"); seen {
				return fmt.Errorf("gone is still within its retention")
			}
			return nil
		})
		if err := routes.Remember("acme", webhookRoutes); err != nil {
			t.Fatal(err)
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				req, err := http.NewRequest(tc.method, base+tc.path, tc.body)
				if err != nil {
					t.Fatal(err)
				}
				req.ContentLength = tc.length
				req.Host = tc.tunnel + ".tunnels.test"
				status, id, code, body := post(t, req)
				if status != http.StatusServiceUnavailable || code != "tunnel_down" || id != "" {
					t.Errorf("got %d %s %q %s, want today's 503 tunnel_down", status, code, id, body)
				}
			})
		}
		if all, err := r.buf.All(t.Context()); err != nil || len(all) != 0 {
			t.Errorf("stored %v (%v), want nothing", all, err)
		}
		// The same POST to the buffered route of a tunnel within its
		// retention is stored: the cases above differ by one thing each.
		status, _, _, body := post(t, githubHook(t, base, "acme", 1))
		if status != http.StatusAccepted {
			t.Errorf("a webhook to acme: got %d %s, want 202", status, body)
		}
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestBufferFull: past a tunnel's quota the answer is 503 buffer_full,
// counted; other tunnels still have theirs.
func TestBufferFull(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		r := newReplica(t, s.backing(t, "a"), Config{Buffer: buffer.Config{MaxRequests: 3}}, nil, nil, "acme", "other")
		base := testEntry(t, r.Forwarder)
		for n := range 3 {
			if status, _, _, body := post(t, githubHook(t, base, "acme", n)); status != http.StatusAccepted {
				t.Fatalf("webhook %d: got %d %s, want 202", n, status, body)
			}
		}
		status, id, code, body := post(t, githubHook(t, base, "acme", 3))
		if status != http.StatusServiceUnavailable || code != CodeBufferFull || id != "" || !strings.Contains(string(body), "buffer is full") {
			t.Errorf("past the quota: got %d %s %q %s, want 503 buffer_full", status, code, id, body)
		}
		if status, _, _, body := post(t, githubHook(t, base, "other", 0)); status != http.StatusAccepted {
			t.Errorf("another tunnel: got %d %s, want 202", status, body)
		}
		if c := r.buf.Counts(); c.Accepted != 4 || c.Full != 1 {
			t.Errorf("counts %+v, want 4 accepted, 1 full", c)
		}
	})
}

// stallers are callers that each declare a body of maxBody bytes, send
// sent bytes of it, and then nothing until the test ends.
type stallers struct {
	release chan struct{}
	wg      sync.WaitGroup
	// answers has the X-Tether-Error of each answer that came before the
	// test ended, "" for a transport error (the server may close the
	// connection under a body it refused).
	answers chan string
}

func startStallers(t *testing.T, base string, tunnels []string, n int, maxBody, sent int64) *stallers {
	t.Helper()
	chunk := make([]byte, 16<<10)
	s := &stallers{release: make(chan struct{}), answers: make(chan string, n)}
	for i := range n {
		pr, pw := io.Pipe()
		req, err := http.NewRequest(http.MethodPost, base+"/webhooks/x", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = maxBody
		req.Host = tunnels[i%len(tunnels)] + ".tunnels.test"
		s.wg.Add(2)
		go func() {
			defer s.wg.Done()
			// From one small buffer: the callers' memory is not measured.
			for left := sent; left > 0; left -= int64(len(chunk)) {
				if _, err := pw.Write(chunk[:min(left, int64(len(chunk)))]); err != nil {
					break
				}
			}
			<-s.release
			pw.CloseWithError(io.ErrUnexpectedEOF)
		}()
		go func() {
			defer s.wg.Done()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				s.answers <- ""
				return
			}
			resp.Body.Close()
			s.answers <- resp.Header.Get("X-Tether-Error")
		}()
	}
	t.Cleanup(func() {
		close(s.release)
		s.wg.Wait()
	})
	return s
}

// waitSettled waits until each staller is refused or holds held bytes,
// and returns how many were refused.
func (s *stallers) waitSettled(t *testing.T, p *pending, n int, each int64) int {
	t.Helper()
	refused := 0
	testutil.WaitFor(t, 30*time.Second, func() error {
		for len(s.answers) > 0 {
			if code := <-s.answers; code != CodeBufferFull && code != "" {
				t.Fatalf("a staller was answered %q before it sent its body; want buffer_full or nothing", code)
			}
			refused++
		}
		if held := p.held(); refused+int(held/each) != n || held%each != 0 {
			return fmt.Errorf("%d refused, %d bytes held", refused, held)
		}
		return nil
	})
	return refused
}

func heapInUse() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// TestPendingBodiesBounded: callers that send most of a large body and
// stall hold at most Config.MaxPendingBytes on the replica; past it they
// are answered 503 buffer_full at once. The heap grows by about the bound
// and what each connection costs anyway, not by what the callers sent.
func TestPendingBodiesBounded(t *testing.T) {
	const (
		maxBody = 1 << 20
		bound   = 4 << 20
		sent    = maxBody - 1 // the read buffer grows to maxBody
		n       = 48
		// perConn is what a connection costs the process, the caller's
		// side included (this test is both), whatever the body: buffers
		// of the HTTP server and client, goroutines.
		perConn = 128 << 10
	)
	tunnels := []string{"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"}
	r := newReplica(t, registry.Backing{Store: openStore(t, t.TempDir())},
		Config{MaxBody: maxBody, MaxPendingBytes: bound}, nil, nil, tunnels...)
	base := testEntry(t, r.Forwarder)
	before := heapInUse()
	s := startStallers(t, base, tunnels, n, maxBody, sent)
	refused := s.waitSettled(t, r.pending, n, maxBody)
	grew := heapInUse() - before
	t.Logf("%d stallers sent %d bytes each: %d refused, %d bytes held, heap grew %d bytes (bound %d; %d if every body were held)",
		n, sent, refused, r.pending.held(), grew, bound, n*maxBody)
	if held := r.pending.held(); held > bound {
		t.Errorf("bodies hold %d bytes, want at most %d", held, bound)
	}
	if grew > bound+n*perConn {
		t.Errorf("heap grew %d bytes with %d stalled bodies; want at most the bound %d and %d a connection", grew, n, bound, perConn)
	}
}

// TestPendingShareOfOneTunnel: callers stalling on one tunnel hold at most
// its share of the bound (a quarter), so webhooks for the other tunnels
// are still stored.
func TestPendingShareOfOneTunnel(t *testing.T) {
	const (
		maxBody = 1 << 20
		bound   = 8 << 20
		sent    = 256 << 10
		n       = 16
	)
	r := newReplica(t, registry.Backing{Store: openStore(t, t.TempDir())},
		Config{MaxBody: maxBody, MaxPendingBytes: bound}, nil, nil, "victim", "other")
	base := testEntry(t, r.Forwarder)
	s := startStallers(t, base, []string{"victim"}, n, maxBody, sent)
	refused := s.waitSettled(t, r.pending, n, 2*sent)
	if held := r.pending.held(); held > bound/4 || refused < n-bound/4/(2*sent) {
		t.Errorf("one tunnel's stallers hold %d bytes (%d refused), want at most a quarter of %d", held, refused, bound)
	}
	if status, _, _, body := post(t, githubHook(t, base, "other", 0)); status != http.StatusAccepted {
		t.Errorf("a webhook to another tunnel: got %d %s, want 202", status, body)
	}
}

// TestDeclaredLengthNotTrusted: a caller that declares a large body and
// sends a byte holds one small read buffer, not what it declared.
func TestDeclaredLengthNotTrusted(t *testing.T) {
	const (
		maxBody = 8 << 20
		n       = 16
	)
	r := newReplica(t, registry.Backing{Store: openStore(t, t.TempDir())}, Config{MaxBody: maxBody}, nil, nil, "acme")
	base := testEntry(t, r.Forwarder)
	s := startStallers(t, base, []string{"acme"}, n, maxBody, 1)
	if refused := s.waitSettled(t, r.pending, n, firstRead); refused != 0 {
		t.Errorf("%d refused, want none", refused)
	}
	if held := r.pending.held(); held != n*firstRead {
		t.Errorf("%d callers that sent a byte hold %d bytes, want %d", n, held, n*firstRead)
	}
}
