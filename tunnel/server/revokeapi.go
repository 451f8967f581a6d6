package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// The operator's hold on tunnels, in the admin API (behind the admin
// token):
//
//	POST   /api/revocations                 {"tunnel"|"jti", "until"?, "reason"?} → 201 the revocation
//	GET    /api/revocations                 → 200 the revocations in force, oldest first
//	DELETE /api/revocations/{id}            → 200 the deleted revocation; 404 for none
//	POST   /api/tunnels/{name}/disconnect   → 200 {"tunnel", "sessions_closed", "replicas", "unreached"?}
//
// A revocation closes the sessions it covers on every replica (tokens.go)
// and refuses their logins until it ends. A disconnect closes the tunnel's
// sessions here and asks each replica the registry says serves it to close
// its own, over the peer channel; the clients log in again.

// maxAdminBody bounds an admin request's body: a revocation is well under
// 1 KiB.
const maxAdminBody = 16 << 10

// revokeRequest is the body of POST /api/revocations.
type revokeRequest struct {
	Tunnel string    `json:"tunnel"`
	JTI    string    `json:"jti"`
	Until  time.Time `json:"until"`
	Reason string    `json:"reason"`
}

// registerRevocationAPI adds the revocation and disconnect endpoints to mux,
// each behind guard (the admin token).
func (sv *replica) registerRevocationAPI(mux *http.ServeMux, guard func(http.Handler) http.Handler) {
	mux.Handle("POST /api/revocations", guard(http.HandlerFunc(sv.addRevocation)))
	mux.Handle("GET /api/revocations", guard(http.HandlerFunc(sv.listRevocations)))
	mux.Handle("DELETE /api/revocations/{id}", guard(http.HandlerFunc(sv.deleteRevocation)))
	mux.Handle("POST /api/tunnels/{name}/disconnect", guard(http.HandlerFunc(sv.disconnectTunnel)))
}

func (sv *replica) addRevocation(w http.ResponseWriter, r *http.Request) {
	var req revokeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeText(w, http.StatusBadRequest, `the body is not a revocation: `+err.Error()+`; send {"tunnel": NAME} or {"jti": ID}, with "until" (RFC 3339) and "reason" optional`)
		return
	}
	if req.Tunnel != "" {
		if err := auth.ValidTunnelName(req.Tunnel); err != nil {
			writeText(w, http.StatusBadRequest, fmt.Sprintf("--tunnel %q: %v", req.Tunnel, err))
			return
		}
	}
	rev, err := sv.srv.revocations.Add(r.Context(), registry.Revocation{Tunnel: req.Tunnel, JTI: req.JTI, Until: req.Until, Reason: req.Reason})
	switch {
	case errors.Is(err, registry.ErrInvalidRevocation), errors.Is(err, registry.ErrTooManyRevocations):
		writeText(w, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		sv.srv.log.Error("revocation not stored", zap.Error(err))
		writeText(w, http.StatusServiceUnavailable, "the revocation could not be stored: "+err.Error()+"; retry once the registry is back")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(rev)
}

func (sv *replica) listRevocations(w http.ResponseWriter, r *http.Request) {
	list, err := sv.srv.revocations.List(r.Context())
	if err != nil {
		writeText(w, http.StatusServiceUnavailable, "the revocations could not be read: "+err.Error()+"; retry once the registry is back")
		return
	}
	if list == nil {
		list = []registry.Revocation{}
	}
	writeJSON(w, list)
}

func (sv *replica) deleteRevocation(w http.ResponseWriter, r *http.Request) {
	rev, err := sv.srv.revocations.Delete(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, registry.ErrNotFound):
		writeText(w, http.StatusNotFound, fmt.Sprintf("no revocation %q; GET /api/revocations lists them", r.PathValue("id")))
		return
	case err != nil:
		writeText(w, http.StatusServiceUnavailable, "the revocation could not be deleted: "+err.Error()+"; retry once the registry is back")
		return
	}
	writeJSON(w, rev)
}

// disconnected is the answer of a disconnect: what was closed, where, and
// which replicas that serve the tunnel could not be asked.
type disconnected struct {
	Tunnel         string   `json:"tunnel"`
	SessionsClosed int      `json:"sessions_closed"`
	Replicas       []string `json:"replicas"`
	Unreached      []string `json:"unreached,omitempty"`
}

// peerControlHost is the Host of the peer channel's own requests between
// replicas, which no tunnel can have (.invalid is reserved, RFC 6761).
const peerControlHost = "peer.tether.invalid"

// peerDisconnectPath is where a replica asks another to close a tunnel's
// sessions.
const peerDisconnectPath = "/tether/disconnect/"

// peerControlTimeout bounds asking another replica to close a tunnel's
// sessions.
const peerControlTimeout = 5 * time.Second

func (sv *replica) disconnectTunnel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := auth.ValidTunnelName(name); err != nil {
		writeText(w, http.StatusBadRequest, fmt.Sprintf("tunnel %q: %v", name, err))
		return
	}
	d := disconnected{Tunnel: name, Replicas: []string{}}
	if n := sv.disconnectHere(name); n > 0 {
		d.SessionsClosed += n
		d.Replicas = append(d.Replicas, sv.srv.cfg.ReplicaID)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, h := range sv.srv.registry.Holders(name) {
		if h.Replica == sv.srv.cfg.ReplicaID {
			continue
		}
		wg.Go(func() {
			n, err := sv.askDisconnect(r.Context(), h, name)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				sv.srv.log.Warn("replica not asked to disconnect the tunnel", zap.String("tunnel", name), zap.String("replica", h.Replica), zap.Error(err))
				d.Unreached = append(d.Unreached, h.Replica)
			case n > 0:
				d.SessionsClosed += n
				d.Replicas = append(d.Replicas, h.Replica)
			}
		})
	}
	wg.Wait()
	slices.Sort(d.Replicas)
	slices.Sort(d.Unreached)
	sv.srv.log.Info("tunnel disconnected by the operator", zap.String("tunnel", name), zap.Int("sessions_closed", d.SessionsClosed),
		zap.Strings("replicas", d.Replicas), zap.Strings("unreached", d.Unreached))
	writeJSON(w, d)
}

// disconnectHere closes tunnel name's sessions on this replica and returns
// how many.
func (sv *replica) disconnectHere(name string) int {
	sessions := sv.members.sessionsOf(name)
	for _, sess := range sessions {
		sess.Close("disconnected by the platform operator; the client logs in again")
	}
	return len(sessions)
}

// askDisconnect asks replica h, over the peer channel, to close tunnel
// name's sessions, and returns how many it closed.
func (sv *replica) askDisconnect(ctx context.Context, h registry.Holder, name string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, peerControlTimeout)
	defer cancel()
	u := url.URL{Scheme: "https", Host: h.Addr, Path: peerDisconnectPath + name}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return 0, err
	}
	req.Host = peerControlHost
	res, err := sv.peerControl.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		text, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return 0, fmt.Errorf("replica %s answered %s: %s", h.Replica, res.Status, strings.TrimSpace(string(text)))
	}
	var d disconnected
	if err := json.NewDecoder(io.LimitReader(res.Body, maxAdminBody)).Decode(&d); err != nil {
		return 0, fmt.Errorf("replica %s: %w", h.Replica, err)
	}
	return d.SessionsClosed, nil
}

// servePeerControl answers another replica's own requests (peerControlHost)
// on the peer port, which only replicas reach.
func (sv *replica) servePeerControl(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, peerDisconnectPath)
	if r.Method != http.MethodPost || !ok || auth.ValidTunnelName(name) != nil {
		writeText(w, http.StatusNotFound, "no such peer request")
		return
	}
	n := sv.disconnectHere(name)
	if n > 0 {
		sv.srv.log.Info("tunnel disconnected by the platform operator, through another replica", zap.String("tunnel", name), zap.Int("sessions_closed", n))
	}
	writeJSON(w, disconnected{Tunnel: name, SessionsClosed: n, Replicas: []string{sv.srv.cfg.ReplicaID}})
}
