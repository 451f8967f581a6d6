package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/version"
	"github.com/tether-dev/tether/tunnel/server/gate"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// metrics are the server's Prometheus metrics, on a registry of its own.
//
// Label cardinality is bounded: reasons and status classes are fixed sets,
// and per-tunnel series exist only for tunnels seen within a day
// (tunnelstats.go), instead of being kept in vectors that would remember
// every tunnel ever seen.
type metrics struct {
	// Static after newMetrics: the registry and its collectors, each safe
	// for concurrent use.
	reg              *prometheus.Registry
	sessionsReplaced prometheus.Counter
	loginsAccepted   prometheus.Counter
	loginsRejected   *prometheus.CounterVec
	routesRejected   *prometheus.CounterVec
	refusedStreams   *prometheus.CounterVec
	// The gate's limits (gate/limits.go).
	connectionsRefused *prometheus.CounterVec
	sessionsLimited    *prometheus.CounterVec
	probes             *prometheus.CounterVec
	unrouted           *prometheus.CounterVec
	requestDuration    *prometheus.HistogramVec
	// Between replicas (peer.go).
	forwarded   *prometheus.CounterVec
	peerServed  prometheus.Counter
	peerRefused prometheus.Counter
	// sessionsSilent counts sessions closed for a client that stopped
	// answering while its tunnel had others (gate.Host's Silent).
	sessionsSilent prometheus.Counter
	// tunnels are the per-tunnel series, kept beyond their sessions.
	tunnels *tunnelStats
}

func newMetrics(members func() []*member, anonymous func() int, entryConns *connSlots, reg registry.Registry) *metrics {
	m := &metrics{
		reg:     prometheus.NewRegistry(),
		tunnels: newTunnelStats(reg, time.Now),
		sessionsReplaced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_sessions_replaced_total",
			Help: "Tunnel sessions ended because a newer login of the same tunnel took over (e.g. after a NAT dropped the old connection).",
		}),
		loginsAccepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_logins_accepted_total",
			Help: "Tunnel client logins accepted.",
		}),
		loginsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_logins_rejected_total",
			Help: "Tunnel client logins rejected, by reason (expired, bad_signature, session_limit, ...).",
		}, []string{"reason"}),
		routesRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_routes_rejected_total",
			Help: "Route registrations (frp NewProxy) rejected, by reason.",
		}, []string{"reason"}),
		refusedStreams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_streams_refused_total",
			Help: "Client streams refused by the session layer before reaching frp, by reason (malformed, too_large, second_login, foreign_work_conn, message_type); the session that opened one is closed.",
		}, []string{"reason"}),
		connectionsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_connections_refused_total",
			Help: "Connections closed at accept: tunnel connections, before TLS, because too many that have not logged in are open, in total with none to evict (anonymous), from the client's address (anonymous_per_ip) or from its /24 or IPv6 /48 (anonymous_per_subnet); public entry connections beyond --max-http-connections with none idle (http_connections) or beyond --max-http-connections-per-ip from the caller's address with none of them idle (http_connections_per_ip), and peer port connections beyond --max-http-connections (peer_connections). Also idle keep-alive connections closed to make room for a new one: at --max-http-connections (http_idle_evicted, peer_idle_evicted) and at --max-http-connections-per-ip, the caller's own (http_idle_evicted_per_ip).",
		}, []string{"reason"}),
		sessionsLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_sessions_closed_by_limit_total",
			Help: "Tunnel connections closed for going over a limit, by limit: first_byte (no TLS handshake within 5s of connecting), evicted (not logged in, closed to make room at the anonymous cap as the one that kept the server waiting longest), login_budget (sent too much before logging in), stream_before_login, no_login (no login soon after the handshake), login_timeout, streams (too many open at once), pings (too frequent).",
		}, []string{"limit"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_login_probes_total",
			Help: "Login probes (tether diagnose) answered, by result (accepted, rejected).",
		}, []string{"result"}),
		unrouted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_http_unrouted_requests_total",
			Help: "Public HTTP requests answered by tether itself, by reason: unknown_host (404), tunnel_down (503), tunnel_disconnected (502: every session of the tunnel failed under the request), tunnel_busy (503: --max-requests-per-tunnel in flight, or half of it in websockets and event streams), caller_busy (429: the caller's --max-requests-per-caller in flight to the tunnel), body_timeout (408: the body sent nothing for --body-idle-timeout), connect (405: CONNECT), absolute_form (400: absolute-form target), ambiguous_length (400: both Content-Length and Transfer-Encoding).",
		}, []string{"reason"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_http_request_duration_seconds",
			Help:    "Time to serve a public HTTP request through a tunnel, until the response body ends, by status class.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"code_class"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_peer_forwarded_total",
			Help: "Requests forwarded to another replica that serves the tunnel, by result: ok (answered), unreachable (that replica could not be connected to; the next was tried), missed (it no longer served the tunnel; the next was tried, or the request waited for the tunnel's client).",
		}, []string{"result"}),
		peerServed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_peer_requests_total",
			Help: "Requests other replicas forwarded here.",
		}),
		sessionsSilent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_sessions_silent_total",
			Help: "Sessions closed because their client stopped answering (no answer to a ping) while the tunnel had other sessions to serve its requests.",
		}),
		peerRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_peer_refused_total",
			Help: "Connections to the peer port refused at the TLS handshake: no certificate of a replica of this fleet (another --peer-secret-file or --peer-tls-ca, an earlier version, or no replica).",
		}),
	}
	m.preset()
	m.reg.MustRegister(
		m.forwarded, m.peerServed, m.peerRefused, m.sessionsSilent, registry.NewCollector(reg),
		m.sessionsReplaced, m.loginsAccepted, m.loginsRejected, m.routesRejected,
		m.refusedStreams, m.probes, m.unrouted, m.requestDuration,
		m.connectionsRefused, m.sessionsLimited,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_anonymous_connections",
			Help: "Tunnel connections accepted that have not logged in (yet): handshaking, logging in, or probing.",
		}, func() float64 { return float64(anonymous()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_http_connections",
			Help: "Connections open on the public entry (--http-addr), websockets included; --max-http-connections caps them.",
		}, func() float64 { return float64(entryConns.count()) }),
		tunnelCollector{members: members}, m.tunnels,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		version.Collector(),
	)
	return m
}

// unroutedReasons are the reasons of tether_http_unrouted_requests_total.
var unroutedReasons = []string{
	"unknown_host", "tunnel_down", "tunnel_disconnected", "tunnel_busy", unroutedCallerBusy,
	unroutedBodyTimeout, "connect", "absolute_form", unroutedAmbiguousLength,
}

// preset makes every known label value of the vectors exist from the
// start, at 0, so that an alert on a rise (increase(), rate()) sees the
// first event rather than a series that appears with it.
func (m *metrics) preset() {
	for _, r := range auth.Reasons() {
		m.loginsRejected.WithLabelValues(string(r))
	}
	for _, r := range auth.RouteReasons() {
		m.routesRejected.WithLabelValues(string(r))
	}
	for _, r := range gate.StreamRefusals() {
		m.refusedStreams.WithLabelValues(r)
	}
	for _, r := range append(gate.Refusals(), entryCapLabels.refused, entryCapLabels.refusedPerIP, entryCapLabels.evicted,
		entryCapLabels.evictedPerIP, peerCapLabels.refused, peerCapLabels.evicted) {
		m.connectionsRefused.WithLabelValues(r)
	}
	for _, l := range gate.Limits() {
		m.sessionsLimited.WithLabelValues(l)
	}
	for _, r := range unroutedReasons {
		m.unrouted.WithLabelValues(r)
	}
	for _, r := range []string{"accepted", "rejected"} {
		m.probes.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "unreachable", "missed"} {
		m.forwarded.WithLabelValues(r)
	}
	for _, c := range []int{0, 100, 200, 300, 400, 500} {
		m.requestDuration.WithLabelValues(classLabel(c))
	}
}

// LoginAccepted implements auth.Observer.
func (m *metrics) LoginAccepted(*auth.Claims) { m.loginsAccepted.Inc() }

// LoginRejected implements auth.Observer.
func (m *metrics) LoginRejected(reason auth.Reason) {
	m.loginsRejected.WithLabelValues(string(reason)).Inc()
}

// ConnectionRefused implements gate.Observer.
func (m *metrics) ConnectionRefused(reason string) {
	m.connectionsRefused.WithLabelValues(reason).Inc()
}

// SessionLimited implements gate.Observer.
func (m *metrics) SessionLimited(limit string) { m.sessionsLimited.WithLabelValues(limit).Inc() }

// StreamRefused implements gate.Observer.
func (m *metrics) StreamRefused(reason string) { m.refusedStreams.WithLabelValues(reason).Inc() }

// RouteRejected implements auth.Observer.
func (m *metrics) RouteRejected(reason auth.Reason) {
	m.routesRejected.WithLabelValues(string(reason)).Inc()
}

var (
	tunnelsDesc = prometheus.NewDesc("tether_tunnels_connected",
		"Tunnels with a logged-in session on this server.", nil, nil)
	sessionsDesc = prometheus.NewDesc("tether_sessions_connected",
		"Logged-in tunnel sessions on this server (a tunnel may have several).", nil, nil)
)

// tunnelCollector counts the connected tunnels and sessions at scrape time.
type tunnelCollector struct{ members func() []*member }

func (c tunnelCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tunnelsDesc
	ch <- sessionsDesc
}

func (c tunnelCollector) Collect(ch chan<- prometheus.Metric) {
	sessions := c.members() // by tunnel
	tunnels := 0
	for i, m := range sessions {
		if i == 0 || m.sess.Tunnel() != sessions[i-1].sess.Tunnel() {
			tunnels++
		}
	}
	ch <- prometheus.MustNewConstMetric(tunnelsDesc, prometheus.GaugeValue, float64(tunnels))
	ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(len(sessions)))
}
