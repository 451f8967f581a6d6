package test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	tetherserver "github.com/tether-dev/tether/tunnel/server"
)

// The harness of the HA tests (ha_test.go): a fleet of server replicas on
// one Redis behind a balancer, its tunnels, and a steady load of requests
// through every replica's entry.

// haClient is the request client of the HA tests: keep-alive connections to
// each entry, as an ingress in front of the replicas keeps.
var haClient = &http.Client{
	Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: haWorkers, ResponseHeaderTimeout: haTimeout},
	Timeout:   haTimeout,
}

// fleet is server replicas sharing one Redis registry, with a balancer in
// front of their tunnel ports, as an L4 load balancer in front of a
// Kubernetes Service's pods.
type fleet struct {
	t          *testing.T
	keys       *keys
	redis      *testutil.RedisServer
	secretFile string
	secret     string
	lb         *balancer

	mu       sync.Mutex
	replicas []*replica
}

// replica is one server of a fleet. A restarted replica keeps its ID and
// its tunnel and peer addresses (a StatefulSet pod).
type replica struct {
	*server
	id       string
	peerAddr string
}

// newFleet starts Redis and n replicas, and a balancer in front of them.
func newFleet(t *testing.T, n int) *fleet {
	t.Helper()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	f := &fleet{t: t, keys: newKeys(t), redis: testutil.StartRedis(t), secret: hex.EncodeToString(secret)}
	f.secretFile = writeFile(t, t.TempDir(), "peer-secret", f.secret+"\n")
	var tunnelAddrs []string
	for i := range n {
		r := f.startReplica(fmt.Sprintf("replica-%d", i), "127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		f.replicas = append(f.replicas, r)
		tunnelAddrs = append(tunnelAddrs, r.tunnelAddr)
	}
	f.lb = newBalancer(t, tunnelAddrs...)
	return f
}

// startReplica starts a replica and waits until it is ready.
func (f *fleet) startReplica(id, tunnelAddr, peerAddr string) *replica {
	f.t.Helper()
	s := startServer(f.t, f.keys, serverOpts{tunnelAddr: tunnelAddr, args: []string{
		"--registry", f.redis.URL(), "--replica-id", id,
		"--peer-addr", peerAddr, "--peer-secret-file", f.secretFile,
		// The requests of the load are logged at debug; their logs would
		// only slow the replicas down.
		"--log-level", "info",
	}})
	s.name = "tether server " + id
	r := &replica{server: s, id: id, peerAddr: peerAddr}
	testutil.WaitFor(f.t, readyTimeout, func() error {
		res, err := s.admin("/readyz")
		if err != nil {
			return err
		}
		if res.code != http.StatusOK {
			return fmt.Errorf("%s /readyz: %d %s", id, res.code, strings.TrimSpace(res.body))
		}
		return nil
	})
	return r
}

// replica returns replica i as it runs now.
func (f *fleet) replica(i int) *replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.replicas[i]
}

// restart starts replica i again, after it exited, with its ID and
// addresses.
func (f *fleet) restart(i int) *replica {
	f.t.Helper()
	old := f.replica(i)
	if !old.exited() {
		f.t.Fatalf("restart %s: the old process still runs", old.id)
	}
	r := f.startReplica(old.id, old.tunnelAddr, old.peerAddr)
	f.mu.Lock()
	f.replicas[i] = r
	f.mu.Unlock()
	return r
}

// size is the number of replicas.
func (f *fleet) size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.replicas)
}

// live returns the indexes of the replicas that run.
func (f *fleet) live() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var live []int
	for i, r := range f.replicas {
		if !r.exited() {
			live = append(live, i)
		}
	}
	return live
}

// get requests path on tunnel at replica entry's public entry; an entry
// that refuses the connection (its replica died, or drains and closed its
// listener) is passed over for the next, as a load balancer in front of the
// entries retries elsewhere. It returns the backend that answered and the
// entry that served the request.
func (f *fleet) get(tunnel, path string, entry int) (e echo, servedBy int, err error) {
	n := f.size()
	for k := range n {
		i := (entry + k) % n
		r := f.replica(i)
		req, err := http.NewRequest(http.MethodGet, "http://"+r.httpAddr+path, nil)
		if err != nil {
			return echo{}, i, err
		}
		req.Host = tunnel + "." + domain
		res, err := doWith(haClient, req)
		if errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		if err != nil {
			return echo{}, i, fmt.Errorf("via %s: %w", r.id, err)
		}
		if res.code != http.StatusOK {
			return echo{}, i, fmt.Errorf("via %s: %d %s %s", r.id, res.code, res.header.Get("X-Tether-Error"), strings.TrimSpace(res.body))
		}
		if err := json.Unmarshal([]byte(res.body), &e); err != nil {
			return echo{}, i, fmt.Errorf("via %s: not a backend echo: %q", r.id, res.body)
		}
		return e, i, nil
	}
	return echo{}, -1, errors.New("every replica's entry refused the connection")
}

// holdings reads every live replica's /api/tunnels: tunnel -> the replicas
// (indexes) with a session of it.
func (f *fleet) holdings(t testing.TB) map[string][]int {
	t.Helper()
	m := map[string][]int{}
	for _, i := range f.live() {
		for _, s := range f.replica(i).sessions(t) {
			if !slices.Contains(m[s.Name], i) {
				m[s.Name] = append(m[s.Name], i)
			}
		}
	}
	for _, l := range m {
		slices.Sort(l)
	}
	return m
}

// fleetView reads replica i's /api/fleet.
func (f *fleet) fleetView(i int) (tetherserver.Fleet, error) {
	var fl tetherserver.Fleet
	r, err := f.replica(i).admin("/api/fleet")
	if err != nil {
		return fl, err
	}
	if r.code != http.StatusOK {
		return fl, fmt.Errorf("GET /api/fleet: %d %s", r.code, r.body)
	}
	err = json.Unmarshal([]byte(r.body), &fl)
	return fl, err
}

// haTunnel is a tunnel of the fleet: its backend and its client.
type haTunnel struct {
	name        string
	backend     *backend
	client      *client
	connections int           // the client's --connections
	probed      *atomic.Int64 // requests for /peer-probe that reached the backend
}

// startTunnel starts a backend and a tether client with --connections n
// whose --server is via (a balancer), and waits until the client is ready.
func (f *fleet) startTunnel(name, backendName, via string, n int) haTunnel {
	f.t.Helper()
	probed := &atomic.Int64{}
	b := newBackend(f.t, backendName, map[string]http.HandlerFunc{
		"/peer-probe": func(http.ResponseWriter, *http.Request) { probed.Add(1) },
	})
	c := startClient(f.t, f.replica(0).server, clientOpts{
		server:    via,
		tokenFile: writeToken(f.t, f.keys.issue(f.t, name, time.Hour)),
		routes:    []string{"/=" + b.url()},
		args:      []string{"--connections", strconv.Itoa(n), "--log-level", "info"},
	})
	return haTunnel{name: name, backend: b, client: c, connections: n, probed: probed}
}

// readySessions returns the replicas of a client's ready sessions (one
// entry per session).
func readySessions(c *client) ([]string, error) {
	st, err := c.status()
	if err != nil {
		return nil, err
	}
	var replicas []string
	for _, s := range st.Sessions {
		if s.State == "ready" {
			replicas = append(replicas, s.Replica)
		}
	}
	return replicas, nil
}

// waitSessions waits until every client has as many ready sessions as its
// --connections and returns, for each, how long after since that first held.
func waitSessions(t testing.TB, tunnels []haTunnel, since time.Time, timeout time.Duration) map[string]time.Duration {
	t.Helper()
	took := map[string]time.Duration{}
	testutil.WaitFor(t, timeout, func() error {
		var missing []string
		for _, tu := range tunnels {
			if _, ok := took[tu.name]; ok {
				continue
			}
			rs, err := readySessions(tu.client)
			if err != nil {
				return fmt.Errorf("client of %s: %w", tu.name, err)
			}
			if len(rs) != tu.connections {
				missing = append(missing, fmt.Sprintf("%s has %d ready sessions %v, want %d", tu.name, len(rs), rs, tu.connections))
				continue
			}
			took[tu.name] = time.Since(since)
		}
		if len(missing) > 0 {
			return errors.New(strings.Join(missing, "; "))
		}
		return nil
	})
	return took
}

func maxDuration(m map[string]time.Duration) time.Duration {
	var d time.Duration
	for _, v := range m {
		d = max(d, v)
	}
	return d
}

// ---------------------------------------------------------------------------
// Steady load

// load requests every tunnel through every replica's entry, over and over,
// from a few workers, and records each request.
type load struct {
	f       *fleet
	tunnels []haTunnel
	stopc   chan struct{}
	wg      sync.WaitGroup

	mu      sync.Mutex
	results []outcome
}

// outcome is one request of the load.
type outcome struct {
	tunnel     string
	entry      int // the replica whose entry it was sent to
	servedBy   int // the entry that took it (another when that one refused)
	start, end time.Time
	err        error
}

func startLoad(f *fleet, tunnels []haTunnel) *load {
	l := &load{f: f, tunnels: tunnels, stopc: make(chan struct{})}
	for w := range haWorkers {
		l.wg.Go(func() { l.work(w) })
	}
	return l
}

func (l *load) work(w int) {
	for i := w; ; i += haWorkers {
		tu := l.tunnels[i%len(l.tunnels)]
		entry := (i / len(l.tunnels)) % haReplicas
		o := outcome{tunnel: tu.name, entry: entry, start: time.Now()}
		e, servedBy, err := l.f.get(tu.name, "/load", entry)
		if err == nil && e.Backend != tu.backend.name {
			err = fmt.Errorf("answered by backend %q, want %q", e.Backend, tu.backend.name)
		}
		o.servedBy, o.end, o.err = servedBy, time.Now(), err
		l.mu.Lock()
		l.results = append(l.results, o)
		l.mu.Unlock()
		select {
		case <-l.stopc:
			return
		case <-time.After(haPace):
		}
	}
}

func (l *load) stop() {
	close(l.stopc)
	l.wg.Wait()
}

// since returns the outcomes of the requests started at or after t.
func (l *load) since(t time.Time) []outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	var list []outcome
	for _, o := range l.results {
		if !o.start.Before(t) {
			list = append(list, o)
		}
	}
	return list
}

// waitCount waits until at least n requests started after t have ended.
func (l *load) waitCount(t testing.TB, after time.Time, n int) {
	t.Helper()
	testutil.WaitFor(t, 60*time.Second, func() error {
		if got := len(l.since(after)); got < n {
			return fmt.Errorf("%d requests since %s, want %d", got, after.Format("15:04:05.000"), n)
		}
		return nil
	})
}

func failures(list []outcome) []outcome {
	var fails []outcome
	for _, o := range list {
		if o.err != nil {
			fails = append(fails, o)
		}
	}
	return fails
}

func describe(list []outcome, at time.Time) string {
	var b strings.Builder
	for i, o := range list {
		if i == 10 {
			fmt.Fprintf(&b, "\n  ... and %d more", len(list)-10)
			break
		}
		fmt.Fprintf(&b, "\n  %s through replica %d, started %+v and took %v after the event: %v",
			o.tunnel, o.entry, o.start.Sub(at).Round(time.Millisecond), o.end.Sub(o.start).Round(time.Millisecond), o.err)
	}
	return b.String()
}

// getWith requests path on tunnel at s's entry with c.
func (s *server) getWith(c *http.Client, tunnel, path string) (response, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+s.httpAddr+path, nil)
	if err != nil {
		return response{}, err
	}
	req.Host = tunnel + "." + domain
	return doWith(c, req)
}

// rawExchange writes b on a new connection to addr and returns what comes
// back until the peer closes the connection (or 5s pass).
func rawExchange(t testing.TB, addr, b string) string {
	t.Helper()
	conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, b); err != nil {
		return ""
	}
	got, _ := io.ReadAll(bufio.NewReader(conn))
	return string(got)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}

// viewsMatch checks that every live replica's /api/fleet lists each tunnel
// with exactly the replicas whose /api/tunnels list a session of it.
func (f *fleet) viewsMatch(t testing.TB) error {
	holds := f.holdings(t)
	for _, i := range f.live() {
		fl, err := f.fleetView(i)
		if err != nil {
			return err
		}
		if !fl.Registry.Up {
			return fmt.Errorf("%s: registry not up yet", fl.Replica)
		}
		for name, want := range holds {
			var got []int
			for _, h := range fl.Tunnels[name] {
				got = append(got, f.indexOf(h.Replica))
			}
			sort.Ints(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s's fleet view: %s held by replicas %v, want %v", fl.Replica, name, got, want)
			}
		}
	}
	return nil
}

func (f *fleet) indexOf(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.replicas {
		if r.id == id {
			return i
		}
	}
	return -1
}

func roundAll(m map[string]time.Duration) map[string]time.Duration {
	out := make(map[string]time.Duration, len(m))
	for k, v := range m {
		out[k] = v.Round(time.Millisecond)
	}
	return out
}
