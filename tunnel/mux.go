package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// MuxConfig is the yamux configuration of both ends of a tunnel session.
// yamux's own keepalive is off: the client runs KeepAlive, the server its
// heartbeat sweep. A frame that cannot be written within two thirds of
// heartbeat fails its write.
func MuxConfig(heartbeat time.Duration, log *zap.Logger) *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.ConnectionWriteTimeout = heartbeat * 2 / 3
	// frp's value: one stream may fill a long fat pipe.
	c.MaxStreamWindowSize = 6 << 20
	c.LogOutput = nil
	c.Logger, _ = zap.NewStdLogAt(log.Named("yamux"), zapcore.DebugLevel)
	return c
}

// KeepAlive pings the other end of mux every two thirds of heartbeat, and
// closes mux when an answer takes longer than the last third, until mux
// closes. It returns ErrHeartbeatLost when it closed mux. A dead path is
// thus noticed within heartbeat, as with yamux's keepalive (a ping every
// third, answered within two thirds), with half its pings: each ping wakes
// both ends, and at thousands of idle sessions the pings are all a server
// does.
func KeepAlive(mux *yamux.Session, heartbeat time.Duration) error {
	bound := heartbeat / 3
	t := time.NewTicker(heartbeat - bound)
	defer t.Stop()
	for {
		select {
		case <-mux.CloseChan():
			return nil
		case <-t.C:
		}
		if err := PingWithin(mux, bound); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				_ = mux.Close()
				return fmt.Errorf("%w within %v", ErrHeartbeatLost, bound)
			}
			return nil // the session closed while the ping was out
		}
	}
}

// ErrHeartbeatLost is KeepAlive's reason for closing a session.
var ErrHeartbeatLost = errors.New("no answer to a heartbeat ping")

// PingWithin pings the other end of mux and waits at most d for the answer.
// yamux's own Ping waits for the connection write timeout; a ping that
// outlives d ends with the session or that timeout.
func PingWithin(mux *yamux.Session, d time.Duration) error {
	done := make(chan error, 1)
	go func() {
		_, err := mux.Ping()
		done <- err
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return os.ErrDeadlineExceeded
	}
}

// ConnListener is a net.Listener fed by Push: it hands connections that
// arrived elsewhere (streams of a tunnel session) to a server that wants a
// listener (frp's HandleListener, an http.Server).
type ConnListener struct {
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
	addr   net.Addr
}

// NewConnListener returns an open listener that reports addr as its address.
func NewConnListener(addr net.Addr) *ConnListener {
	return &ConnListener{ch: make(chan net.Conn), closed: make(chan struct{}), addr: addr}
}

// Push hands conn to the next Accept. It blocks until then and returns false
// if the listener is closed first; the caller then still owns conn.
func (l *ConnListener) Push(conn net.Conn) bool {
	select {
	case l.ch <- conn:
		return true
	case <-l.closed:
		return false
	}
}

// Accept returns the next pushed connection, or net.ErrClosed.
func (l *ConnListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and Push. It is idempotent.
func (l *ConnListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr returns the address given to NewConnListener.
func (l *ConnListener) Addr() net.Addr { return l.addr }

// yamux frame header layout: version(1) type(1) flags(2) stream(4) length(4).
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
)

// CoalesceFrames wraps the connection under a yamux session so that each
// data frame, header and body, leaves in one write of the network
// connection. g is the Gatherer under conn's TLS; nil gathers on conn
// itself (a connection without TLS beneath, as in tests).
//
// yamux writes a frame's header and its body separately, and TLS writes
// each record (at most 16 KiB of data) with a system call of its own: a
// frame would cost one TCP write for its header and one per 16 KiB of body,
// and each TCP write may wake the peer's reader. Per request and per byte,
// these system calls and wake-ups cost the tunnel more than encryption.
//
// Only yamux's send loop writes to the returned conn, one goroutine: the
// gathering a header starts ends with the next write, its body.
func CoalesceFrames(conn net.Conn, g *Gatherer) net.Conn {
	if g == nil {
		g = NewGatherer(conn)
		conn = g
	}
	return &coalescingConn{Conn: conn, g: g}
}

type coalescingConn struct {
	net.Conn
	g    *Gatherer
	body bool // a header announcing a body was gathered: the body is next
}

func (c *coalescingConn) Write(p []byte) (int, error) {
	if c.body {
		c.body = false
		n, err := c.Conn.Write(p)
		if ferr := c.g.stop(); err == nil {
			err = ferr
		}
		return n, err
	}
	if len(p) != yamuxHeaderSize || p[1] != yamuxTypeData || binary.BigEndian.Uint32(p[8:12]) == 0 {
		return c.Conn.Write(p)
	}
	c.g.start()
	n, err := c.Conn.Write(p)
	if err != nil {
		_ = c.g.stop()
		return n, err
	}
	c.body = true
	return n, nil
}

const (
	// gatherLimit bounds what a Gatherer holds: a frame of MaxBulkWrite
	// bytes leaves in one write, with room for what TLS (22 bytes a
	// record) and a websocket add; a larger one in writes of about this
	// size.
	gatherLimit = MaxBulkWrite + MaxBulkWrite/64
	// gatherSmall is what a gather buffer grows to by appending; past it,
	// a bulk frame is under way and it grows to gatherLimit at once.
	gatherSmall = 64 << 10
)

// gatherBuffers holds the Gatherers' buffers between frames, so that an
// idle session holds none.
var gatherBuffers = sync.Pool{New: func() any { return new([]byte) }}

// A Gatherer is the connection under a session's TLS: between start and
// stop it gathers what TLS writes (a frame's records) into one write of the
// connection beneath, and otherwise writes straight through. Writes keep
// their order whoever makes them: TLS's own (an alert, a key update) that
// come while gathering are gathered too.
type Gatherer struct {
	net.Conn
	mu  sync.Mutex
	buf *[]byte // from gatherBuffers between start and stop
}

// NewGatherer returns conn with gathering stopped.
func NewGatherer(conn net.Conn) *Gatherer { return &Gatherer{Conn: conn} }

// start gathers the writes that follow, until stop.
func (g *Gatherer) start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.buf = gatherBuffers.Get().(*[]byte)
}

// stop writes out what was gathered and lets later writes through.
func (g *Gatherer) stop() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.flush()
	gatherBuffers.Put(g.buf)
	g.buf = nil
	return err
}

func (g *Gatherer) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.buf == nil {
		return g.Conn.Write(p)
	}
	if len(*g.buf)+len(p) > gatherLimit {
		if err := g.flush(); err != nil {
			return 0, err
		}
		if len(p) > gatherLimit {
			return g.Conn.Write(p)
		}
	}
	if n := len(*g.buf) + len(p); n > cap(*g.buf) && n > gatherSmall {
		*g.buf = slices.Grow(*g.buf, gatherLimit-len(*g.buf))
	}
	*g.buf = append(*g.buf, p...)
	return len(p), nil
}

// flush writes out what was gathered. g.mu is held.
func (g *Gatherer) flush() error {
	b := *g.buf
	*g.buf = b[:0]
	if len(b) == 0 {
		return nil
	}
	_, err := g.Conn.Write(b)
	return err
}
