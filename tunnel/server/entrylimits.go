package server

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// The public entry's limits: what callers of --http-addr, who need no token,
// can make the server hold. A connection takes one of MaxHTTPConnections
// slots from accept until it closes (a websocket until it ends), or is
// closed at once; its request head is at most maxEntryHeaderBytes in
// maxEntryHeadLines lines and must arrive within the entry's
// ReadHeaderTimeout; an idle keep-alive
// connection closes after its IdleTimeout. TestEntryFloodMemory measures
// what a held connection costs and asserts entryConnMemory; README.md
// states it ("Limits of the public entry").
const (
	// defaultMaxHTTPConnections bounds the entry's connections: at
	// entryConnMemory each, 8,192 hold at most 768 MiB even when every one
	// is a slowloris filling its head's budget. An ingress in front keeps
	// a few hundred connections per worker; browsers and webhook senders
	// one or a few each.
	defaultMaxHTTPConnections = 8192
	// maxEntryHeaderBytes bounds a request's head (request line and
	// headers). Ingress controllers forward at most 32 KiB (nginx's
	// large_client_header_buffers 4 × 8k); Go's default would let each
	// caller make the server buffer 1 MiB. A longer head gets 431.
	maxEntryHeaderBytes = 32 << 10
	// maxPeerHeaderBytes bounds a forwarded request's head: the entry's,
	// plus the X-Forwarded-* headers and the peer miss mark it adds.
	maxPeerHeaderBytes = maxEntryHeaderBytes + 8<<10
	// maxEntryHeadLines bounds the lines of a request head (the request
	// line and the header fields): the most common proxies allow about 100
	// header fields (Envoy, HAProxy, Apache), browsers send 10 to 30.
	maxEntryHeadLines = 256
	// maxPeerHeadLines is the entry's, plus the headers the entry adds.
	maxPeerHeadLines = maxEntryHeadLines + 16
	// maxAdminHeaderBytes bounds an admin request's head: a bearer token
	// and a few headers.
	maxAdminHeaderBytes = 16 << 10
)

// entryConnMemory is the most memory (heap and stacks) one connection to
// the public entry makes the server hold while it sends a request head as
// slowly as the timeouts allow: Go's HTTP server's goroutine, its read and
// write buffers, and the head parsed so far (keys, values and map entries,
// about 2.5 times the head's bytes). TestEntryFloodMemory measures the
// costliest heads, about 80 KiB, and asserts this bound.
const entryConnMemory = 96 << 10

// tether_connections_refused_total reasons for connections beyond
// MaxHTTPConnections: on the public entry, and on the peer port (which
// other replicas' forwarding keeps within what their entries hold).
const (
	refusedHTTPConnections = "http_connections"
	refusedPeerConnections = "peer_connections"
)

// connSlots counts a listener's open connections against a cap, and knows
// which of them have not sent a byte yet.
type connSlots struct {
	max  int64
	open atomic.Int64

	mu     sync.Mutex
	unused map[*cappedConn]struct{}
}

func newConnSlots(maxConns int) *connSlots {
	return &connSlots{max: int64(maxConns), unused: make(map[*cappedConn]struct{})}
}

// count is the number of connections open.
func (c *connSlots) count() int { return int(c.open.Load()) }

func (c *connSlots) forget(conn *cappedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.unused, conn)
}

// closeUnused closes the connections that have not sent a byte. A drain
// does: Go's HTTP server would wait up to 5 s for each (another replica's
// transport, or a browser, opens connections in advance), and closing one
// loses no more than closing an idle keep-alive connection, which the
// server does anyway.
func (c *connSlots) closeUnused() {
	c.mu.Lock()
	unused := make([]*cappedConn, 0, len(c.unused))
	for conn := range c.unused {
		unused = append(unused, conn)
	}
	c.mu.Unlock()
	for _, conn := range unused {
		_ = conn.Close()
	}
}

// cappedListener admits connections while slots has room, and closes any
// beyond that at accept, with a reset, once refused has counted it. Each
// connection it admits counts the lines of its request heads (headLines).
type cappedListener struct {
	net.Listener
	slots   *connSlots
	refused func(net.Conn)
	// maxLines bounds the lines of a request head.
	maxLines int
}

// Accept returns the next connection within the cap.
func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.slots.open.Add(1) > l.slots.max {
			l.slots.open.Add(-1)
			l.refused(conn) // counted before the caller sees it
			resetConn(conn)
			continue
		}
		c := &cappedConn{Conn: conn, slots: l.slots, head: headLines{max: l.maxLines}}
		l.slots.mu.Lock()
		l.slots.unused[c] = struct{}{}
		l.slots.mu.Unlock()
		return c, nil
	}
}

// cappedConn is a connection the cap admitted. It gives its slot back when
// it closes, however many times it is closed, by the HTTP server or by
// whoever hijacked it; and while the server reads a request head it counts
// the head's lines, refusing the request with 431 beyond the bound.
type cappedConn struct {
	net.Conn
	slots *connSlots
	once  sync.Once
	used  atomic.Bool // a byte was read
	head  headLines
}

// errTooManyHeadLines ends a connection whose request head has too many
// lines. It is a read error, which Go's HTTP server closes the connection
// on without answering (the 431 is already written).
var errTooManyHeadLines = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("request head has too many lines")}

func (c *cappedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.used.Load() {
		c.used.Store(true)
		c.slots.forget(c)
	}
	if n > 0 && c.head.reading.Load() && c.head.scan(p[:n]) {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(c.Conn, tooManyHeadLinesAnswer)
		return 0, errTooManyHeadLines
	}
	return n, err
}

const tooManyHeadLinesAnswer = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n" +
	"431 Request Header Fields Too Large: the request head has too many lines; send fewer header fields\n"

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.slots.open.Add(-1)
		c.slots.forget(c)
	})
	return err
}

// CloseWrite half-closes the connection when it is TCP: the HTTP server
// uses it to close gracefully, and a switched (upgraded) connection to tell
// the caller that the upstream has finished.
func (c *cappedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// trackHeads is the HTTP server's ConnState hook for connections a
// cappedListener admitted: the server reads a request head from when a
// connection is new or idle until it turns active (the head is parsed).
func trackHeads(conn net.Conn, state http.ConnState) {
	c, ok := conn.(*cappedConn)
	if !ok {
		return
	}
	switch state {
	case http.StateNew, http.StateIdle:
		c.head.start()
	default:
		c.head.reading.Store(false)
	}
}

// headLines counts the lines of a request head as it is read: Go's HTTP
// server bounds a head in bytes only, and holds about 16 times the bytes of
// a head of many short header fields (a map entry, a key and a slice each),
// so a caller could make every connection hold half a megabyte with a
// 32 KiB head. Counting stops at the blank line that ends the head: what
// follows is a body. Only the connection's reading goroutine scans; the
// ConnState hook runs on it too, or before it starts.
type headLines struct {
	max     int
	reading atomic.Bool
	lines   int // lines ended so far, the request line included
	partial int // bytes of the line not ended yet
	// partialCR is set when those bytes are one "\r".
	partialCR bool
}

func (h *headLines) start() {
	h.lines, h.partial = 0, 0
	h.reading.Store(true)
}

// scan counts the lines in p, the next bytes of the head, and reports
// whether there are more than max.
func (h *headLines) scan(p []byte) (tooMany bool) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			h.partialCR = h.partial == 0 && len(p) == 1 && p[0] == '\r'
			h.partial += len(p)
			return false
		}
		// "\n" or "\r\n", the "\r" perhaps read before.
		n := h.partial + i
		blank := n == 0 || n == 1 && (i == 1 && p[0] == '\r' || i == 0 && h.partialCR)
		h.partial, p = 0, p[i+1:]
		switch {
		case blank && h.lines > 0: // the end of the head
			h.reading.Store(false)
			return false
		case blank: // before the request line: not part of a head
		default:
			if h.lines++; h.lines > h.max {
				return true
			}
		}
	}
	return false
}

// resetConn closes a connection with a reset, so that a refused connection
// leaves no socket in TIME_WAIT.
func resetConn(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// refuser counts and logs (sampled) a connection to listener refused at
// MaxHTTPConnections.
func (s *serving) refuser(listener, reason string) func(net.Conn) {
	return func(conn net.Conn) {
		s.metrics.connectionsRefused.WithLabelValues(reason).Inc()
		s.floodLog.Warn(listener+" connection refused: --max-http-connections are open; raise it if callers need more",
			zap.String("caller_address", conn.RemoteAddr().String()), zap.Int("limit", s.cfg.MaxHTTPConnections))
	}
}
