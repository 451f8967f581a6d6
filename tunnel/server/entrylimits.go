package server

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/internal/source"
)

// The public entry's limits: what callers of --http-addr, who need no token,
// can make the server hold. A connection takes one of MaxHTTPConnections
// slots, and one of its address's MaxHTTPConnectionsPerIP, from accept
// until it closes (a websocket until it ends); at a cap the connection
// idle longest makes room, or with none idle the new one is closed at
// once (connSlots). Its request head is at most maxEntryHeaderBytes in
// maxEntryHeadLines lines, with one framing header, and must arrive within
// the entry's ReadHeaderTimeout; a body may not stall for longer than
// BodyIdleTimeout (bodywatch.go); an idle keep-alive connection closes
// after its IdleTimeout. TestEntryFloodMemory measures what a held
// connection costs and asserts entryConnMemory; docs/limits.md states it
// ("Limits of the public entry").
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

// The public entry's per-address cap. An address is IPv4, or an IPv6 /64
// (source.Key); --trusted-proxies are not counted, since an ingress in
// front carries every caller's connections.
//
// defaultMaxHTTPConnectionsPerIP is an eighth of defaultMaxHTTPConnections:
// a browser opens 6 connections to a host and a webhook sender a few, so
// one address needs many only as a NAT or a proxy for many callers. At the
// cap an address's own longest-idle keep-alive connection makes room for
// its next, so a client that pools connections to many tunnels (the
// platform, reaching every runtime's tunnel from one egress address)
// recycles its own idle ones; what the cap bounds is the connections one
// address keeps busy (heads and bodies sent slowly, long polls,
// websockets): 1,024 of them, at most 96 MiB (entryConnMemory), and eight
// addresses to fill the entry.
const defaultMaxHTTPConnectionsPerIP = defaultMaxHTTPConnections / 8

// capLabels are a capped listener's reasons in
// tether_connections_refused_total: connections refused at accept at the
// listener's cap and at the per-address cap, and idle ones closed
// (evicted) to make room at each.
type capLabels struct {
	refused, refusedPerIP, evicted, evictedPerIP string
}

var (
	entryCapLabels = capLabels{
		refused: "http_connections", refusedPerIP: "http_connections_per_ip",
		evicted: "http_idle_evicted", evictedPerIP: "http_idle_evicted_per_ip",
	}
	// The peer port has no per-address cap: other replicas forward every
	// caller's requests.
	peerCapLabels = capLabels{refused: "peer_connections", evicted: "peer_idle_evicted"}
)

// A capEvent is what a capped listener did at a cap.
type capEvent int

const (
	capRefused capEvent = iota
	capRefusedPerIP
	capEvicted
	capEvictedPerIP
	// capAmbiguousLength: a request head had both Content-Length and
	// Transfer-Encoding; it was answered 400 and its connection closed.
	capAmbiguousLength
)

// connSlots counts a listener's open connections against a cap, in all and
// per address, and keeps those that wait for a request (new, or idle
// between requests, with no byte of the next one read) in the order they
// began to wait: at a cap, the one that has waited longest is closed to
// make room. Closing an idle keep-alive connection loses nothing a client
// does not handle (it happens at IdleTimeout anyway); refusing the new
// connection instead let one address hold the whole entry with idle
// connections, for about 68 requests a second.
type connSlots struct {
	// Static after construction.
	max    int64
	perIP  int
	exempt func(netip.Addr) bool // addresses the per-address cap does not count; nil: none

	// Written under mu, read without it (the gauge).
	open atomic.Int64

	// Guarded by mu.
	mu      sync.Mutex
	waiting connList // every waiting connection
	byIP    map[netip.Addr]*sourceConns
}

// sourceConns are one address's connections.
type sourceConns struct {
	open    int
	waiting connList
}

// newConnSlots makes slots for maxConns connections, and perIP from one
// address (0: no per-address cap) unless exempt says otherwise.
func newConnSlots(maxConns, perIP int, exempt func(netip.Addr) bool) *connSlots {
	return &connSlots{max: int64(maxConns), perIP: perIP, exempt: exempt, byIP: make(map[netip.Addr]*sourceConns)}
}

// count is the number of connections open.
func (c *connSlots) count() int { return int(c.open.Load()) }

// admit takes a slot for conn, or says which cap refused it. At a cap it
// evicts the connection that has waited longest for a request, of conn's
// address at the per-address cap, of any at the listener's: evicted, with
// its slot given back, which the caller closes.
func (c *connSlots) admit(conn net.Conn, maxLines int) (admitted, evicted *cappedConn, ev capEvent) {
	ip := source.Addr(conn.RemoteAddr())
	c.mu.Lock()
	defer c.mu.Unlock()
	var src *sourceConns
	if c.perIP > 0 && (c.exempt == nil || !c.exempt(ip)) {
		key := source.Key(ip)
		if src = c.byIP[key]; src == nil {
			src = &sourceConns{}
			c.byIP[key] = src
		}
		if src.open >= c.perIP {
			if evicted = src.waiting.front(); evicted == nil {
				return nil, nil, capRefusedPerIP
			}
			ev = capEvictedPerIP
			c.releaseLocked(evicted)
		}
	}
	if evicted == nil && c.open.Load() >= c.max {
		if evicted = c.waiting.front(); evicted == nil {
			if src != nil && src.open == 0 {
				delete(c.byIP, source.Key(ip))
			}
			return nil, nil, capRefused
		}
		ev = capEvicted
		c.releaseLocked(evicted)
	}
	admitted = &cappedConn{Conn: conn, slots: c, src: src, ip: source.Key(ip), head: headLines{max: maxLines}}
	c.open.Add(1)
	if src != nil {
		src.open++
	}
	c.waitLocked(admitted)
	return admitted, evicted, ev
}

// waitLocked puts conn at the end of the waiting lists.
func (c *connSlots) waitLocked(conn *cappedConn) {
	if conn.gone || conn.waiting.Load() {
		return
	}
	conn.waiting.Store(true)
	c.waiting.pushBack(conn, allSources)
	if conn.src != nil {
		conn.src.waiting.pushBack(conn, perSource)
	}
}

// busyLocked takes conn off the waiting lists.
func (c *connSlots) busyLocked(conn *cappedConn) {
	if !conn.waiting.Load() {
		return
	}
	conn.waiting.Store(false)
	c.waiting.remove(conn, allSources)
	if conn.src != nil {
		conn.src.waiting.remove(conn, perSource)
	}
}

// releaseLocked gives conn's slot back, once.
func (c *connSlots) releaseLocked(conn *cappedConn) {
	if conn.gone {
		return
	}
	c.busyLocked(conn)
	conn.gone = true
	c.open.Add(-1)
	if src := conn.src; src != nil {
		if src.open--; src.open == 0 {
			delete(c.byIP, conn.ip)
		}
	}
}

// wait records that conn waits for its next request.
func (c *connSlots) wait(conn *cappedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waitLocked(conn)
}

// busy records that conn no longer waits: a byte of a request came, or
// the server switched it to another protocol.
func (c *connSlots) busy(conn *cappedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn.used = true
	c.busyLocked(conn)
}

// closeUnused closes the connections that have not sent a byte. A drain
// does: Go's HTTP server would wait up to 5 s for each (another replica's
// transport, or a browser, opens connections in advance), and closing one
// loses no more than closing an idle keep-alive connection, which the
// server does anyway.
func (c *connSlots) closeUnused() {
	c.mu.Lock()
	var unused []*cappedConn
	for conn := c.waiting.front(); conn != nil; conn = conn.links[allSources].next {
		if !conn.used {
			unused = append(unused, conn)
		}
	}
	c.mu.Unlock()
	for _, conn := range unused {
		_ = conn.Close()
	}
}

// A connList is a list of connections linked through their links[which]:
// a connection may be on the list of all waiting connections and on its
// address's at once. Guarded by connSlots.mu.
type connList struct {
	head, tail *cappedConn
}

type listLink struct{ prev, next *cappedConn }

// Which of a connection's links a list uses.
const (
	allSources = iota
	perSource
)

func (l *connList) front() *cappedConn { return l.head }

func (l *connList) pushBack(c *cappedConn, which int) {
	c.links[which] = listLink{prev: l.tail}
	if l.tail != nil {
		l.tail.links[which].next = c
	} else {
		l.head = c
	}
	l.tail = c
}

func (l *connList) remove(c *cappedConn, which int) {
	link := c.links[which]
	if link.prev != nil {
		link.prev.links[which].next = link.next
	} else {
		l.head = link.next
	}
	if link.next != nil {
		link.next.links[which].prev = link.prev
	} else {
		l.tail = link.prev
	}
	c.links[which] = listLink{}
}

// cappedListener admits connections while slots has room, making room at
// a cap by closing the connection that has waited longest for a request,
// and closes any it cannot admit at accept, with a reset, once report has
// counted it. Each connection it admits counts the lines of its request
// heads (headLines).
type cappedListener struct {
	net.Listener
	slots *connSlots
	// report counts and logs what the listener did at a cap, and a
	// request head refused.
	report func(net.Conn, capEvent)
	// maxLines bounds the lines of a request head.
	maxLines int
}

// Accept returns the next connection within the caps.
func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c, evicted, ev := l.slots.admit(conn, l.maxLines)
		if c == nil {
			l.report(conn, ev) // counted before the caller sees it
			source.Refuse(conn)
			continue
		}
		if evicted != nil {
			l.report(evicted.Conn, ev)
			_ = evicted.Conn.Close() // its server goroutine sees the end and closes it
		}
		c.report = l.report
		return c, nil
	}
}

// cappedConn is a connection the cap admitted. It gives its slot back when
// it closes, however many times it is closed, by the HTTP server or by
// whoever hijacked it; and while the server reads a request head it counts
// the head's lines, refusing the request with 431 beyond the bound, and
// refuses one whose length is ambiguous (headLines).
type cappedConn struct {
	// Static after admit.
	net.Conn
	slots  *connSlots
	src    *sourceConns // nil when the per-address cap does not count it
	ip     netip.Addr   // the address it counts under
	report func(net.Conn, capEvent)

	// Owned by the connection's reading goroutine.
	head headLines

	// waiting mirrors being on the waiting lists, for Read to check
	// without the lock; written under slots.mu.
	waiting atomic.Bool

	// Guarded by slots.mu.
	links [2]listLink
	used  bool // a byte was read
	gone  bool // the slot was given back
}

// errBadHead ends a connection whose request head was refused. It is a
// read error, which Go's HTTP server closes the connection on without
// answering (the answer is already written).
var errBadHead = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("request head refused")}

func (c *cappedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.waiting.Load() {
		c.slots.busy(c)
	}
	if n > 0 && c.head.reading.Load() {
		if answer := c.head.scan(p[:n]); answer != headOK {
			if answer == headAmbiguousLength {
				c.report(c.Conn, capAmbiguousLength)
			}
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = io.WriteString(c.Conn, headAnswers[answer])
			return 0, errBadHead
		}
	}
	return n, err
}

// headAnswers are the answers to refused heads, with the connection
// closed after them.
var headAnswers = [...]string{
	headTooManyLines: "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n" +
		"431 Request Header Fields Too Large: the request head has too many lines; send fewer header fields\n",
	headAmbiguousLength: "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\n" +
		"X-Tether-Error: bad_request\r\nConnection: close\r\n\r\n" +
		"tether: bad request: both Content-Length and Transfer-Encoding; send one of them (RFC 9112, section 6.3)\n",
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.slots.mu.Lock()
	c.slots.releaseLocked(c)
	c.slots.mu.Unlock()
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

// trackConns is the HTTP server's ConnState hook for connections a
// cappedListener admitted. The server reads a request head from when a
// connection is new or idle until it turns active (the head is parsed);
// an idle connection waits for its next request, and may be evicted until
// a byte of it comes (Read).
func trackConns(conn net.Conn, state http.ConnState) {
	c, ok := conn.(*cappedConn)
	if !ok {
		return
	}
	switch state {
	case http.StateNew:
		c.head.start()
	case http.StateIdle:
		c.head.start()
		c.slots.wait(c)
	default:
		c.head.reading.Store(false)
		if c.waiting.Load() { // a request read from the server's buffer
			c.slots.busy(c)
		}
	}
}

// headLines reads a request head as the server receives it, for what Go's
// HTTP server does not check:
//
//   - Its lines. Go bounds a head in bytes only, and holds about 16 times
//     the bytes of a head of many short header fields (a map entry, a key
//     and a slice each), so a caller could make every connection hold half
//     a megabyte with a 32 KiB head.
//   - Content-Length and Transfer-Encoding together. Go serves such a
//     request by the chunks and keeps the connection; RFC 9112 (section
//     6.3) has a server close it, since a proxy in front may have framed
//     the request by the other header and hidden a second request in the
//     body. Go drops the Content-Length it ignored from the request, so
//     only the raw head tells.
//
// Counting stops at the blank line that ends the head: what follows is a
// body. Only the connection's reading goroutine scans; the ConnState hook
// runs on it too, or before it starts.
type headLines struct {
	// Static after admit.
	max int

	// Set by the ConnState hook and the scan, read by Read.
	reading atomic.Bool

	// Owned by the reading goroutine.
	lines   int // lines ended so far, the request line included
	partial int // bytes of the line not ended yet
	// partialCR is set when those bytes are one "\r".
	partialCR bool
	// name holds the first bytes of the header line being read, enough
	// to tell the two framing headers.
	name [len(transferEncodingPrefix)]byte
	// Framing headers seen in this head.
	contentLength, transferEncoding bool
}

const (
	contentLengthPrefix    = "content-length:"
	transferEncodingPrefix = "transfer-encoding:"
)

// What headLines.scan says of a head.
type headAnswer int

const (
	headOK headAnswer = iota
	headTooManyLines
	headAmbiguousLength
)

func (h *headLines) start() {
	h.lines, h.partial = 0, 0
	h.contentLength, h.transferEncoding = false, false
	h.reading.Store(true)
}

// scan reads p, the next bytes of the head, and says whether the head is
// refused: it has more than max lines, or both framing headers.
func (h *headLines) scan(p []byte) headAnswer {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			h.keepName(p)
			h.partialCR = h.partial == 0 && len(p) == 1 && p[0] == '\r'
			h.partial += len(p)
			return headOK
		}
		h.keepName(p[:i])
		// "\n" or "\r\n", the "\r" perhaps read before.
		n := h.partial + i
		blank := n == 0 || n == 1 && (i == 1 && p[0] == '\r' || i == 0 && h.partialCR)
		h.partial, p = 0, p[i+1:]
		switch {
		case blank && h.lines > 0: // the end of the head
			h.reading.Store(false)
			if h.contentLength && h.transferEncoding {
				return headAmbiguousLength
			}
			return headOK
		case blank: // before the request line: not part of a head
		default:
			if h.lines > 0 {
				h.header(n)
			}
			if h.lines++; h.lines > h.max {
				return headTooManyLines
			}
		}
	}
	return headOK
}

// keepName keeps what of p, the next bytes of the current line, name has
// room for.
func (h *headLines) keepName(p []byte) {
	if h.partial < len(h.name) {
		copy(h.name[h.partial:], p)
	}
}

// header notes a framing header in the header line of n bytes just read.
// Go's server refuses a name with a space before the colon, so the name
// and the colon start the line.
func (h *headLines) header(n int) {
	name := h.name[:min(n, len(h.name))]
	switch {
	case len(name) >= len(contentLengthPrefix) && bytes.EqualFold(name[:len(contentLengthPrefix)], []byte(contentLengthPrefix)):
		h.contentLength = true
	case len(name) >= len(transferEncodingPrefix) && bytes.EqualFold(name, []byte(transferEncodingPrefix)):
		h.transferEncoding = true
	}
}

// capReporter counts and logs (sampled) what listener's cappedListener
// does at its caps, under labels.
func (s *replica) capReporter(listener string, labels capLabels) func(net.Conn, capEvent) {
	return func(conn net.Conn, ev capEvent) {
		addr := zap.String("caller_address", conn.RemoteAddr().String())
		switch ev {
		case capRefused:
			s.metrics.connectionsRefused.WithLabelValues(labels.refused).Inc()
			s.srv.floodLog.Warn(listener+" connection refused: --max-http-connections are open, none of them idle; raise it if callers need more",
				addr, zap.Int("limit", s.srv.cfg.MaxHTTPConnections))
		case capRefusedPerIP:
			s.metrics.connectionsRefused.WithLabelValues(labels.refusedPerIP).Inc()
			s.srv.floodLog.Warn(listener+" connection refused: the caller's address has --max-http-connections-per-ip open, none of them idle",
				addr, zap.Int("limit", s.srv.cfg.MaxHTTPConnectionsPerIP))
		case capEvicted:
			s.metrics.connectionsRefused.WithLabelValues(labels.evicted).Inc()
			s.srv.floodLog.Warn(listener+" idle connection closed to make room: --max-http-connections are open; raise it if callers need more",
				addr, zap.Int("limit", s.srv.cfg.MaxHTTPConnections))
		case capEvictedPerIP:
			// A client that pools many connections (to many tunnels)
			// recycles its own idle ones: nothing for an operator to do.
			s.metrics.connectionsRefused.WithLabelValues(labels.evictedPerIP).Inc()
		case capAmbiguousLength:
			s.metrics.unrouted.WithLabelValues(unroutedAmbiguousLength).Inc()
			s.srv.refusalLog.Warn("request with both Content-Length and Transfer-Encoding refused", addr)
		}
	}
}

// unroutedAmbiguousLength counts requests refused for both framing
// headers (tether_http_unrouted_requests_total).
const unroutedAmbiguousLength = "ambiguous_length"
