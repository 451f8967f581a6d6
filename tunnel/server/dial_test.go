package server

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
)

// A quiet response waits in its tunnel stream rather than in a buffer:
// WaitReady returns only once the stream has bytes, has ended or has
// failed, and leaves the bytes for the Read that follows.
func TestTunnelConnWaitsWithoutReading(t *testing.T) {
	serverEnd, clientEnd := net.Pipe()
	conf := tunnel.MuxConfig(15*time.Second, zap.NewNop())
	mux, err := yamux.Client(serverEnd, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer mux.Close()
	far, err := yamux.Server(clientEnd, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer far.Close()
	stream, err := mux.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	farStream, err := far.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
	conn := &tunnelConn{Conn: stream, stream: stream}

	// Nothing to read: it waits, here until the stream's read deadline.
	const wait = 100 * time.Millisecond
	if err := stream.SetReadDeadline(time.Now().Add(wait)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	conn.WaitReady()
	if waited := time.Since(start); waited < wait {
		t.Fatalf("WaitReady returned after %v with nothing to read, want it to wait for the read deadline (%v)", waited, wait)
	}
	if err := stream.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}

	// Bytes arrive: it returns, and the bytes are all still there.
	ready := make(chan struct{})
	go func() { conn.WaitReady(); close(ready) }()
	if _, err := farStream.Write([]byte("data: 1\n\n")); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, ready, "WaitReady with bytes to read")
	buf := make([]byte, 64)
	if n, err := conn.Read(buf); err != nil || string(buf[:n]) != "data: 1\n\n" {
		t.Fatalf("Read after WaitReady = %q, %v; want the event WaitReady waited for", buf[:n], err)
	}

	// The far end closes: it returns, and the Read says so.
	ready = make(chan struct{})
	go func() { conn.WaitReady(); close(ready) }()
	if err := farStream.Close(); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, ready, "WaitReady on a stream the far end closed")
	if n, err := stream.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("Read after the far end closed = %d, %v; want io.EOF", n, err)
	}
}

// waitClosed fails the test unless ch closes within 10s.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting after 10s", what)
	}
}
