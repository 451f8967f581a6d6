package server

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tether-dev/tether/tunnel/server/registry"
)

// adminHandler serves the operator's endpoints:
//
//	GET /healthz      200 while the process runs
//	GET /readyz       200 while serving, 503 before start-up completes and while draining
//	GET /metrics      Prometheus
//	GET /api/tunnels  JSON list of this replica's sessions (a tunnel may have several), each
//	                  with its tunnel's buffered requests, and a row for each tunnel
//	                  with buffered requests but no session here
//	/api/tunnels/{name}/buffer: webhook.Forwarder.Register
//	GET /api/fleet    JSON: every tunnel the registry knows, with the replicas that serve it
//	/api/revocations, /api/tunnels/{name}/disconnect: revokeapi.go
//	GET /debug/pprof/ Go profiles
//
// When an admin token is configured, every endpoint but the probes
// (/healthz, /readyz) requires it: /metrics names every tunnel and its
// traffic, which one tenant must not learn about another.
func (s *replica) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case s.draining.Load():
			writeText(w, http.StatusServiceUnavailable, "draining")
		case !s.ready.Load():
			writeText(w, http.StatusServiceUnavailable, "starting")
		default:
			writeText(w, http.StatusOK, "ready")
		}
	})
	mux.Handle("GET /metrics", s.srv.requireAdminToken(promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})))
	mux.Handle("GET /api/tunnels", s.srv.requireAdminToken(http.HandlerFunc(s.listTunnels)))
	mux.Handle("GET /api/fleet", s.srv.requireAdminToken(http.HandlerFunc(s.srv.listFleet)))
	s.registerRevocationAPI(mux, s.srv.requireAdminToken)
	s.srv.webhooks.register(mux, s.srv.requireAdminToken)
	// Profiles for an operator chasing CPU or memory.
	mux.Handle("GET /debug/pprof/", s.srv.requireAdminToken(http.HandlerFunc(pprof.Index)))
	mux.Handle("GET /debug/pprof/profile", s.srv.requireAdminToken(http.HandlerFunc(pprof.Profile)))
	return mux
}

func (s *replica) listTunnels(w http.ResponseWriter, r *http.Request) {
	sessions := s.members.list()
	list := make([]Info, 0, len(sessions))
	for _, m := range sessions {
		info := s.members.info(m)
		info.Replica = s.srv.cfg.ReplicaID
		list = append(list, info)
	}
	writeJSON(w, s.srv.webhooks.withBuffers(r.Context(), list))
}

// Fleet is what /api/fleet reports: the registry's view of every replica's
// tunnels, as this replica sees it.
type Fleet struct {
	// Replica is the replica that answered.
	Replica string `json:"replica"`
	// Registry is the registry's connection state.
	Registry registry.Status `json:"registry"`
	// Tunnels maps each tunnel to the replicas that serve it.
	Tunnels map[string][]registry.Holder `json:"tunnels"`
}

func (s *Server) listFleet(w http.ResponseWriter, _ *http.Request) {
	tunnels := s.registry.Snapshot()
	if tunnels == nil {
		tunnels = map[string][]registry.Holder{}
	}
	writeJSON(w, Fleet{Replica: s.cfg.ReplicaID, Registry: s.registry.Status(), Tunnels: tunnels})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// requireAdminToken demands "Authorization: Bearer <token>" when an admin
// token is configured. New refuses a non-loopback admin address without one.
func (s *Server) requireAdminToken(next http.Handler) http.Handler {
	if s.adminToken == "" {
		return next
	}
	want := []byte(s.adminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tether admin"`)
			writeText(w, http.StatusUnauthorized, "missing or wrong admin token: send Authorization: Bearer <the --admin-token-file contents>")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	// Plain text that no browser sniffs as HTML: a path value quoted in it
	// (an unknown revocation's ID) cannot script anything.
	_, _ = w.Write([]byte(body + "\n")) //nolint:gosec // G705: text/plain, nosniff
}
