package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel/server/buffer"
)

// Summary is what /api/tunnels and tether status show of a tunnel's
// buffer.
type Summary struct {
	// Queued requests wait for delivery; Rejected ones were refused by
	// their upstream and wait for a person.
	Queued   int `json:"queued"`
	Rejected int `json:"rejected"`
	// Bytes is what the stored requests count against the quotas.
	Bytes int64 `json:"bytes"`
	// Oldest is when the oldest stored request was accepted, and
	// OldestAgeSeconds how long ago that was when the summary was made;
	// both absent when none is stored.
	Oldest           time.Time `json:"oldest,omitzero"`
	OldestAgeSeconds int64     `json:"oldest_age_seconds,omitempty"`
}

func summarize(st buffer.Stats, now time.Time) Summary {
	s := Summary{Queued: st.Queued, Rejected: st.Rejected, Bytes: st.Bytes, Oldest: st.Oldest}
	if !st.Oldest.IsZero() {
		s.OldestAgeSeconds = max(int64(now.Sub(st.Oldest)/time.Second), 0)
	}
	return s
}

// Summary returns the state of tunnel's buffer (one store round trip).
func (f *Forwarder) Summary(ctx context.Context, tunnel string) (Summary, error) {
	st, err := f.buf.Stats(ctx, tunnel)
	if err != nil {
		return Summary{}, err
	}
	return summarize(st, time.Now()), nil
}

// Summaries returns the state of the buffer of every tunnel that has
// stored requests, on any replica (one store round trip); none on a nil
// Forwarder (buffering off).
func (f *Forwarder) Summaries(ctx context.Context) (map[string]Summary, error) {
	if f == nil {
		return nil, nil
	}
	all, err := f.buf.All(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make(map[string]Summary, len(all))
	for tunnel, st := range all {
		out[tunnel] = summarize(st, now)
	}
	return out, nil
}

// Listing is the answer of GET /api/tunnels/{name}/buffer.
type Listing struct {
	Tunnel string `json:"tunnel"`
	// Requests are the stored requests, by ID (the order of arrival):
	// what a listing shows of each, never its headers, query or body.
	Requests []buffer.Entry `json:"requests"`
}

// apiTimeout bounds the store's work for one admin request.
const apiTimeout = 10 * time.Second

// Register mounts the buffer's admin endpoints on mux, each handler
// wrapped by wrap (the server's admin-token check):
//
//	GET    /api/tunnels/{name}/buffer            200 Listing
//	DELETE /api/tunnels/{name}/buffer            200 {"tunnel", "dropped": N}
//	DELETE /api/tunnels/{name}/buffer/{id}       200 {"tunnel", "dropped": 1}; 404 if none
//	POST   /api/tunnels/{name}/buffer/{id}/retry 200 {"tunnel", "requeued": id}; 404 unless rejected
//
// A name that is no tunnel name is 400; a store that fails, 503. Errors
// are one line of text.
func (f *Forwarder) Register(mux *http.ServeMux, wrap func(http.Handler) http.Handler) {
	mux.Handle("GET /api/tunnels/{name}/buffer", wrap(f.apiHandler(f.listBuffer)))
	mux.Handle("DELETE /api/tunnels/{name}/buffer", wrap(f.apiHandler(f.dropBuffer)))
	mux.Handle("DELETE /api/tunnels/{name}/buffer/{id}", wrap(f.apiHandler(f.dropRequest)))
	mux.Handle("POST /api/tunnels/{name}/buffer/{id}/retry", wrap(f.apiHandler(f.retryRequest)))
}

// apiError is an admin request's failure: its status and sentence.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

// apiHandler serves one endpoint: fn answers for a valid tunnel name with
// a value to send as JSON, or an error.
func (f *Forwarder) apiHandler(fn func(ctx context.Context, tunnel string, r *http.Request) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tunnel := r.PathValue("name")
		if !tunnelName(tunnel) {
			writeText(w, http.StatusBadRequest, fmt.Sprintf(
				"%q is not a tunnel name; want 1 to 63 characters a-z, 0-9 and '-', as in the tunnel's host name", tunnel))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), apiTimeout)
		defer cancel()
		v, err := fn(ctx, tunnel, r)
		var ae *apiError
		switch {
		case errors.As(err, &ae):
			writeText(w, ae.status, ae.msg)
		case err != nil:
			f.log.Warn("buffer admin request failed", zap.String("tunnel", tunnel), zap.String("method", r.Method), zap.Error(err))
			writeText(w, http.StatusServiceUnavailable, "the buffer's store failed: "+err.Error()+"; retry, and check the server's log")
		default:
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(v)
		}
	})
}

func (f *Forwarder) listBuffer(ctx context.Context, tunnel string, _ *http.Request) (any, error) {
	list, err := f.buf.List(ctx, tunnel)
	if err != nil {
		return nil, err
	}
	if list == nil {
		list = []buffer.Entry{}
	}
	return Listing{Tunnel: tunnel, Requests: list}, nil
}

// dropped is the answer of a DELETE.
type dropped struct {
	Tunnel  string `json:"tunnel"`
	Dropped int    `json:"dropped"`
}

func (f *Forwarder) dropBuffer(ctx context.Context, tunnel string, _ *http.Request) (any, error) {
	n, err := f.buf.DropAll(ctx, tunnel)
	if err != nil {
		return nil, err
	}
	f.log.Info("buffered requests dropped through the admin API", zap.String("tunnel", tunnel), zap.Int("requests", n))
	return dropped{Tunnel: tunnel, Dropped: n}, nil
}

func (f *Forwarder) dropRequest(ctx context.Context, tunnel string, r *http.Request) (any, error) {
	id := r.PathValue("id")
	if err := f.buf.Drop(ctx, tunnel, id); err != nil {
		return nil, notFound(err, tunnel, id, "")
	}
	f.log.Info("buffered request dropped through the admin API", zap.String("tunnel", tunnel), zap.String("id", id))
	return dropped{Tunnel: tunnel, Dropped: 1}, nil
}

// requeued is the answer of a retry.
type requeued struct {
	Tunnel   string `json:"tunnel"`
	Requeued string `json:"requeued"`
}

func (f *Forwarder) retryRequest(ctx context.Context, tunnel string, r *http.Request) (any, error) {
	id := r.PathValue("id")
	if err := f.buf.Requeue(ctx, tunnel, id); err != nil {
		return nil, notFound(err, tunnel, id, "rejected ")
	}
	f.log.Info("buffered request requeued through the admin API", zap.String("tunnel", tunnel), zap.String("id", id))
	if f.sender.Serves(tunnel) {
		f.Kick(tunnel)
	}
	return requeued{Tunnel: tunnel, Requeued: id}, nil
}

// notFound turns buffer.ErrNotFound into a 404 that names the request.
func notFound(err error, tunnel, id, state string) error {
	if errors.Is(err, buffer.ErrNotFound) {
		return &apiError{http.StatusNotFound, fmt.Sprintf(
			"tunnel %s has no %sbuffered request %q; GET /api/tunnels/%s/buffer lists them", tunnel, state, id, tunnel)}
	}
	return err
}

// tunnelName reports whether s can be a tunnel's name: a DNS label, as the
// server accepts at login. (The auth package has the full check; it links
// in the tunnel engine, which this package stays clear of.)
func tunnelName(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg+"\n") //nolint:gosec // text/plain with nosniff: never rendered as HTML
}
