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
// caller's X-Tether-* fields are not stored; everything else is, byte for
// byte, credentials included.
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
		"X-Tether-Signature":  {"forged"},
		"x-tether-buffered":   {"forged"},
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
		if status != http.StatusServiceUnavailable || code != CodeBufferFull || id != "" ||
			!strings.Contains(string(body), `tunnel "acme"`) || !strings.Contains(string(body), "raise --buffer-max-requests") {
			t.Errorf("past the quota: got %d %s %q %s, want 503 buffer_full naming the tunnel and --buffer-max-requests", status, code, id, body)
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

// TestCallerTetherFieldsNotStored: a caller's X-Tether-* fields never
// reach the upstream with a delivery: a forged X-Tether-Delivery would
// have the upstream drop the real delivery it names as a duplicate.
func TestCallerTetherFieldsNotStored(t *testing.T) {
	r := newReplica(t, registryBacking(t), Config{}, nil, nil, "acme")
	base := testEntry(t, r.Forwarder)
	victim := offer(t, r, githubHook(t, "", "acme", 0))
	req := githubHook(t, base, "acme", 1)
	req.Header["X-Tether-Delivery"] = []string{victim}
	req.Header["X-Tether-Attempt"] = []string{"7"}
	req.Header["X-Tether-Signature"] = []string{"forged"}
	req.Header["x-tether_buffered"] = []string{"forged"}
	status, id, _, body := post(t, req)
	if status != http.StatusAccepted {
		t.Fatalf("got %d %s, want 202", status, body)
	}
	r.sender.serve("acme", true)
	r.run(t)
	r.Kick("acme")
	got := r.up.waitDeliveries(t, 2)
	if !slices.Equal(ids(got), []string{victim, id}) {
		t.Fatalf("delivered %q, want %q", ids(got), []string{victim, id})
	}
	for k, vs := range got[1].header {
		if tetherField(k) && k != DeliveryHeader && k != AttemptHeader {
			t.Errorf("the caller's %s %q reached the upstream", k, vs)
		}
	}
	if d := got[1]; d.header.Values(DeliveryHeader)[0] != id || len(d.header.Values(DeliveryHeader)) != 1 ||
		len(d.header.Values(AttemptHeader)) != 1 || d.attempt() != "1" {
		t.Errorf("delivery headers %q %q, want tether's alone: %s, 1", d.header.Values(DeliveryHeader), d.header.Values(AttemptHeader), id)
	}
}

// TestTricklingBodyTimesOut: a caller that starts a body and then sends
// nothing is cut off after Config.BodyIdleTimeout: nothing is stored, the
// memory it held is given back, and it gets today's answer (or none, the
// connection being closed under its body).
func TestTricklingBodyTimesOut(t *testing.T) {
	const idle = 200 * time.Millisecond
	r := newReplica(t, registryBacking(t), Config{BodyIdleTimeout: idle}, nil, nil, "acme")
	base := testEntry(t, r.Forwarder)
	pr, pw := io.Pipe()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop); pw.Close() })
	go func() {
		// A few bytes at once, then nothing until the test ends.
		if _, err := pw.Write([]byte(`{"ref":`)); err != nil {
			return
		}
		<-stop
	}()
	req, err := http.NewRequest(http.MethodPost, base+"/webhooks/github", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "acme.tunnels.test"
	req.ContentLength = 1 << 10
	answered := make(chan string, 1)
	start := time.Now()
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- "no answer: " + err.Error()
			return
		}
		resp.Body.Close()
		answered <- resp.Header.Get("X-Tether-Error")
	}()
	select {
	case code := <-answered:
		if code != "tunnel_down" && !strings.HasPrefix(code, "no answer") {
			t.Errorf("a body that stalled: answered %q, want today's tunnel_down or a closed connection", code)
		}
		t.Logf("a body that stalled was cut off after %v (idle timeout %v): %s", time.Since(start), idle, code)
	case <-time.After(20 * time.Second):
		t.Fatalf("a body that stalled still held the request after 20s; want it cut off after %v", idle)
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		if held := r.pending.held(); held != 0 {
			return fmt.Errorf("the cut-off body still holds %d bytes", held)
		}
		return nil
	})
	if all, err := r.buf.All(t.Context()); err != nil || len(all) != 0 {
		t.Errorf("stored %v (%v), want nothing", all, err)
	}
}

// TestFloodKeepsToItsTunnel: callers flooding one tunnel that is down, at
// once, fill that tunnel's quota and no more: the next request is 503
// buffer_full naming the tunnel and the flag, and another tunnel's
// webhooks are still stored until the server-wide cap, whose answer names
// its flag but not what other tunnels store.
func TestFloodKeepsToItsTunnel(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store) {
		const maxBytes, total = 16 << 10, 40 << 10
		cfg := Config{MaxBody: 4 << 10, Buffer: buffer.Config{MaxBytes: maxBytes, MaxTotalBytes: total}}
		r := newReplica(t, s.backing(t, "a"), cfg, nil, nil, "flooded", "other", "third")
		base := testEntry(t, r.Forwarder)
		flood := func(tunnel string, n int) (accepted int, refusals []string) {
			var mu sync.Mutex
			var wg sync.WaitGroup
			for k := range n {
				wg.Go(func() {
					status, _, code, body := post(t, githubHook(t, base, tunnel, k))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case status == http.StatusAccepted:
						accepted++
					case code == CodeBufferFull:
						refusals = append(refusals, string(body))
					default:
						t.Errorf("flood of %s: got %d %s %s", tunnel, status, code, body)
					}
				})
			}
			wg.Wait()
			return accepted, refusals
		}
		// A hook's size: they differ by a few bytes with their number.
		offer(t, r, githubHook(t, "", "other", 0))
		size := must(r.buf.Stats(t.Context(), "other")).Bytes
		const slop = 16

		accepted, refusals := flood("flooded", 3*maxBytes/int(size))
		full := len(refusals)
		st := must(r.buf.Stats(t.Context(), "flooded"))
		t.Logf("%d-byte webhooks: %d accepted for the flooded tunnel (%d bytes), %d refused", size, accepted, st.Bytes, len(refusals))
		if st.Bytes > maxBytes || maxBytes-st.Bytes > size+slop || accepted != st.Queued || len(refusals) == 0 {
			t.Errorf("the flooded tunnel stores %d bytes in %d requests (%d accepted), want its quota of %d filled and no more", st.Bytes, st.Queued, accepted, maxBytes)
		}
		for _, body := range refusals {
			if !strings.Contains(body, `tunnel "flooded"`) || !strings.Contains(body, "raise --buffer-max-bytes") {
				t.Fatalf("a refusal says %q; want it to name the tunnel and --buffer-max-bytes", body)
			}
		}
		// Another tunnel's quota is whole.
		room := int((maxBytes - size) / (size + slop))
		if accepted, _ := flood("other", room); accepted != room {
			t.Errorf("another tunnel: %d of %d accepted, want all", accepted, room)
		}
		// The third fills what the server-wide cap leaves.
		accepted, refusals = flood("third", 2*maxBytes/int(size))
		full += len(refusals)
		var stored int64
		for _, st := range must(r.buf.All(t.Context())) {
			stored += st.Bytes
		}
		if stored > total || total-stored > size+slop || len(refusals) == 0 || accepted == 0 {
			t.Errorf("all tunnels store %d bytes (%d accepted for the third), want the cap of %d filled and no more", stored, accepted, total)
		}
		for _, body := range refusals {
			if !strings.Contains(body, `tunnel "third"`) || !strings.Contains(body, "raise --buffer-max-total-bytes") ||
				strings.ContainsAny(body, "0123456789") {
				t.Fatalf("a refusal at the server-wide cap says %q; want it to name the tunnel and --buffer-max-total-bytes, and no figure", body)
			}
		}
		if c := r.buf.Counts(); int(c.Full) != full {
			t.Errorf("%d refusals counted, want %d", c.Full, full)
		}
	})
}

// TestLastLoginDecides: whether a tunnel's requests are stored follows the
// routes its last login advertised: a route that dropped the option, or a
// custom route that took it.
func TestLastLoginDecides(t *testing.T) {
	r := newReplica(t, registryBacking(t), Config{}, nil, nil, "acme")
	base := testEntry(t, r.Forwarder)
	if err := r.routes.Remember("acme", []string{"/webhooks=http://events:12000/;buffer=false", "/hooks=http://ci:8080;buffer"}); err != nil {
		t.Fatal(err)
	}
	if status, _, code, body := post(t, githubHook(t, base, "acme", 0)); status != http.StatusServiceUnavailable || code != "tunnel_down" {
		t.Errorf("/webhooks without the option: got %d %s %s, want today's 503 tunnel_down", status, code, body)
	}
	req := githubHook(t, base, "acme", 1)
	req.URL.Path = "/hooks/gitlab"
	if status, _, _, body := post(t, req); status != http.StatusAccepted {
		t.Errorf("/hooks with the option: got %d %s, want 202", status, body)
	}
}

// TestStoreFailureIsNotAccepted: when the store cannot confirm the write,
// the caller gets today's answer, never a 202 for a request that may be
// lost.
func TestStoreFailureIsNotAccepted(t *testing.T) {
	t.Run("data-dir", func(t *testing.T) {
		st := openStore(t, t.TempDir())
		r := newReplica(t, registry.Backing{Store: st}, Config{}, nil, nil, "acme")
		base := testEntry(t, r.Forwarder)
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		if status, id, code, body := post(t, githubHook(t, base, "acme", 0)); status != http.StatusServiceUnavailable || code != "tunnel_down" || id != "" {
			t.Errorf("with the store closed: got %d %s %q %s, want today's 503 tunnel_down", status, code, id, body)
		}
	})
	t.Run("redis", func(t *testing.T) {
		srv := testutil.StartRedis(t)
		r := newReplica(t, registry.Backing{Redis: redisConn(t, srv.URL(), "a")}, Config{}, nil, nil, "acme")
		base := testEntry(t, r.Forwarder)
		srv.Kill()
		if status, id, code, body := post(t, githubHook(t, base, "acme", 0)); status != http.StatusServiceUnavailable || code != "tunnel_down" || id != "" {
			t.Errorf("with Redis away: got %d %s %q %s, want today's 503 tunnel_down", status, code, id, body)
		}
	})
}
