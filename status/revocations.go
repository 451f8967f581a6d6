package status

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tether-dev/tether/internal/human"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// RevokeRequest is the body of POST /api/revocations: exactly one of Tunnel
// and JTI; Until (zero: for good) and Reason are optional.
type RevokeRequest struct {
	Tunnel string    `json:"tunnel,omitempty"`
	JTI    string    `json:"jti,omitempty"`
	Until  time.Time `json:"until,omitzero"`
	Reason string    `json:"reason,omitempty"`
}

// Disconnected is the answer of POST /api/tunnels/{name}/disconnect: how
// many sessions of the tunnel were closed, on which replicas.
type Disconnected struct {
	Tunnel         string   `json:"tunnel"`
	SessionsClosed int      `json:"sessions_closed"`
	Replicas       []string `json:"replicas"`
	// Unreached are replicas the registry says serve the tunnel that could
	// not be asked to close their sessions.
	Unreached []string `json:"unreached,omitempty"`
}

// Revoke asks the server to revoke a tunnel or a token (POST
// /api/revocations) and returns the revocation it stored.
func (a *Admin) Revoke(ctx context.Context, req RevokeRequest) (registry.Revocation, error) {
	e := a.endpoint("/api/revocations")
	var rev registry.Revocation
	err := e.call(ctx, http.MethodPost, req, http.StatusCreated, &rev)
	if r, ok := errors.AsType[*RefusedError](err); ok {
		if r.Status == http.StatusBadRequest {
			return registry.Revocation{}, fmt.Errorf("the server refused the revocation: %s", r.Text)
		}
		return registry.Revocation{}, a.noAPI(r, "revocation")
	}
	if err != nil {
		return registry.Revocation{}, err
	}
	if rev.ID == "" {
		return registry.Revocation{}, e.notOurs(http.MethodPost, "JSON without the revocation's id")
	}
	return rev, nil
}

// Revocations returns the revocations in force, the oldest first (GET
// /api/revocations).
func (a *Admin) Revocations(ctx context.Context) ([]registry.Revocation, error) {
	var list []registry.Revocation
	err := a.endpoint("/api/revocations").call(ctx, http.MethodGet, nil, http.StatusOK, &list)
	if r, ok := errors.AsType[*RefusedError](err); ok {
		return nil, a.noAPI(r, "revocation")
	}
	return list, err
}

// Unrevoke deletes revocation id (DELETE /api/revocations/{id}) and
// returns it.
func (a *Admin) Unrevoke(ctx context.Context, id string) (registry.Revocation, error) {
	var rev registry.Revocation
	err := a.endpoint("/api/revocations/"+url.PathEscape(id)).call(ctx, http.MethodDelete, nil, http.StatusOK, &rev)
	if r, ok := errors.AsType[*RefusedError](err); ok {
		if r.Status == http.StatusNotFound {
			return registry.Revocation{}, fmt.Errorf("no revocation %q at %s (it says: %s): list them with `tether token revocations --admin %s`",
				printable(id), a.shown(), r.Text, a.shown())
		}
		return registry.Revocation{}, a.noAPI(r, "revocation")
	}
	return rev, err
}

// Disconnect closes the sessions of tunnel on every replica (POST
// /api/tunnels/{name}/disconnect); its clients may log in again.
func (a *Admin) Disconnect(ctx context.Context, tunnel string) (Disconnected, error) {
	var d Disconnected
	err := a.endpoint("/api/tunnels/"+url.PathEscape(tunnel)+"/disconnect").call(ctx, http.MethodPost, nil, http.StatusOK, &d)
	if r, ok := errors.AsType[*RefusedError](err); ok {
		return Disconnected{}, a.noAPI(r, "disconnect")
	}
	return d, err
}

// noAPI explains a refusal of the revocation or disconnect API: a server
// from before it answers 404 or 405.
func (a *Admin) noAPI(r *RefusedError, api string) error {
	if r.Status == http.StatusNotFound || r.Status == http.StatusMethodNotAllowed {
		return fmt.Errorf("the server at %s has no %s API (%w): it runs a tether older than this command; upgrade it", a.shown(), api, r)
	}
	return fmt.Errorf("the server refused: %w", r)
}

// shown is the admin address as messages show it.
func (a *Admin) shown() string { return strings.TrimSuffix(a.url.String(), "/") }

// Revoked prints the revocation the server stored: its ID, what it
// covers, until when, and its reason.
func (p Printer) Revoked(rev registry.Revocation) error {
	if p.Format == JSON {
		return writeJSON(p.Out, rev)
	}
	_, err := fmt.Fprintf(p.Out, "revocation %s: %s\nthe sessions it covers close on every replica, and their logins are refused; `tether token unrevoke %s` takes it back\n",
		field(rev.ID), p.describe(rev), field(rev.ID))
	return err
}

// Unrevoked prints the revocation the server deleted.
func (p Printer) Unrevoked(rev registry.Revocation) error {
	if p.Format == JSON {
		return writeJSON(p.Out, rev)
	}
	_, err := fmt.Fprintf(p.Out, "deleted revocation %s (%s): its logins are accepted again\n", field(rev.ID), p.describe(rev))
	return err
}

// describe says what a revocation covers, until when, and why.
func (p Printer) describe(rev registry.Revocation) string {
	until := "for good"
	if !rev.Until.IsZero() {
		until = "until " + when(rev.Until, p.Now())
	}
	s := covers(rev) + ", " + until
	if rev.Reason != "" {
		s += `, reason "` + printable(rev.Reason) + `"`
	}
	return s
}

// covers says what a revocation takes back.
func covers(rev registry.Revocation) string {
	if rev.JTI != "" {
		return "token " + printable(rev.JTI) + " and every renewal of it"
	}
	return "every token of tunnel " + field(rev.Tunnel)
}

// when is "2025-03-02T12:00:00Z (in 24h)".
func when(t, now time.Time) string {
	rel := "in " + human.Age(t.Sub(now).Round(time.Second))
	if !t.After(now) {
		rel = human.Age(now.Sub(t)) + " ago"
	}
	return fmt.Sprintf("%s (%s)", t.UTC().Format(time.RFC3339), rel)
}

// Revocations prints the revocations in force, the oldest first; an empty
// list prints "No revocations." (in JSON, []).
func (p Printer) Revocations(list []registry.Revocation) error {
	if p.Format == JSON {
		if list == nil {
			list = []registry.Revocation{}
		}
		return writeJSON(p.Out, list)
	}
	if len(list) == 0 {
		_, err := fmt.Fprintln(p.Out, "No revocations.")
		return err
	}
	tw := newTabWriter(p.Out)
	fmt.Fprintln(tw, "ID\tTUNNEL/JTI\tUNTIL\tREASON\tCREATED")
	for _, rev := range list {
		subject := "tunnel " + field(rev.Tunnel)
		if rev.JTI != "" {
			subject = "jti " + printable(rev.JTI)
		}
		until := "never"
		if !rev.Until.IsZero() {
			until = rev.Until.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", field(rev.ID), subject, until, field(rev.Reason), rev.CreatedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// Disconnected prints what a disconnect closed.
func (p Printer) Disconnected(d Disconnected) error {
	if p.Format == JSON {
		if d.Replicas == nil {
			d.Replicas = []string{}
		}
		return writeJSON(p.Out, d)
	}
	if len(d.Unreached) > 0 {
		unreached := make([]string, len(d.Unreached))
		for i, r := range d.Unreached {
			unreached[i] = field(r)
		}
		if _, err := fmt.Fprintf(p.Out, "warning: replicas %s serve tunnel %s but could not be asked to close its sessions; run the command again, or revoke the tunnel\n",
			strings.Join(unreached, ", "), field(d.Tunnel)); err != nil {
			return err
		}
	}
	if d.SessionsClosed == 0 {
		_, err := fmt.Fprintf(p.Out, "tunnel %s had no session to close\n", field(d.Tunnel))
		return err
	}
	replicas := make([]string, len(d.Replicas))
	for i, r := range d.Replicas {
		replicas[i] = field(r)
	}
	sessions := "sessions"
	if d.SessionsClosed == 1 {
		sessions = "session"
	}
	_, err := fmt.Fprintf(p.Out, "closed %d %s of tunnel %s, on %s; its clients may log in again (tether token revoke --tunnel %s keeps them out)\n",
		d.SessionsClosed, sessions, field(d.Tunnel), field(strings.Join(replicas, ", ")), field(d.Tunnel))
	return err
}
