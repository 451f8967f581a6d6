package gate

import (
	"bufio"
	"net"
	"sync/atomic"
	"time"
)

// countingConn counts the bytes of a session's connection, for the admin
// API and metrics, and keeps the time since which what the server wrote has
// gone unanswered, for the session's silence watch. A few atomic operations
// per read or write cost nothing measurable beside TLS.
type countingConn struct {
	net.Conn
	read, written atomic.Uint64
	// unanswered is when (Unix nanoseconds) the oldest write not followed by
	// a read was made; 0 when the client spoke since the last write.
	unanswered atomic.Int64
	// armed, once set (watch), is called when a write starts to wait.
	armed atomic.Pointer[func()]
}

// watch calls armed each time a write starts to wait for an answer.
func (c *countingConn) watch(armed func()) { c.armed.Store(&armed) }

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(uint64(n)) //nolint:gosec // n >= 0
	if n > 0 && c.unanswered.Load() != 0 {
		c.unanswered.Store(0)
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(uint64(n)) //nolint:gosec // n >= 0
	if f := c.armed.Load(); f != nil && c.unanswered.Load() == 0 &&
		c.unanswered.CompareAndSwap(0, time.Now().UnixNano()) {
		(*f)()
	}
	return n, err
}

// closeFirst closes the TCP connection under a TLS (or wss) connection
// before the connection itself, so that closing never waits: TLS would
// first send close_notify, and wait up to 5s for a client that does not
// read, while yamux keeps the session half shut (its blocked stream
// readers spin meanwhile). Clients see the end of the connection either
// way. yamux closes it once, when the session ends: closed runs then.
type closeFirst struct {
	net.Conn
	raw    net.Conn
	closed func()
}

func (c *closeFirst) Close() error {
	err := c.raw.Close()
	_ = c.Conn.Close()
	c.closed()
	return err
}

// bufferedConn reads through the reader that peeked at the connection
// until what it peeked has been read, then from the connection: the reader
// goes, and with it a layer of every read for the connection's life.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	if c.r != nil {
		if c.r.Buffered() > 0 {
			return c.r.Read(p)
		}
		c.r = nil
	}
	return c.Conn.Read(p)
}
