package tunnel

import (
	"encoding/binary"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// MuxConfig is the yamux configuration of both ends of a tunnel session. A
// dead connection is noticed within heartbeat: a ping goes out every third
// of it and must be answered within the other two thirds.
func MuxConfig(heartbeat time.Duration, log *zap.Logger) *yamux.Config {
	c := yamux.DefaultConfig()
	c.KeepAliveInterval = heartbeat / 3
	c.ConnectionWriteTimeout = heartbeat * 2 / 3
	// frp's value: one stream may fill a long fat pipe.
	c.MaxStreamWindowSize = 6 << 20
	c.LogOutput = nil
	c.Logger, _ = zap.NewStdLogAt(log.Named("yamux"), zapcore.DebugLevel)
	return c
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
	// coalesceLimit is the largest body copied to join its header; a
	// larger body amortises the header's own write.
	coalesceLimit = 64 << 10
)

// CoalesceFrames wraps the connection under a yamux session so that a data
// frame's header and body leave in one write. yamux writes them separately,
// and over TLS each write is a record and a system call of its own: joining
// them halves the cost of every small frame (a request, a response).
//
// Only yamux's send loop writes to the returned conn, one goroutine, which
// is what makes holding a header until its body arrives safe. A header is
// held only when it announces a body.
func CoalesceFrames(conn net.Conn) net.Conn { return &coalescingConn{Conn: conn} }

type coalescingConn struct {
	net.Conn
	header [yamuxHeaderSize]byte
	held   bool
	buf    []byte
}

func (c *coalescingConn) Write(p []byte) (int, error) {
	if c.held {
		c.held = false
		if len(p) > coalesceLimit {
			if _, err := c.Conn.Write(c.header[:]); err != nil {
				return 0, err
			}
			return c.Conn.Write(p)
		}
		c.buf = append(append(c.buf[:0], c.header[:]...), p...)
		if _, err := c.Conn.Write(c.buf); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:12]) > 0 {
		copy(c.header[:], p)
		c.held = true
		return len(p), nil
	}
	return c.Conn.Write(p)
}
