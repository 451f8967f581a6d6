package server

import (
	"os"
	"testing"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
)

// frpcDir holds the stock frpc that tests without the race detector build
// (entry_frpc_test.go); removed when the tests end.
var frpcDir string

func TestMain(m *testing.M) {
	if plan := os.Getenv(floodEnv); plan != "" {
		os.Exit(runFloodChild(plan)) // this process is a hostile client; see flood_test.go
	}
	// frp logs through a process-wide logger to stdout; tests read tether's
	// own logs instead.
	tunnel.BridgeFRPLog(zap.NewNop())
	goleak.VerifyTestMain(m,
		goleak.Cleanup(func(code int) {
			if frpcDir != "" {
				_ = os.RemoveAll(frpcDir)
			}
			if tetherBuild.dir != "" {
				_ = os.RemoveAll(tetherBuild.dir)
			}
			os.Exit(code)
		}),
		// kcp-go (linked in by frp) starts its process-wide timer
		// scheduler, SystemTimedSched, when its package is initialised.
		goleak.IgnoreTopFunction("github.com/xtaci/kcp-go/v5.(*TimedSched).sched"),
		goleak.IgnoreTopFunction("github.com/xtaci/kcp-go/v5.(*TimedSched).prepend"),
		// frp's in-memory server statistics start their process-wide
		// ticker in an init function (pkg/metrics/mem/server.go).
		goleak.IgnoreTopFunction("github.com/fatedier/frp/pkg/metrics/mem.(*serverMetrics).runUntil"),
		// frp v0.71.0's server.NewService starts these and Service.Close
		// does not stop them: the port managers' cleaners run on a ticker
		// with no stop channel (server/ports/ports.go:78), and the HTTP
		// vhost server waits on a listener of frp's muxer that closing the
		// muxer does not close (server/service.go:322). One set stays per
		// frp service a test started.
		goleak.IgnoreTopFunction("github.com/fatedier/frp/server/ports.(*Manager).cleanReservedPortsWorkerUntil"),
		goleak.IgnoreAnyFunction("github.com/fatedier/frp/server.NewService.func3"),
	)
}
