package gate

import (
	"errors"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// A quiet response waits in its tunnel stream rather than in a buffer:
// WaitReady returns only once the stream has bytes, has ended or has
// failed, and leaves the bytes for the Read that follows.
func TestTunnelConnWaitsWithoutReading(t *testing.T) {
	conn, farStream := pipeTunnelConn(t)
	stream := conn.stream

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

// pipeTunnelConn is a stream the server opened on a session over a
// net.Pipe, as the router's dial returns it, and the client's end of it.
func pipeTunnelConn(t *testing.T) (*tunnelConn, *yamux.Stream) {
	t.Helper()
	sess, far := pipeSession(t)
	stream, err := sess.mux.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	farStream, err := far.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
	return &tunnelConn{Conn: stream, stream: stream, sess: sess}, farStream
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

// A stream that received a large response gives back its receive buffer
// when the router shrinks it as it goes idle. yamux grows the buffer to the
// most that waited unread and would keep it for the stream's life.
func TestTunnelConnShrinksALargeReceiveBuffer(t *testing.T) {
	conn, farStream := pipeTunnelConn(t)
	// Within yamux's initial window, the client sends it all before the
	// server reads any: the receive buffer grows to hold it.
	const size = 192 << 10
	if _, err := farStream.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	// The server answers a ping after taking in the frames before it.
	if _, err := farStream.Session().Ping(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatal(err)
	}
	held := serverMemory()
	conn.Shrink()
	if freed := int64(held) - int64(serverMemory()); freed < size/2 { //nolint:gosec // memory sizes fit
		t.Errorf("Shrink after a %d KiB response freed %d KiB, want the stream's receive buffer (at least %d KiB)", size>>10, freed>>10, size>>11)
	}
	runtime.KeepAlive(buf)
}

// Closing a dialed stream resets it: the server forgets it at once and
// lets go of what it had buffered, and the client's end fails, so that the
// client drops its upstream connection. A FIN would leave the stream taking
// whatever the upstream still sends, up to its 6 MiB window, until the
// client closed its end, which it does only once the upstream does.
func TestTunnelConnResets(t *testing.T) {
	conn, farStream := pipeTunnelConn(t)
	// The upstream sends more than the router reads; it waits in the stream.
	const size = 1 << 20
	if _, err := farStream.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	if _, err := farStream.Session().Ping(); err != nil { // the server took the frames in
		t.Fatal(err)
	}
	held := serverMemory()
	sess := conn.sess
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(); err != nil {
		t.Errorf("a second close: %v", err)
	}
	conn = nil // as the router drops it
	if n := sess.mux.NumStreams(); n != 0 {
		t.Errorf("the session has %d streams after the close, want 0: the stream is forgotten at once", n)
	}
	if freed := int64(held) - int64(serverMemory()); freed < size/2 { //nolint:gosec // memory sizes fit
		t.Errorf("the close freed %d KiB, want what the stream held unread (%d KiB)", freed>>10, size>>10)
	}
	_ = farStream.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := farStream.Read(make([]byte, 1)); !errors.Is(err, yamux.ErrConnectionReset) {
		t.Errorf("the client's end reads %v after the close, want %v", err, yamux.ErrConnectionReset)
	}
}
