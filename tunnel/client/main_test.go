package client

import (
	"testing"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
)

// Every goroutine the client starts has an owner that stops it: a test
// that leaves one behind fails.
func TestMain(m *testing.M) {
	// frp logs through a process-wide logger to stdout; the tests read
	// tether's own logs instead.
	tunnel.BridgeFRPLog(zap.NewNop())
	goleak.VerifyTestMain(m,
		// kcp-go, which frp imports for a transport tether never uses,
		// starts its package-level scheduler (SystemTimedSched) when the
		// program starts; it runs for the life of the process.
		goleak.IgnoreTopFunction("github.com/xtaci/kcp-go/v5.(*TimedSched).sched"),
		goleak.IgnoreTopFunction("github.com/xtaci/kcp-go/v5.(*TimedSched).prepend"),
		// The rest belong to the frp server inside the tether server that
		// TestClientServesThroughServer connects to, not to the client: frp
		// v0.71.0 starts its in-memory metrics at init, and its
		// server.NewService starts port-manager workers and serves its HTTP
		// vhost on a golib mux listener that Service.Close stops neither.
		goleak.IgnoreTopFunction("github.com/fatedier/frp/pkg/metrics/mem.(*serverMetrics).runUntil"),
		goleak.IgnoreTopFunction("github.com/fatedier/frp/server/ports.(*Manager).cleanReservedPortsWorkerUntil"),
		goleak.IgnoreAnyFunction("github.com/fatedier/frp/server.NewService.func3"),
	)
}
