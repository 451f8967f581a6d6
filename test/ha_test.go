package test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// High availability, end to end: server replicas on one Redis behind a
// round-robin TCP balancer, tether clients with two connections each, and
// steady requests through every replica's public entry while replicas die,
// restart one after the other, and lose Redis.

// Sizes and bounds of the HA tests.
const (
	haReplicas  = 3
	haTunnels   = 6
	haWorkers   = 4                    // concurrent requests of the steady load
	haPace      = 5 * time.Millisecond // pause of a worker between requests
	haTimeout   = 10 * time.Second     // bound of one request of the load
	registryTTL = registry.DefaultTTL  // the replicas run with the default
	recoverIn   = 30 * time.Second     // clients back to all their sessions
)

// TestHAFleet runs three replicas on one Redis behind a balancer, six
// tunnels each served by one client with two connections (and one with a
// single connection, on the replica that dies first), and steady requests to
// every tunnel through every replica's entry, through a replica's death, a
// rolling restart, a Redis outage, hostile requests on the peer port, and a
// tunnel whose replica and client both died.
func TestHAFleet(t *testing.T) {
	t.Parallel()
	f := newFleet(t, haReplicas)
	var tunnels, spread []haTunnel
	for i := range haTunnels {
		spread = append(spread, f.startTunnel(fmt.Sprintf("ha%d", i), fmt.Sprintf("backend-%d", i), f.lb.addr(), 2))
	}
	// solo has one session, which its own balancer puts on replica 0: when
	// replica 0 dies, solo is served nowhere until its client reconnects.
	var addrs []string
	for i := range haReplicas {
		addrs = append(addrs, f.replica(i).tunnelAddr)
	}
	solo := f.startTunnel("solo", "backend-solo", newBalancer(t, addrs...).addr(), 1)
	tunnels = append(slices.Clone(spread), solo)
	started := time.Now()
	waitSessions(t, tunnels, started, recoverIn)
	t.Logf("%d tunnels with all their sessions ready %v after their clients were", len(tunnels), time.Since(started).Round(time.Millisecond))
	l := startLoad(f, tunnels)
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			l.stop()
		}
	}
	defer stopLoad()

	t.Run("steady", func(t *testing.T) {
		for _, tu := range tunnels {
			for i := range haReplicas {
				e, servedBy, err := f.get(tu.name, "/steady", i)
				switch {
				case err != nil:
					t.Errorf("%s through replica %d: %v", tu.name, i, err)
				case servedBy != i:
					t.Errorf("%s through replica %d: served by replica %d, want %d", tu.name, i, servedBy, i)
				case e.Backend != tu.backend.name:
					t.Errorf("%s through replica %d: backend %q, want %q", tu.name, i, e.Backend, tu.backend.name)
				}
			}
		}
		holds := f.holdings(t)
		twoReplicas := 0
		for _, tu := range spread {
			rs, err := readySessions(tu.client)
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) == 2 && rs[0] != rs[1] {
				twoReplicas++
			}
			t.Logf("%s: sessions on %v (client /status), on replicas %v (/api/tunnels)", tu.name, rs, holds[tu.name])
			if len(holds[tu.name]) != len(slices.Compact(slices.Sorted(slices.Values(rs)))) {
				t.Errorf("%s: the client's sessions are on %v, but the replicas' /api/tunnels list it on replicas %v", tu.name, rs, holds[tu.name])
			}
		}
		t.Logf("%d of %d tunnels have their two sessions on two different replicas", twoReplicas, len(spread))
		if twoReplicas < len(spread)-1 {
			t.Errorf("%d of %d tunnels have their sessions on two different replicas; want at least %d: "+
				"a client's second session must leave a replica its first holds", twoReplicas, len(spread), len(spread)-1)
		}
		if got := holds[solo.name]; !slices.Equal(got, []int{0}) {
			t.Fatalf("solo is on replicas %v, want [0]", got)
		}
		l.waitCount(t, started, 3*len(tunnels)*haReplicas)
		all := l.since(started)
		fails := failures(all)
		t.Logf("steady load: %d requests, %d failed", len(all), len(fails))
		if len(fails) > 0 {
			t.Errorf("%d of %d requests failed with every replica up:%s", len(fails), len(all), describe(fails, started))
		}
	})

	t.Run("kill", func(t *testing.T) {
		const victim = 0
		v := f.replica(victim)
		l.waitCount(t, time.Now(), 50)
		killAt := time.Now()
		v.kill()
		reaped := time.Now()
		took := waitSessions(t, tunnels, killAt, recoverIn)
		l.waitCount(t, time.Now(), 3*len(tunnels)*haReplicas)
		var inFlight, late []outcome
		for _, o := range l.since(killAt.Add(-haTimeout)) {
			if o.err == nil || o.end.Before(killAt) {
				continue
			}
			switch {
			case o.entry == victim && o.start.Before(reaped):
				// Sent to the victim's entry before it was gone: lost with it.
			case o.start.Before(reaped):
				inFlight = append(inFlight, o)
			default:
				late = append(late, o)
			}
		}
		total := len(l.since(reaped))
		t.Logf("kill -9 %s: clients back to all their sessions within %v (each: %v); %d requests since: "+
			"%d failed through the other replicas while in flight at the kill, %d failed after it",
			v.id, maxDuration(took).Round(time.Millisecond), roundAll(took), total, len(inFlight), len(late))
		if len(inFlight) > haWorkers {
			t.Errorf("%d requests in flight at the kill failed; at most the %d in flight can:%s", len(inFlight), haWorkers, describe(inFlight, killAt))
		}
		if len(late) > 0 {
			t.Errorf("%d requests sent after the kill failed; want none (the live replicas hold every tunnel, or its client is on its way back):%s",
				len(late), describe(late, killAt))
		}
		// Back to three replicas, under the same ID, for the next phases.
		restarted := time.Now()
		f.restart(victim)
		t.Logf("%s restarted and ready in %v", v.id, time.Since(restarted).Round(time.Millisecond))
	})

	t.Run("rolling restart", func(t *testing.T) {
		rollStart := time.Now()
		// From the replica after the one killed before, which holds no
		// session yet: each replica drains while holding sessions.
		for k := range haReplicas {
			i := (k + 1) % haReplicas
			r := f.replica(i)
			before := len(l.since(rollStart))
			termAt := time.Now()
			r.signal(syscall.SIGTERM)
			code, ok := r.wait(stopTimeout)
			drained := time.Since(termAt)
			if !ok {
				t.Fatalf("%s did not exit within %v of SIGTERM", r.id, stopTimeout)
			}
			if code != 0 {
				t.Errorf("%s exited with code %d after SIGTERM, want 0", r.id, code)
			}
			f.restart(i)
			took := waitSessions(t, tunnels, termAt, recoverIn)
			t.Logf("%s: drained and exited %d in %v; restarted; clients back to all their sessions %v after SIGTERM; %d requests meanwhile",
				r.id, code, drained.Round(time.Millisecond), maxDuration(took).Round(time.Millisecond), len(l.since(rollStart))-before)
		}
		l.waitCount(t, time.Now(), 3*len(tunnels)*haReplicas)
		all := l.since(rollStart)
		fails := failures(all)
		t.Logf("rolling restart of %d replicas in %v: %d requests, %d failed", haReplicas, time.Since(rollStart).Round(time.Millisecond), len(all), len(fails))
		if len(fails) > 0 {
			t.Errorf("%d of %d requests failed during the rolling restart; want none:%s", len(fails), len(all), describe(fails, rollStart))
		}
	})

	t.Run("redis outage", func(t *testing.T) {
		const outage = 3 * time.Second
		before := f.holdings(t)
		downAt := time.Now()
		f.redis.Kill()
		var noticed time.Duration
		testutil.WaitFor(t, 20*time.Second, func() error {
			if noticed == 0 {
				for i := range haReplicas {
					fl, err := f.fleetView(i)
					if err != nil {
						return err
					}
					if fl.Registry.Up {
						return fmt.Errorf("%s: registry still up", fl.Replica)
					}
				}
				noticed = time.Since(downAt)
			}
			// Redis stays away for a few seconds, while the load makes
			// rounds of every tunnel through every replica.
			if n := len(l.since(downAt)); n < 5*len(tunnels)*haReplicas || time.Since(downAt) < outage {
				return fmt.Errorf("Redis down for %v, %d requests so far", time.Since(downAt), n)
			}
			return nil
		})
		upAt := time.Now()
		f.redis.Start() // empty: no persistence
		var answered, viewed time.Duration
		testutil.WaitFor(t, 15*time.Second, func() error {
			if viewed == 0 {
				if err := f.viewsMatch(t); err != nil {
					return err
				}
				viewed = time.Since(upAt)
			}
			for _, tu := range tunnels {
				for i := range haReplicas {
					if _, _, err := f.get(tu.name, "/after-redis", i); err != nil {
						return fmt.Errorf("%s through replica %d: %w", tu.name, i, err)
					}
				}
			}
			answered = time.Since(upAt)
			return nil
		})
		l.waitCount(t, time.Now(), 2*len(tunnels)*haReplicas)
		after := f.holdings(t)
		var heldFails, otherFails []outcome
		all := l.since(downAt)
		for _, o := range failures(all) {
			if slices.Contains(before[o.tunnel], o.servedBy) && slices.Contains(after[o.tunnel], o.servedBy) {
				heldFails = append(heldFails, o)
			} else {
				otherFails = append(otherFails, o)
			}
		}
		t.Logf("Redis down for %v (noticed by every replica in %v): %d requests, %d failed through a replica holding the tunnel, %d through the others; "+
			"after Redis restarted empty: every fleet view complete in %v, every tunnel answered through every replica in %v",
			upAt.Sub(downAt).Round(time.Millisecond), noticed.Round(time.Millisecond), len(all), len(heldFails), len(otherFails),
			viewed.Round(time.Millisecond), answered.Round(time.Millisecond))
		if len(heldFails) > 0 {
			t.Errorf("%d requests through a replica holding their tunnel failed around the Redis outage; want none:%s", len(heldFails), describe(heldFails, downAt))
		}
		if len(otherFails) > 0 {
			t.Logf("requests forwarded between replicas that failed:%s", describe(otherFails, downAt))
		}
	})
	stopLoad()

	// The peer port speaks TLS and admits only replicas, by the
	// certificates they make from the peer secret (README: "Running more
	// than one replica"): plain HTTP, even signed as earlier versions did,
	// garbage, and a TLS client without a replica's certificate are refused
	// and counted, and reach no tunnel.
	t.Run("peer port", func(t *testing.T) {
		tu := tunnels[0]
		host := tu.name + "." + domain
		tlsc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the client's trust is not under test
		}}
		defer tlsc.CloseIdleConnections()
		for i := range haReplicas {
			r := f.replica(i)
			refusedBefore := r.metric(t, "tether_peer_refused_total")
			for _, c := range []struct{ name, raw string }{
				{"plain HTTP", "GET /peer-probe HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
				{"plain HTTP signed as earlier versions did", "GET /peer-probe HTTP/1.1\r\nHost: " + host +
					"\r\nX-Tether-Peer-Auth: v1 " + strconv.FormatInt(time.Now().Unix(), 10) + " " + strings.Repeat("0", 64) + "\r\n\r\n"},
				{"garbage", "\x16\x03\x01\x02\x00garbage\r\n\r\nGET /peer-probe HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
			} {
				if got := rawExchange(t, r.peerAddr, c.raw); strings.Contains(got, "HTTP/1.1 2") {
					t.Errorf("%s peer port, %s: got %q, want the connection refused", r.id, c.name, firstLine(got))
				}
			}
			req, err := http.NewRequest(http.MethodGet, "https://"+r.peerAddr+"/peer-probe", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = host
			if res, err := doWith(tlsc, req); err == nil {
				t.Errorf("%s peer port, TLS without a replica's certificate: got %d, want the connection refused", r.id, res.code)
			}
			// A handshake cut short by the caller is counted when the
			// replica sees the connection end, which may come after the
			// caller has given up.
			testutil.WaitFor(t, 10*time.Second, func() error {
				if got, want := r.metric(t, "tether_peer_refused_total")-refusedBefore, 4.0; got != want {
					return fmt.Errorf("%s: tether_peer_refused_total grew by %v, want %v (one per connection refused)", r.id, got, want)
				}
				return nil
			})
		}
		if n := tu.probed.Load(); n != 0 {
			t.Errorf("%d requests to the peer port from no replica reached the tunnel's backend; want none", n)
		}
	})

	t.Run("dead replica and client", func(t *testing.T) {
		// A tunnel with sessions on two replicas: one of those replicas and
		// the tunnel's client die together; its other session ends with
		// the client.
		holds := f.holdings(t)
		var tu haTunnel
		for _, c := range spread {
			if len(holds[c.name]) == 2 {
				tu = c
				break
			}
		}
		if tu.name == "" {
			t.Fatalf("no tunnel has sessions on two replicas: %v", holds)
		}
		victim := holds[tu.name][0]
		var live []int
		for i := range haReplicas {
			if i != victim {
				live = append(live, i)
			}
		}
		v := f.replica(victim)
		deadAt := time.Now()
		v.kill()
		tu.client.kill()
		// Requests through the live replicas, until the route is gone from
		// their fleet views.
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		var answers []string
		var slowest time.Duration
		var asked sync.WaitGroup
		asked.Go(func() {
			for k := 0; ctx.Err() == nil; k++ {
				r := f.replica(live[k%len(live)])
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.httpAddr+"/gone", nil)
				if err != nil {
					answers = append(answers, err.Error())
					return
				}
				req.Host = tu.name + "." + domain
				start := time.Now()
				res, err := doWith(watchc, req)
				took := time.Since(start)
				switch {
				case ctx.Err() != nil:
					return // stopped while the request waited
				case err != nil:
					answers = append(answers, fmt.Sprintf("%s: %v after %v", r.id, err, took.Round(time.Millisecond)))
				default:
					answers = append(answers, fmt.Sprintf("%d %s", res.code, res.header.Get("X-Tether-Error")))
				}
				slowest = max(slowest, took)
				select {
				case <-ctx.Done():
				case <-time.After(haPace):
				}
			}
		})
		var goneAfter time.Duration
		testutil.WaitFor(t, registryTTL+10*time.Second, func() error {
			for _, i := range live {
				fl, err := f.fleetView(i)
				if err != nil {
					return err
				}
				if hs, ok := fl.Tunnels[tu.name]; ok {
					return fmt.Errorf("%s's fleet view still lists %s on %v", fl.Replica, tu.name, hs)
				}
			}
			goneAfter = time.Since(deadAt)
			return nil
		})
		stop()
		asked.Wait()
		counts := map[string]int{}
		for _, a := range answers {
			counts[a]++
		}
		t.Logf("%s gone from every live replica's fleet view %v after its replica and client died (registry TTL %v); %d requests meanwhile, slowest %v: %v",
			tu.name, goneAfter.Round(time.Millisecond), registryTTL, len(answers), slowest.Round(time.Millisecond), counts)
		// An entry outlives its holder's last refresh, which came before the
		// death, by the TTL; the others notice the expiry at their next
		// sweep (a tenth of the TTL).
		if limit := registryTTL + registryTTL/10 + time.Second; goneAfter > limit {
			t.Errorf("the route of %s went %v after its replica died; want within the registry TTL %v (and a sweep: %v)", tu.name, goneAfter, registryTTL, limit)
		}
		for a := range counts {
			if !strings.HasPrefix(a, "502 ") && !strings.HasPrefix(a, "503 ") {
				t.Errorf("a request for %s through a live replica got %s; want a quick 502 or 503", tu.name, a)
			}
		}
		if slowest > 5*time.Second {
			t.Errorf("a request for %s took %v; want every answer within a few seconds", tu.name, slowest)
		}
		// Now no replica routes it: 503 tunnel_down, within a few seconds.
		var checks sync.WaitGroup
		for _, i := range live {
			checks.Go(func() {
				r := f.replica(i)
				start := time.Now()
				res, err := r.getWith(watchc, tu.name, "/gone")
				took := time.Since(start)
				switch {
				case err != nil:
					t.Errorf("%s through %s: %v after %v", tu.name, r.id, err, took)
				case res.code != http.StatusServiceUnavailable || res.header.Get("X-Tether-Error") != "tunnel_down":
					t.Errorf("%s through %s: %d %s; want 503 tunnel_down", tu.name, r.id, res.code, res.header.Get("X-Tether-Error"))
				case took > 5*time.Second:
					t.Errorf("%s through %s: 503 after %v; want it within a few seconds", tu.name, r.id, took)
				}
			})
		}
		checks.Wait()
	})
}

// TestHATwoClientsOneTunnel: two client processes with the same token serve
// one tunnel through three replicas: both stay ready, neither replaces the
// other's sessions, and requests through every replica reach both backends.
func TestHATwoClientsOneTunnel(t *testing.T) {
	t.Parallel()
	f := newFleet(t, haReplicas)
	token := writeToken(t, f.keys.issue(t, "pair", time.Hour))
	var clients []*client
	backends := map[string]*backend{}
	for _, name := range []string{"first", "second"} {
		b := newBackend(t, name, nil)
		backends[name] = b
		clients = append(clients, startClient(t, f.replica(0).server, clientOpts{
			server: f.lb.addr(), tokenFile: token, routes: []string{"/=" + b.url()},
			args: []string{"--connections", "2", "--log-level", "info"},
		}))
	}
	pair := []haTunnel{{name: "pair (first)", client: clients[0], connections: 2}, {name: "pair (second)", client: clients[1], connections: 2}}
	waitSessions(t, pair, time.Now(), recoverIn)
	testutil.WaitFor(t, 5*time.Second, func() error {
		sessions := 0
		for i := range haReplicas {
			sessions += len(f.replica(i).sessions(t))
		}
		if sessions != 4 {
			return fmt.Errorf("the replicas list %d sessions of pair, want 2 clients × 2 connections", sessions)
		}
		return nil
	})
	t.Logf("pair held by replicas %v", f.holdings(t)["pair"])
	// A slot's new login may reach a replica before the close of the
	// session it left there, and replace that session of its own: count
	// from now on.
	replaced := func() float64 {
		n := 0.0
		for i := range haReplicas {
			n += f.replica(i).metric(t, "tether_sessions_replaced_total")
		}
		return n
	}
	replacedBefore := replaced()

	// A replica serves the tunnel through its own sessions of it, and
	// forwards to the replicas that hold it when it has none: over the
	// replicas, requests reach both clients.
	reached := map[string]int{}
	byReplica := map[int]map[string]int{}
	const perReplica = 30
	for i := range haReplicas {
		byReplica[i] = map[string]int{}
		for range perReplica {
			e, servedBy, err := f.get("pair", "/", i)
			if err != nil {
				t.Fatalf("pair through replica %d: %v", i, err)
			}
			if servedBy != i {
				t.Fatalf("pair through replica %d: served by %d", i, servedBy)
			}
			reached[e.Backend]++
			byReplica[i][e.Backend]++
		}
	}
	t.Logf("requests through each replica, by backend: %v", byReplica)
	for name := range backends {
		if reached[name] == 0 {
			t.Errorf("none of %d requests reached backend %q; want both clients to serve: %v", perReplica*haReplicas, name, byReplica)
		}
	}
	if got := replaced() - replacedBefore; got != 0 {
		t.Errorf("tether_sessions_replaced_total grew by %v over the replicas, want 0: the clients must not replace each other", got)
	}
	// A client whose session the other replaced would have reconnected.
	for k, c := range clients {
		st, err := c.status()
		if err != nil {
			t.Fatal(err)
		}
		rs, err := readySessions(c)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Ready || len(rs) != 2 || st.Reconnects != 0 {
			t.Errorf("client %d: ready %v with %d ready sessions, reconnects %d; want ready with 2, never reconnected", k+1, st.Ready, len(rs), st.Reconnects)
		}
	}
}
