package test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// scrape parses the Prometheus text of /metrics into series → value.
func scrape(s *server) (map[string]float64, error) {
	r, err := s.admin("/metrics")
	if err != nil {
		return nil, err
	}
	if r.code != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %d", r.code)
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(r.body, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[line[:sp]] = v
	}
	return out, nil
}

// counterWatch scrapes /metrics over and over, and records every counter
// that went backwards, and every per-tunnel counter that vanished, between
// two scrapes.
type counterWatch struct {
	mu       sync.Mutex
	last     map[string]float64
	scrapes  int
	problems []string
}

func (w *counterWatch) observe(now map[string]float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.scrapes++
	for k, before := range w.last {
		name, _, _ := strings.Cut(k, "{")
		if !strings.HasSuffix(name, "_total") {
			continue
		}
		after, ok := now[k]
		switch {
		case !ok && strings.HasPrefix(name, "tether_tunnel_"):
			w.problems = append(w.problems, fmt.Sprintf("%s (was %v) vanished", k, before))
		case ok && after < before:
			w.problems = append(w.problems, fmt.Sprintf("%s went back from %v to %v", k, before, after))
		}
	}
	w.last = now
}

func (w *counterWatch) run(ctx context.Context, t testing.TB, s *server) {
	for ctx.Err() == nil {
		m, err := scrape(s)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("scrape: %v", err)
			}
			return
		}
		w.observe(m)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond): // a scrape interval, not synchronisation
		}
	}
}

// TestMetricsTellTheTruth: scraped all along while one of a tunnel's two
// clients stops and another tunnel goes down, no counter goes backwards
// and no per-tunnel counter vanishes; the tunnel that went down reads
// tether_tunnel_up 0 and keeps its last-seen time, and the one still served
// reads 1.
func TestMetricsTellTheTruth(t *testing.T) {
	k := newKeys(t)
	s := startServer(t, k, serverOpts{})
	issued := time.Now()
	alphaToken, betaToken := writeToken(t, k.issue(t, "alpha", time.Hour)), writeToken(t, k.issue(t, "beta", 2*time.Hour))
	issuedBy := time.Now()
	be := newBackend(t, "be", nil)
	route := []string{"/=" + be.url()}
	alpha1 := startClient(t, s, clientOpts{tokenFile: alphaToken, routes: route, args: []string{"--connections", "1"}})
	startClient(t, s, clientOpts{tokenFile: alphaToken, routes: route, args: []string{"--connections", "1"}})
	beta := startClient(t, s, clientOpts{tokenFile: betaToken, routes: route, args: []string{"--connections", "1"}})

	ctx, cancel := context.WithCancel(t.Context())
	w := &counterWatch{}
	var wg sync.WaitGroup
	wg.Go(func() { w.run(ctx, t, s) })
	load := func(n int, tunnels ...string) {
		for range n {
			for _, name := range tunnels {
				if r, err := s.get(name, "/"); err != nil || r.code != http.StatusOK {
					t.Errorf("GET %s: %v %v", name, r.code, err)
				}
			}
		}
	}
	load(20, "alpha", "beta")
	alpha1.stop()
	load(20, "alpha", "beta")
	beta.stop()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if up := s.metric(t, "tether_tunnel_up", "tunnel", "beta"); up != 0 {
			return fmt.Errorf("tether_tunnel_up{tunnel=beta} = %v after its client stopped", up)
		}
		return nil
	})
	load(20, "alpha")
	cancel()
	wg.Wait()

	w.mu.Lock()
	t.Logf("%d scrapes", w.scrapes)
	for _, p := range w.problems {
		t.Error(p)
	}
	w.mu.Unlock()
	m, err := scrape(s)
	if err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		`tether_tunnel_up{tunnel="alpha"}`:                              1,
		`tether_tunnel_up{tunnel="beta"}`:                               0,
		`tether_tunnel_requests_total{code_class="2xx",tunnel="alpha"}`: 60,
		`tether_tunnel_requests_total{code_class="2xx",tunnel="beta"}`:  40,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (exported: %v), want %v", series, got, ok, want)
		}
	}
	seen := `tether_tunnel_last_seen_timestamp_seconds{tunnel="beta"}`
	if m[seen] == 0 || time.Since(time.UnixMilli(int64(m[seen]*1e3))) > time.Minute {
		t.Errorf("%s = %v, want when beta went down", seen, m[seen])
	}
	again, err := scrape(s)
	if err != nil {
		t.Fatal(err)
	}
	if again[seen] != m[seen] {
		t.Errorf("%s moved from %v to %v while beta is down", seen, m[seen], again[seen])
	}
	exp := time.Unix(int64(m[`tether_tunnel_token_expiry_timestamp_seconds{tunnel="alpha"}`]), 0)
	if exp.Before(issued.Add(time.Hour).Truncate(time.Second)) || exp.After(issuedBy.Add(time.Hour)) {
		t.Errorf("alpha's token expiry %v, want its token's exp, an hour after it was issued at %v", exp, issued)
	}
}

// TestAccessLogAndRequestID: with --access-log the server logs one line
// for a request, without its query; the upstream sees the caller's request
// ID, and the caller gets it back.
func TestAccessLogAndRequestID(t *testing.T) {
	k := newKeys(t)
	s := startServer(t, k, serverOpts{args: []string{"--access-log"}})
	be := newBackend(t, "be", nil)
	startClient(t, s, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/api=" + be.url()}})
	req := s.request(t, http.MethodGet, "alpha", "/api/items?secret=s3cret-query", nil)
	req.Header.Set("X-Request-Id", "e2e-request-7")
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r.code != http.StatusOK || r.header.Get("X-Request-Id") != "e2e-request-7" {
		t.Fatalf("GET: %d, X-Request-Id %q; want 200 with the caller's e2e-request-7", r.code, r.header.Get("X-Request-Id"))
	}
	if got := decodeEcho(t, r).Header.Get("X-Request-Id"); got != "e2e-request-7" {
		t.Errorf("the upstream saw X-Request-Id %q, want e2e-request-7", got)
	}
	var line map[string]any
	testutil.WaitFor(t, 5*time.Second, func() error {
		for _, l := range s.logLines() {
			if l["logger"] == "access" && l["request_id"] == "e2e-request-7" {
				line = l
				return nil
			}
		}
		return fmt.Errorf("no access log line for request e2e-request-7")
	})
	for k, v := range map[string]any{"msg": "request", "tunnel": "alpha", "route": "/api", "method": "GET", "path": "/api/items", "status": float64(200), "forwarded": false} {
		if line[k] != v {
			t.Errorf("access log %s = %#v, want %#v (line %v)", k, line[k], v, line)
		}
	}
	if strings.Contains(fmt.Sprint(line), "s3cret") {
		t.Errorf("the access log line holds the query: %v", line)
	}
}
