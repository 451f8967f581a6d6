package client

import (
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tether-dev/tether/proxy"
)

// status is what the client knows about its tunnel, for readiness, the
// /status endpoint, metrics and logs.
type status struct {
	tunnel, server, transport string
	routes                    []proxy.Route

	mu            sync.Mutex
	connected     bool
	connectedAt   time.Time
	via           string
	loggedIn      bool
	loggedInAt    time.Time
	routeUp       bool
	routeError    string
	lastError     string
	lastErrorAt   time.Time
	connections   int // successful connections; reconnects = connections-1
	failures      int
	loginRejected int
}

func newStatus(tunnel, server, transport string, routes []proxy.Route) *status {
	return &status{tunnel: tunnel, server: server, transport: transport, routes: routes}
}

func (s *status) onConnected(via string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected, s.connectedAt, s.via = true, time.Now(), via
	s.connections++
}

// disconnected records a lost session; it reports whether one was up.
func (s *status) onDisconnected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.connected
	s.connected, s.loggedIn, s.routeUp, s.routeError = false, false, false, ""
	return was
}

func (s *status) onLoggedIn() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loggedIn, s.loggedInAt = true, time.Now()
	s.lastError = ""
}

// onRoute records the server's answer to the route registration.
func (s *status) onRoute(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routeUp, s.routeError = err == nil, ""
	if err != nil {
		s.routeError = err.Error()
	}
}

func (s *status) onFailed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastError, s.lastErrorAt = err.Error(), time.Now()
	if s.connected {
		s.loginRejected++
	} else {
		s.failures++
	}
}

// readiness is true while the tunnel is logged in and its route registered;
// otherwise reason says what is missing.
func (s *status) readiness() (ready bool, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.connected:
		return false, withCause("not connected to the tunnel server", s.lastError)
	case !s.loggedIn:
		return false, withCause("connected, not logged in", s.lastError)
	case !s.routeUp:
		return false, withCause("logged in, route not registered", s.routeError)
	}
	return true, "ready"
}

func withCause(what, cause string) string {
	if cause == "" {
		return what
	}
	return what + ": " + cause
}

// Snapshot is the client's state as /status reports it.
type Snapshot struct {
	Tunnel         string       `json:"tunnel"`
	Server         string       `json:"server"`
	Transport      string       `json:"transport"`
	Via            string       `json:"via,omitempty"`
	Ready          bool         `json:"ready"`
	State          string       `json:"state"`
	Connected      bool         `json:"connected"`
	ConnectedSince *time.Time   `json:"connected_since,omitempty"`
	LoggedInSince  *time.Time   `json:"logged_in_since,omitempty"`
	LastError      string       `json:"last_error,omitempty"`
	LastErrorAt    *time.Time   `json:"last_error_at,omitempty"`
	Reconnects     int          `json:"reconnects"`
	Routes         []RouteState `json:"routes"`
}

// RouteState is one configured route as /status reports it.
type RouteState struct {
	Prefix   string `json:"prefix"`
	Upstream string `json:"upstream"`
	Adapter  string `json:"adapter"`
}

func (s *status) snapshot() Snapshot {
	ready, state := s.readiness()
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := Snapshot{
		Tunnel: s.tunnel, Server: s.server, Transport: s.transport, Ready: ready, State: state,
		Connected: s.connected, LastError: s.lastError, Reconnects: max(s.connections-1, 0),
	}
	if s.connected {
		snap.Via = s.via
		snap.ConnectedSince = timePtr(s.connectedAt)
	}
	if s.loggedIn {
		snap.LoggedInSince = timePtr(s.loggedInAt)
	}
	if s.lastError != "" {
		snap.LastErrorAt = timePtr(s.lastErrorAt)
	}
	for _, r := range s.routes {
		snap.Routes = append(snap.Routes, RouteState{Prefix: r.Prefix, Upstream: r.Upstream.String(), Adapter: r.Adapter})
	}
	return snap
}

func timePtr(t time.Time) *time.Time { t = t.UTC(); return &t }

// collectors exposes the status as Prometheus metrics.
func (s *status) collectors() []prometheus.Collector {
	read := func(f func() float64) func() float64 {
		return func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return f()
		}
	}
	boolean := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_client_ready", Help: "1 while the tunnel is logged in and its route registered.",
		}, func() float64 { ok, _ := s.readiness(); return boolean(ok) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_client_connected", Help: "1 while a connection to the tunnel server is up.",
		}, read(func() float64 { return boolean(s.connected) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_client_connections_total", Help: "Connections established to the tunnel server (reconnects + 1).",
		}, read(func() float64 { return float64(s.connections) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_client_connect_failures_total", Help: "Connection attempts that failed before login (DNS, TCP, proxy, TLS).",
		}, read(func() float64 { return float64(s.failures) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_client_login_rejections_total", Help: "Logins the server rejected (token expired, wrong key, ...).",
		}, read(func() float64 { return float64(s.loginRejected) })),
	}
}

// healthHandler serves the client's health address:
//
//	/healthz  200 while the process runs
//	/readyz   200 only while the tunnel is logged in and its route registered
//	/status   the state as JSON (what `tether status` prints)
//	/metrics  Prometheus
//	/debug/logs  the client's last log lines, JSON, oldest first
func (c *Client) healthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, reason := c.status.readiness(); !ok {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+reason)
			return
		}
		writeText(w, http.StatusOK, "ready")
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(c.status.snapshot())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/logs", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		c.logs.writeTo(w)
	})
	return mux
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body + "\n"))
}

// LocalHealthAddr is where a process on the same host reaches a client whose
// --health-addr is listenAddr: a wildcard host (0.0.0.0, [::] or none), which
// is how the client listens in a pod, becomes loopback.
func LocalHealthAddr(listenAddr string) string {
	host, port, err := net.SplitHostPort(listenAddr)
	if err != nil {
		return listenAddr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}
