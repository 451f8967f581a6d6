// Package status reads what tether reports about its tunnels and prints it
// for people: a server's sessions from its admin API (GET /api/tunnels, a
// row per session, as a tunnel may have several), every replica's tunnels as
// that server's registry sees them (GET /api/fleet), or one client's state
// and its sessions from its health address (GET /status), with the token it
// logs in with. Through the admin API it also revokes tunnels and tokens
// (POST, GET and DELETE /api/revocations) and disconnects a tunnel's
// sessions (POST /api/tunnels/{name}/disconnect), for tether token revoke,
// revocations and unrevoke and tether tunnel disconnect. It decodes into
// the types the server and the client encode, server.Info, server.Fleet,
// registry.Revocation and client.Snapshot, so each JSON shape has one
// definition.
//
// Everything it prints came over the network, and some of it from tunnel
// clients themselves (the version a client sends at login): control
// characters, escape sequences and other non-printable characters are shown
// escaped (\x1b, \n), in the tables and, as \uXXXX, in JSON, so that no value
// can rewrite the terminal or forge a line.
package status

import (
	"fmt"
	"time"
)

// Format is how a result is printed.
type Format string

// The output formats of `tether status --output`.
const (
	Table Format = ""     // columns for people
	Wide  Format = "wide" // the table with more columns
	JSON  Format = "json" // what the endpoint answered, and nothing else
)

// ParseFormat reads a --output value; "" and "table" mean Table.
func ParseFormat(s string) (Format, error) {
	switch s {
	case "", "table":
		return Table, nil
	case string(Wide), string(JSON):
		return Format(s), nil
	}
	return "", fmt.Errorf("--output %q: want json or wide (or nothing, for the table)", s)
}

// DefaultTimeout bounds one request when no timeout is given.
const DefaultTimeout = 10 * time.Second
