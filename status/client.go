package status

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/tether-dev/tether/tunnel/client"
)

// Health reads a tether client's /status on its health address.
type Health struct {
	addr string // HOST:PORT to dial

	// Timeout bounds one request (DefaultTimeout when 0).
	Timeout time.Duration
	// HTTP is the client requests go through (http.DefaultClient when nil).
	HTTP *http.Client
}

// NewHealth checks the --health-addr value. A wildcard host (0.0.0.0, [::]
// or none), which is how the client listens in a pod, is dialled on
// loopback.
func NewHealth(addr string) (*Health, error) {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return nil, fmt.Errorf("--health-addr %q: want the client's HOST:PORT, e.g. 127.0.0.1:8081 (its --health-addr)", addr)
	}
	return &Health{addr: client.LocalHealthAddr(addr)}, nil
}

// Snapshot returns the client's state.
func (h *Health) Snapshot(ctx context.Context) (client.Snapshot, error) {
	e := endpoint{
		url: "http://" + h.addr + "/status", shown: h.addr, what: "tether client health endpoint", kind: "tether client health address",
		flag: "--health-addr", origin: "the client's --health-addr",
		timeout: h.Timeout, client: h.HTTP,
	}
	var snap client.Snapshot
	if err := e.getJSON(ctx, &snap); err != nil {
		return client.Snapshot{}, err
	}
	if snap.Server == "" {
		return client.Snapshot{}, e.notOurs(http.MethodGet, "JSON without the client's server")
	}
	return snap, nil
}
