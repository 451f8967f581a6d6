package server

import (
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/gate"
)

// A connection that sends nothing is closed after its first byte's timeout, not
// the handshake's longer timeout, and counted.
func TestFirstByteDeadline(t *testing.T) {
	s := startServer(t)
	c := testutil.DialFrom(t, s.tunnel, "127.0.0.1")
	start := time.Now()
	if err := testutil.ClosedByServer(c, gate.HandshakeTimeout+5*time.Second); err != nil {
		t.Fatalf("a connection that sends nothing: %v; want it closed", err)
	}
	took := time.Since(start)
	waitCount(t, "connections closed for want of a first byte", func() int { return int(s.limited(gate.LimitFirstByte)) }, 1)
	t.Logf("closed %v after connecting", took.Round(time.Millisecond))
}
