package server

import (
	"time"

	"github.com/tether-dev/tether/tunnel/server/webhook"
)

// statusClass maps 1xx..5xx to 1..5 and anything else to 0.
func statusClass(status int) int {
	if status >= 100 && status < 600 {
		return status / 100
	}
	return 0
}

// Info is a snapshot of a session for the admin API (/api/tunnels), one per
// session: a tunnel may have several on this replica. A tunnel with
// buffered requests but no session here has one with its Name and Buffer
// only.
type Info struct {
	Name           string    `json:"name"`
	Account        string    `json:"account"`
	Runtime        string    `json:"runtime"`
	ClientAddress  string    `json:"client_address"`
	ConnectedSince time.Time `json:"connected_since"`
	ClientVersion  string    `json:"client_version"`
	BytesIn        uint64    `json:"bytes_in"`
	BytesOut       uint64    `json:"bytes_out"`
	Transport      string    `json:"transport"`
	Route          string    `json:"route"`
	TokenExpires   time.Time `json:"token_expires"`
	// Requests counts the requests routed to this session.
	Requests uint64 `json:"requests"`
	// Session is the session's ID, Replica the server replica holding it.
	Session string `json:"session"`
	Replica string `json:"replica"`
	// RunID is the session's frp run ID: a client that reconnects with it
	// replaces this session.
	RunID string `json:"run_id"`
	// Retired is true while a draining replica lets the session's last
	// requests finish before closing it.
	Retired bool `json:"retired,omitempty"`
	// Buffer is the tunnel's buffered requests (webhooks stored while it
	// was down), absent when it has none. A tunnel with some but no
	// session here is listed with its name and Buffer only.
	Buffer *webhook.Summary `json:"buffer,omitempty"`
}
