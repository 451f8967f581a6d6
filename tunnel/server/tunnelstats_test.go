package server

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/internal/testutil"
)

// series gathers reg and returns every sample of the named metrics, keyed
// as name{label="value",...} with the labels sorted.
func series(t testing.TB, reg prometheus.Gatherer, names ...string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if len(names) > 0 && !contains(names, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkMonotonic fails for a counter of before that is lower, or gone, in
// after.
func checkMonotonic(t testing.TB, when string, before, after map[string]float64) {
	t.Helper()
	for k, v := range before {
		got, ok := after[k]
		switch {
		case !ok:
			t.Errorf("%s: %s (was %v) is gone", when, k, v)
		case got < v:
			t.Errorf("%s: %s went back from %v to %v", when, k, v, got)
		}
	}
}

// TestTunnelCountersOutliveSessions: a tunnel's request and byte counters
// keep what its sessions counted when they end, so they never go backwards
// while clients come and go (increase() and error-rate alerts would fire on
// every client rollout otherwise).
func TestTunnelCountersOutliveSessions(t *testing.T) {
	s := startServer(t)
	up := backend(t, "alpha").URL
	stopFirst := s.runClient(t, "alpha", s.tunnel, 1, up)
	stopSecond := s.runClient(t, "alpha", s.tunnel, 1, up)
	s.waitSessions(t, "alpha", 2)
	const requests = 20
	for range requests {
		if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
			t.Fatalf("GET: %d %s", code, body)
		}
	}
	names := []string{"tether_tunnel_requests_total", "tether_tunnel_bytes_total"}
	before := series(t, s.metrics.reg, names...)
	if got := before[`tether_tunnel_requests_total{code_class="2xx",tunnel="alpha"}`]; got != requests {
		t.Fatalf("2xx requests of alpha: %v, want %d; all: %v", got, requests, before)
	}
	if got := before[`tether_tunnel_requests_total{code_class="5xx",tunnel="alpha"}`]; got != 0 {
		t.Errorf("5xx requests of alpha: %v, want 0 (exported before the first)", got)
	}

	stopFirst()
	s.waitSessions(t, "alpha", 1)
	afterOne := series(t, s.metrics.reg, names...)
	checkMonotonic(t, "after one of two clients stopped", before, afterOne)

	stopSecond()
	s.waitNoSessions(t)
	afterBoth := series(t, s.metrics.reg, names...)
	checkMonotonic(t, "after both clients stopped", afterOne, afterBoth)
	if got := afterBoth[`tether_tunnel_requests_total{code_class="2xx",tunnel="alpha"}`]; got != requests {
		t.Errorf("2xx requests of alpha with no session left: %v, want %d", got, requests)
	}
	if in := afterBoth[`tether_tunnel_bytes_total{direction="in",tunnel="alpha"}`]; in == 0 {
		t.Errorf("bytes in of alpha with no session left: 0; want what its sessions carried")
	}

	// The tunnel comes back: its counters go on from where they were.
	s.runClient(t, "alpha", s.tunnel, 1, up)
	s.waitSessions(t, "alpha", 1)
	if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, body)
	}
	back := series(t, s.metrics.reg, names...)
	checkMonotonic(t, "after the tunnel came back", afterBoth, back)
	if got := back[`tether_tunnel_requests_total{code_class="2xx",tunnel="alpha"}`]; got != requests+1 {
		t.Errorf("2xx requests of alpha: %v, want %d", got, requests+1)
	}
}

// waitNoSessions waits until no session is left here.
func (s *testServer) waitNoSessions(t testing.TB) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := len(s.members.list()); n != 0 {
			return fmt.Errorf("%d sessions left", n)
		}
		return nil
	})
}

// fakeClock is a clock tests move by hand, safe for concurrent use.
type fakeClock struct{ offset atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// TestTunnelStatsForgottenADayAfter: a tunnel's series stay for a day after
// its last session here ended, then go: what a replica remembers is bounded
// by the tunnels it served within a day.
func TestTunnelStatsForgottenADayAfter(t *testing.T) {
	s := startServer(t)
	clock := &fakeClock{}
	s.metrics.tunnels.now = clock.now // before any session: nothing reads it yet
	stop := s.runClient(t, "alpha", s.tunnel, 1, backend(t, "alpha").URL)
	s.waitSessions(t, "alpha", 1)
	if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, body)
	}
	stop()
	s.waitNoSessions(t)
	const key = `tether_tunnel_requests_total{code_class="2xx",tunnel="alpha"}`
	clock.advance(statsRetention - time.Minute)
	got := series(t, s.metrics.reg)
	if got[key] != 1 {
		t.Fatalf("%s a minute short of a day after the tunnel went down: %v, want 1", key, got[key])
	}
	if v, ok := got[`tether_tunnel_up{tunnel="alpha"}`]; !ok || v != 0 {
		t.Errorf("tether_tunnel_up of alpha a minute short of a day after it went down: %v (exported: %v), want 0", v, ok)
	}
	clock.advance(2 * time.Minute)
	for k := range series(t, s.metrics.reg) {
		if strings.Contains(k, `tunnel="alpha"`) {
			t.Errorf("%s is still exported a day after the tunnel's last session ended", k)
		}
	}
	s.metrics.tunnels.mu.Lock()
	n := len(s.metrics.tunnels.tunnels)
	s.metrics.tunnels.mu.Unlock()
	if n != 0 {
		t.Errorf("%d tunnel records kept a day after their last session; want 0", n)
	}
}

// TestTunnelUpAndLastSeen: a tunnel served on any replica is up on every
// replica of the fleet; once no replica serves it, it is 0 and its last
// seen time stays where it went down, on the replica that served it and on
// the one that only saw it in the registry.
func TestTunnelUpAndLastSeen(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	b := startReplica(t, f, k, "b")
	stop := a.runClient(t, "alpha", a.tunnel, 1, backend(t, "alpha").URL)
	a.waitSessions(t, "alpha", 1)
	b.waitHolders(t, "alpha", 1)
	const up, seen = `tether_tunnel_up{tunnel="alpha"}`, `tether_tunnel_last_seen_timestamp_seconds{tunnel="alpha"}`
	for _, r := range []*testServer{a, b} {
		got := series(t, r.metrics.reg)
		if got[up] != 1 {
			t.Errorf("replica %s: %s = %v while replica a serves it, want 1", r.cfg.ReplicaID, up, got[up])
		}
		if age := time.Since(time.UnixMilli(int64(got[seen] * 1e3))); age < 0 || age > time.Minute {
			t.Errorf("replica %s: %s is %v old while it is up, want now", r.cfg.ReplicaID, seen, age)
		}
	}

	stop()
	b.waitHolders(t, "alpha", 0)
	a.waitNoSessions(t)
	wentDown := time.Now()
	for _, r := range []*testServer{a, b} {
		got := series(t, r.metrics.reg)
		if v, ok := got[up]; !ok || v != 0 {
			t.Errorf("replica %s: %s = %v (exported: %v) after the tunnel went down, want 0", r.cfg.ReplicaID, up, v, ok)
		}
		last := got[seen]
		if last == 0 || float64(wentDown.UnixMilli())/1e3 < last {
			t.Errorf("replica %s: %s = %v, want when the tunnel was last seen, before %v", r.cfg.ReplicaID, seen, last, wentDown)
		}
		// It stays: a later scrape does not move it.
		if again := series(t, r.metrics.reg)[seen]; again != last {
			t.Errorf("replica %s: %s moved from %v to %v while the tunnel is down", r.cfg.ReplicaID, seen, last, again)
		}
	}
}

// TestTunnelTokenExpiry: a tunnel's token expiry is the latest exp among
// its live sessions' tokens, follows them as they end, and is absent with
// no session left.
func TestTunnelTokenExpiry(t *testing.T) {
	s := startServer(t)
	short, long := dialRaw(t, s.tunnel), dialRaw(t, s.tunnel)
	shortToken, longToken := s.keys.token(t, "alpha", time.Hour), s.keys.token(t, "alpha", 3*time.Hour)
	for _, l := range []struct {
		c     *rawClient
		token string
		runID string
	}{{short, shortToken, "short"}, {long, longToken, "long"}} {
		if resp, _ := l.c.login(l.token, l.runID); resp.Error != "" {
			t.Fatalf("login: %s", resp.Error)
		}
	}
	exp := func(token string) float64 {
		c, err := s.verifier.Verify(token)
		if err != nil {
			t.Fatal(err)
		}
		return float64(c.ExpiresAt.Unix())
	}
	const key = `tether_tunnel_token_expiry_timestamp_seconds{tunnel="alpha"}`
	if got, want := series(t, s.metrics.reg)[key], exp(longToken); got != want {
		t.Errorf("%s with tokens of 1h and 3h = %v, want the 3h token's exp %v", key, got, want)
	}
	_ = long.mux.Close()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got, want := series(t, s.metrics.reg)[key], exp(shortToken); got != want {
			return fmt.Errorf("%s after the 3h session ended = %v, want the 1h token's exp %v", key, got, want)
		}
		return nil
	})
	_ = short.mux.Close()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got, ok := series(t, s.metrics.reg)[key]; ok {
			return fmt.Errorf("%s = %v with no session left, want none", key, got)
		}
		return nil
	})
}
