package diagnose

import (
	"os"
	"testing"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
)

func TestMain(m *testing.M) {
	// frp logs through a process-wide logger to stdout; tests read tether's
	// own logs instead.
	tunnel.BridgeFRPLog(zap.NewNop())
	os.Exit(m.Run())
}
