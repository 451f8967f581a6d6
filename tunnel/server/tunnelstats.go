package server

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/tunnel/server/gate"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// statsRetention is how long this replica remembers a tunnel after its last
// session here ended, or after it last saw it served by any replica: its
// per-tunnel series stay for that long, so that a tunnel that went down is
// seen down (and its counters do not vanish and come back from zero) for a
// day.
const statsRetention = 24 * time.Hour

// statsSweepEvery bounds how often a login looks for records to forget, so
// that forgetting costs a login nothing most of the time.
const statsSweepEvery = time.Minute

// tunnelStats is what this replica's metrics know of each tunnel, for the
// life of the process rather than of a session: the requests served and the
// bytes carried through its sessions here, counted so that the per-tunnel
// counters never go backwards when a session ends; and whether it is up, on
// any replica (the registry), and when it was last seen so. It is the one
// owner of those facts; members reports each session here (join) and
// counts each request on the session's record, and the session's end adds
// its bytes.
//
// Memory is bounded: a tunnel's totals are forgotten statsRetention after
// its last session here ended, and the tunnel itself once it has also not
// been served by any replica for as long. Only logged-in tunnels (a
// verified token) and tunnels in the registry get a record.
type tunnelStats struct {
	// Static after newTunnelStats.
	registry registry.Registry // which tunnels any replica serves
	now      func() time.Time

	// Guarded by mu.
	mu      sync.Mutex
	tunnels map[string]*tunnelRecord
	swept   time.Time // when records were last looked at for forgetting
}

// tunnelRecord is one tunnel's totals on this replica.
type tunnelRecord struct {
	// Counted by the entry, without the lock: requests served through the
	// tunnel's sessions here by status class, indexed as member.requests.
	requests [6]atomic.Uint64

	// Guarded by tunnelStats.mu.
	sessions          []*gate.Session // logged in here and not ended: their bytes are read live
	endedIn, endedOut uint64          // the bytes of its sessions here that ended
	lastLocal         time.Time       // when a session of it was last live here; zero: never, or forgotten
	lastSeen          time.Time       // when a session of it was last live here or it was last served by any replica
}

func newTunnelStats(reg registry.Registry, now func() time.Time) *tunnelStats {
	return &tunnelStats{registry: reg, now: now, tunnels: make(map[string]*tunnelRecord)}
}

// join records a logged-in session of its tunnel, and returns the record
// its requests are counted on. The session's bytes count toward the
// tunnel's totals from then on, also after it ends.
func (ts *tunnelStats) join(sess *gate.Session) *tunnelRecord {
	now := ts.now()
	ts.mu.Lock()
	if now.Sub(ts.swept) >= statsSweepEvery {
		ts.sweepLocked(now)
	}
	r := ts.recordLocked(sess.Tunnel())
	r.sessions = append(r.sessions, sess)
	r.lastLocal, r.lastSeen = now, now
	ts.mu.Unlock()
	// After the lock: OnEnd runs ended at once for a session that ended.
	sess.OnEnd(func() { ts.ended(r, sess) })
	return r
}

// ended moves an ended session's bytes into its tunnel's totals.
func (ts *tunnelStats) ended(r *tunnelRecord, sess *gate.Session) {
	now := ts.now()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	i := slices.Index(r.sessions, sess)
	if i < 0 {
		return
	}
	// Read under the lock, with the removal: a scrape sees the session's
	// bytes either live or ended, never both or neither.
	in, out := sess.Traffic()
	r.sessions = slices.Delete(r.sessions, i, i+1)
	r.endedIn += in
	r.endedOut += out
	r.lastLocal, r.lastSeen = now, now
}

func (ts *tunnelStats) recordLocked(name string) *tunnelRecord {
	r := ts.tunnels[name]
	if r == nil {
		r = &tunnelRecord{}
		ts.tunnels[name] = r
	}
	return r
}

// sweepLocked forgets the totals of the tunnels that had no session here
// for statsRetention, and the tunnels not seen for as long.
func (ts *tunnelStats) sweepLocked(now time.Time) {
	ts.swept = now
	for name, r := range ts.tunnels {
		if r.local() && len(r.sessions) == 0 && now.Sub(r.lastLocal) >= statsRetention {
			// No session of it is left here to count on its totals.
			for i := range r.requests {
				r.requests[i].Store(0)
			}
			r.endedIn, r.endedOut, r.lastLocal = 0, 0, time.Time{}
		}
		if !r.local() && now.Sub(r.lastSeen) >= statsRetention {
			delete(ts.tunnels, name)
		}
	}
}

// local reports whether the tunnel had a session here within
// statsRetention: its totals here are exported.
func (r *tunnelRecord) local() bool { return !r.lastLocal.IsZero() }

// count records one request served through a session of the tunnel, by
// its status code (0 = failed before a response).
func (r *tunnelRecord) count(status int) { r.requests[statusClass(status)].Add(1) }

// traffic returns the tunnel's bytes here: its ended sessions' and its
// live sessions' so far. Guarded by tunnelStats.mu.
func (r *tunnelRecord) trafficLocked() (in, out uint64) {
	in, out = r.endedIn, r.endedOut
	for _, s := range r.sessions {
		sin, sout := s.Traffic()
		in += sin
		out += sout
	}
	return in, out
}

// tokenExpiryLocked returns the latest expiry among the tokens of the
// tunnel's live sessions here, zero with none. The session's claims are
// read now: a renewal replaces them. Guarded by tunnelStats.mu.
func (r *tunnelRecord) tokenExpiryLocked() time.Time {
	var latest time.Time
	for _, s := range r.sessions {
		if c := s.Claims(); c != nil && c.ExpiresAt.After(latest) {
			latest = c.ExpiresAt
		}
	}
	return latest
}

var (
	tunnelRequestsDesc = prometheus.NewDesc("tether_tunnel_requests_total",
		"Public HTTP requests served through a tunnel's sessions on this server since it started, by status class (error = failed before a response). Kept for 24h after the tunnel's last session here ended.",
		[]string{"tunnel", "code_class"}, nil)
	tunnelBytesDesc = prometheus.NewDesc("tether_tunnel_bytes_total",
		"Bytes on a tunnel's session connections on this server since it started; in = sent by the clients. Kept for 24h after the tunnel's last session here ended.",
		[]string{"tunnel", "direction"}, nil)

	tunnelUpDesc = prometheus.NewDesc("tether_tunnel_up",
		"1 while a session serves the tunnel on any replica (per the registry), 0 after; kept for 24h after it was last seen.",
		[]string{"tunnel"}, nil)
	tunnelLastSeenDesc = prometheus.NewDesc("tether_tunnel_last_seen_timestamp_seconds",
		"When the tunnel was last seen connected, here or on any replica (Unix seconds): now while it is up. Kept for 24h.",
		[]string{"tunnel"}, nil)
	tunnelTokenExpiryDesc = prometheus.NewDesc("tether_tunnel_token_expiry_timestamp_seconds",
		"When the token of the tunnel's session here that expires last does (its exp, Unix seconds), read at scrape time, so that a renewed token moves it. Absent while no session of the tunnel is here.",
		[]string{"tunnel"}, nil)
)

// Describe implements prometheus.Collector.
func (ts *tunnelStats) Describe(ch chan<- *prometheus.Desc) {
	ch <- tunnelRequestsDesc
	ch <- tunnelBytesDesc
	ch <- tunnelUpDesc
	ch <- tunnelLastSeenDesc
	ch <- tunnelTokenExpiryDesc
}

// Collect implements prometheus.Collector. A tunnel any replica serves is
// up, and seen now. Every status class of a tunnel is exported from its
// first session here, at 0 until counted, so that a rate of 5xx sees the
// first one.
func (ts *tunnelStats) Collect(ch chan<- prometheus.Metric) {
	now := ts.now()
	served := ts.registry.Snapshot()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for name := range served {
		ts.recordLocked(name).lastSeen = now
	}
	ts.sweepLocked(now)
	for name, r := range ts.tunnels {
		if len(r.sessions) > 0 {
			r.lastSeen = now
		}
		up := 0.0
		if len(served[name]) > 0 {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(tunnelUpDesc, prometheus.GaugeValue, up, name)
		ch <- prometheus.MustNewConstMetric(tunnelLastSeenDesc, prometheus.GaugeValue, float64(r.lastSeen.UnixMilli())/1e3, name)
		if exp := r.tokenExpiryLocked(); !exp.IsZero() {
			ch <- prometheus.MustNewConstMetric(tunnelTokenExpiryDesc, prometheus.GaugeValue, float64(exp.Unix()), name)
		}
		if !r.local() {
			continue
		}
		for class := range r.requests {
			ch <- prometheus.MustNewConstMetric(tunnelRequestsDesc, prometheus.CounterValue,
				float64(r.requests[class].Load()), name, classLabel(class*100))
		}
		in, out := r.trafficLocked()
		ch <- prometheus.MustNewConstMetric(tunnelBytesDesc, prometheus.CounterValue, float64(in), name, "in")
		ch <- prometheus.MustNewConstMetric(tunnelBytesDesc, prometheus.CounterValue, float64(out), name, "out")
	}
}
