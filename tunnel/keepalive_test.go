package tunnel

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
)

// countingReads counts the bytes read through the connection.
type countingReads struct {
	net.Conn
	n atomic.Int64
}

func (c *countingReads) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// A live peer keeps the session open, and is pinged every two thirds of
// the heartbeat: an idle session sends nothing but pings (12 bytes each),
// half as many as yamux's keepalive would (every third).
func TestKeepAlivePingsALivePeer(t *testing.T) {
	t.Parallel()
	const heartbeat = 3 * time.Second // the least a client takes: a ping every 2s, answered within 1s
	a, b := net.Pipe()
	counted := &countingReads{Conn: b}
	server, err := yamux.Server(counted, MuxConfig(heartbeat, zap.NewNop()))
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	client, err := yamux.Client(a, MuxConfig(heartbeat, zap.NewNop()))
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	go func() { lost <- KeepAlive(client, heartbeat) }()

	window := time.NewTimer(7 * time.Second)
	select {
	case err := <-lost:
		t.Fatalf("KeepAlive ended a session with a live peer: %v", err)
	case <-window.C:
	}
	if client.IsClosed() {
		t.Fatal("the session with a live peer was closed")
	}
	pings := counted.n.Load() / yamuxHeaderSize
	t.Logf("%d pings in 7s with a %v heartbeat", pings, heartbeat)
	if pings < 1 || pings > 3 {
		t.Errorf("the peer got %d pings in 7s; want one every 2s (at most 3; yamux's keepalive sent 7)", pings)
	}
	_ = client.Close()
	if err := <-lost; err != nil {
		t.Errorf("KeepAlive after the session closed: %v; want nil", err)
	}
}

// A peer that stops answering is noticed within the heartbeat: KeepAlive
// closes the session and says why.
func TestKeepAliveClosesAFrozenSession(t *testing.T) {
	t.Parallel()
	const heartbeat = 900 * time.Millisecond
	a, b := net.Pipe()
	defer b.Close() // nothing reads b: the path froze
	client, err := yamux.Client(a, MuxConfig(heartbeat, zap.NewNop()))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = KeepAlive(client, heartbeat)
	took := time.Since(start)
	if !errors.Is(err, ErrHeartbeatLost) {
		t.Fatalf("KeepAlive = %v; want ErrHeartbeatLost", err)
	}
	if !client.IsClosed() {
		t.Error("KeepAlive did not close the frozen session")
	}
	if took < heartbeat*2/3 || took > heartbeat+time.Second {
		t.Errorf("the frozen session was noticed after %v; want after the first ping (%v) and within the heartbeat %v (+1s)", took, heartbeat*2/3, heartbeat)
	}
}
