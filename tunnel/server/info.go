package server

import (
	"net"
	"sync/atomic"
	"time"
)

// countRequest records one request routed to the session by its status
// code (0 = failed before a response).
func (s *Session) countRequest(status int) { s.requests[statusClass(status)].Add(1) }

// statusClass maps 1xx..5xx to 1..5 and anything else to 0.
func statusClass(status int) int {
	if status >= 100 && status < 600 {
		return status / 100
	}
	return 0
}

// Info is a snapshot of a session for the admin API (/api/tunnels), one per
// session: a tunnel may have several on this replica.
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
}

// Info returns the session's state. BytesIn counts what the client sent.
func (s *Session) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := Info{
		ClientAddress:  s.remoteAddr,
		ConnectedSince: s.connectedAt.UTC(),
		ClientVersion:  s.clientVersion,
		BytesIn:        s.conn.read.Load(),
		BytesOut:       s.conn.written.Load(),
		Transport:      s.transport,
		Route:          s.route,
		Session:        s.id,
		RunID:          s.runID,
		Retired:        s.retired.Load(),
	}
	if s.claims != nil {
		info.Name = s.claims.Tunnel
		info.Account = s.claims.Account
		info.Runtime = s.claims.Runtime
		info.TokenExpires = s.claims.ExpiresAt.UTC()
	}
	for i := range s.requests {
		info.Requests += s.requests[i].Load()
	}
	return info
}

// countingConn counts the bytes of a session's connection, for the admin
// API and metrics, and keeps the time since which what the server wrote has
// gone unanswered, for the session's silence watch. A few atomic operations
// per read or write cost nothing measurable beside TLS.
type countingConn struct {
	net.Conn
	read, written atomic.Uint64
	// unanswered is when (Unix nanoseconds) the oldest write not followed by
	// a read was made; 0 when the client spoke since the last write.
	unanswered atomic.Int64
	// armed, once set (watch), is called when a write starts to wait.
	armed atomic.Pointer[func()]
}

// watch calls armed each time a write starts to wait for an answer.
func (c *countingConn) watch(armed func()) { c.armed.Store(&armed) }

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(uint64(n)) //nolint:gosec // n >= 0
	if n > 0 && c.unanswered.Load() != 0 {
		c.unanswered.Store(0)
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(uint64(n)) //nolint:gosec // n >= 0
	if f := c.armed.Load(); f != nil && c.unanswered.Load() == 0 &&
		c.unanswered.CompareAndSwap(0, time.Now().UnixNano()) {
		(*f)()
	}
	return n, err
}
