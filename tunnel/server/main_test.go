package server

import (
	"os"
	"testing"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
)

// frpcDir holds the stock frpc that tests without the race detector build
// (entry_frpc_test.go); removed when the tests end.
var frpcDir string

func TestMain(m *testing.M) {
	// frp logs through a process-wide logger to stdout; tests read tether's
	// own logs instead.
	tunnel.BridgeFRPLog(zap.NewNop())
	code := m.Run()
	if frpcDir != "" {
		_ = os.RemoveAll(frpcDir)
	}
	os.Exit(code)
}
