package server

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/webhook"
)

// The buffered webhooks' benchmarks (webhooks.go), through the public
// entry of a server on loopback, with each store: how fast webhooks are
// accepted while their tunnel is down, what a 202 costs beside the answer
// the same request gets otherwise, and how fast a queue drains once the
// tunnel's client is back.

// webhookStore is where a benchmark's server keeps buffered webhooks.
type webhookStore struct {
	name string
	// redis is the redis-server's arguments beyond testutil's (which runs
	// it without persistence); nil: not Redis.
	redis []string
	// dataDir: --data-dir in a temp dir (bbolt, fsynced per write).
	dataDir bool
}

// webhookStores are the stores measured: --data-dir, and Redis as the
// registry with AOF fsynced at every write (what an operator who wants no
// loss runs) and without AOF (writes acknowledged from memory).
var webhookStores = []webhookStore{
	{name: "data-dir", dataDir: true},
	{name: "redis-aof-always", redis: []string{"--appendonly", "yes", "--appendfsync", "always"}},
	{name: "redis-no-aof", redis: []string{}},
}

// bufferingOff has no store: buffering is off, the server answers as
// without the feature.
var bufferingOff = webhookStore{name: "off"}

// startWebhookServer starts a server that keeps buffered webhooks in st,
// with quotas no benchmark reaches.
func startWebhookServer(b *testing.B, st webhookStore) *testServer {
	b.Helper()
	setup := serverSetup{keys: newKeys(b), log: zap.NewNop()}
	var redisURL, secret string
	if st.redis != nil {
		redisURL = testutil.StartRedis(b, st.redis...).URL()
		secret = filepath.Join(b.TempDir(), "peer-secret")
		writeFile(b, secret, peerSecretForTests)
		setup.peer = listen(b)
	}
	return startServerWith(b, setup, func(c *Config) {
		c.BufferMaxRequests, c.BufferMaxBytes, c.BufferMaxTotalBytes = 1<<30, 1<<40, 1<<40
		if st.dataDir {
			c.DataDir = b.TempDir()
		}
		if redisURL != "" {
			c.Registry, c.ReplicaID, c.PeerSecretFile = redisURL, "a", secret
		}
	})
}

// hookBody is a GitHub-style push event of 4 KiB of JSON.
var hookBody = func() []byte {
	head := `{"ref":"refs/heads/main","after":"59b20b8d5c6ff8d09518454d4dd8b7b30f095ab5","commits":[`
	commit := `{"id":"59b20b8d5c6ff8d09518454d4dd8b7b30f095ab5","message":"fix"},`
	tail := `{}],"pad":"`
	n := (4096 - len(head) - len(tail) - 2) / len(commit)
	body := head + strings.Repeat(commit, n) + tail
	return []byte(body + strings.Repeat("x", 4096-len(body)-2) + `"}`)
}()

// newHookPost builds the webhook for tunnel name, to url (the entry's, or
// "" for a request handed to the Forwarder itself).
func newHookPost(url, name string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, url+"/webhooks/push", bytes.NewReader(hookBody))
	if url != "" {
		req.RequestURI = "" // a client's request, not a server's
	}
	req.Host = name + "." + testDomain
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
	req.Header.Set("X-Hub-Signature-256", "sha256="+strings.Repeat("ab", 32))
	return req
}

// hookSink is an upstream that counts the webhooks it gets, and the
// deliveries among them, and discards their bodies.
type hookSink struct {
	*httptest.Server
	got, delivered atomic.Int64
	// wantDelivered, when set, is closed by the delivery that brings the
	// count to target.
	mu            sync.Mutex
	target        int64
	wantDelivered chan struct{}
}

func startHookSink(b *testing.B) *hookSink {
	b.Helper()
	h := &hookSink{}
	h.Server = newHTTPTestServer(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.got.Add(1)
		if r.Header.Get(webhook.DeliveryHeader) != "" {
			n := h.delivered.Add(1)
			h.mu.Lock()
			if h.wantDelivered != nil && n == h.target {
				close(h.wantDelivered)
				h.wantDelivered = nil
			}
			h.mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	}))
	return h
}

// awaitDeliveries returns a channel closed once n more deliveries came.
func (h *hookSink) awaitDeliveries(n int) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.target = h.delivered.Load() + int64(n)
	h.wantDelivered = make(chan struct{})
	return h.wantDelivered
}

// latencies collects the time each webhook took to be answered.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

// report reports the webhooks answered per second over the benchmark's
// time, and the latency's median and 99th percentile.
func (l *latencies) report(b *testing.B, unit string) {
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	b.ReportMetric(float64(len(l.d))/b.Elapsed().Seconds(), unit)
	b.ReportMetric(float64(l.d[len(l.d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds())/1000, "p99-ms")
}

// postHookTimed sends the webhook for tunnel name through the entry and says
// how long its answer took, failing b unless it is want.
func postHookTimed(b *testing.B, hc *http.Client, s *testServer, name string, want int) (time.Duration, bool) {
	start := time.Now()
	resp, err := hc.Do(newHookPost(s.entry, name))
	if err != nil {
		b.Error(err)
		return 0, false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != want {
		b.Errorf("webhook answered %d (%s), want %d", resp.StatusCode, resp.Header.Get("X-Tether-Error"), want)
		return 0, false
	}
	return time.Since(start), true
}

// BenchmarkWebhookAcceptDown measures webhooks POSTed to a tunnel whose
// client is down: one op is a wave of webhooks sent at once, each answered
// 202 once stored; one alone (the latency a 202 adds), and 128 (a burst
// within a caller's share of a tunnel's request slots, 256 by default, as
// each holds one while it waits). A request for a tunnel that is down
// first waits tunnelWait (3 s) for a client reconnecting, so each 202
// takes that wait and the store's write, and the webhooks accepted per
// second are the callers in flight over that wait. "off" is the same wave
// without a store: today's 503 tunnel_down after the same wait, so that
// the difference is what a 202 adds.
func BenchmarkWebhookAcceptDown(b *testing.B) {
	for _, st := range append([]webhookStore{bufferingOff}, webhookStores...) {
		for _, wave := range []int{1, 128} {
			b.Run(fmt.Sprintf("%s/callers=%d", st.name, wave), func(b *testing.B) {
				benchmarkDownWave(b, st, wave)
			})
		}
	}
}

func benchmarkDownWave(b *testing.B, st webhookStore, wave int) {
	s := startWebhookServer(b, st)
	sink := startHookSink(b)
	stop := s.runClientRoutes(b, "acme", s.tunnel, 1, "/="+sink.URL, "/webhooks="+sink.URL+"/")
	s.waitServed(b, "acme")
	stop()
	s.waitDown(b, "acme")
	before := sink.got.Load()
	want := http.StatusAccepted
	if st.name == bufferingOff.name {
		want = http.StatusServiceUnavailable
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: wave}}
	var lat latencies
	for b.Loop() {
		var wg sync.WaitGroup
		for range wave {
			wg.Go(func() {
				if d, ok := postHookTimed(b, hc, s, "acme", want); ok {
					lat.add([]time.Duration{d})
				}
			})
		}
		wg.Wait()
	}
	lat.report(b, "answered/s")
	if n := sink.got.Load() - before; n != 0 {
		b.Errorf("the upstream got %d requests while the tunnel was down, want none", n)
	}
}

// BenchmarkWebhookAcceptRefused measures webhooks through a tunnel whose
// client is up but whose upstream refuses the connection (the receiver's
// pod restarting): no wait, each answered 202 once stored, from 16 callers
// per CPU. This is the rate and latency of the store behind the whole
// request path; compare with BenchmarkWebhookUp, the same webhook
// delivered.
func BenchmarkWebhookAcceptRefused(b *testing.B) {
	for _, st := range webhookStores {
		b.Run(st.name, func(b *testing.B) {
			s := startWebhookServer(b, st)
			app := startHookSink(b)
			s.runClientRoutes(b, "acme", s.tunnel, 1, "/="+app.URL, "/webhooks=http://"+testutil.FreeAddr(b)+"/")
			s.waitServed(b, "acme")
			benchmarkHooks(b, s, http.StatusAccepted)
		})
	}
}

// BenchmarkWebhookUp is the same webhook delivered at once, tunnel and
// upstream up (the normal path), with each store and with none: the path
// must not touch the store, which the benchmark checks after.
func BenchmarkWebhookUp(b *testing.B) {
	for _, st := range append([]webhookStore{bufferingOff}, webhookStores...) {
		b.Run(st.name, func(b *testing.B) {
			s := startWebhookServer(b, st)
			sink := startHookSink(b)
			s.runClientRoutes(b, "acme", s.tunnel, 1, "/="+sink.URL, "/webhooks="+sink.URL+"/")
			s.waitServed(b, "acme")
			benchmarkHooks(b, s, http.StatusOK)
			if sums, err := s.webhooks.fw.Summaries(b.Context()); err != nil || len(sums) != 0 {
				b.Errorf("the normal path stored webhooks: %v %v", sums, err)
			}
			if n := sink.delivered.Load(); n != 0 {
				b.Errorf("%d deliveries on the normal path, want none", n)
			}
		})
	}
}

// benchmarkHooks POSTs the webhook for tunnel acme from 16 goroutines per
// CPU, each answer want.
func benchmarkHooks(b *testing.B, s *testServer, want int) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var lat latencies
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		defer func() { lat.add(mine) }()
		for pb.Next() {
			d, ok := postHookTimed(b, hc, s, "acme", want)
			if !ok {
				return
			}
			mine = append(mine, d)
		}
	})
	b.StopTimer()
	lat.report(b, "answered/s")
}

// deliverQueue is the queue BenchmarkWebhookDeliver drains.
const deliverQueue = 500

// BenchmarkWebhookDeliver measures a queue of deliverQueue webhooks drained
// once the tunnel's client is back: one op is the client starting and the
// whole queue delivered, one at a time, to a local upstream. The
// queue is stored while the client is down through the Forwarder's Offer,
// the code that answers a 202, without the entry's wait for the tunnel.
func BenchmarkWebhookDeliver(b *testing.B) {
	for _, st := range webhookStores {
		b.Run(st.name, func(b *testing.B) {
			s := startWebhookServer(b, st)
			sink := startHookSink(b)
			specs := []string{"/=" + sink.URL, "/webhooks=" + sink.URL + "/"}
			stop := s.runClientRoutes(b, "acme", s.tunnel, 1, specs...)
			s.waitServed(b, "acme")
			stop()
			s.waitDown(b, "acme")
			for b.Loop() {
				b.StopTimer()
				fillQueue(b, s, "acme", deliverQueue)
				drained := sink.awaitDeliveries(deliverQueue)
				b.StartTimer()
				stop := s.runClientRoutes(b, "acme", s.tunnel, 1, specs...)
				select {
				case <-drained:
				case <-time.After(2 * time.Minute):
					b.Fatalf("the queue of %d was not delivered within 2 minutes", deliverQueue)
				}
				b.StopTimer()
				stop()
				s.waitDown(b, "acme")
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*deliverQueue)/b.Elapsed().Seconds(), "delivered/s")
		})
	}
}

// fillQueue stores n webhooks for tunnel name, whose client is down, 16 at
// a time.
func fillQueue(b *testing.B, s *testServer, name string, n int) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				w := httptest.NewRecorder()
				if !s.webhooks.offer(w, newHookPost("", name), name) || w.Code != http.StatusAccepted {
					b.Errorf("storing a webhook: %d %s", w.Code, w.Body)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}
