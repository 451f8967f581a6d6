package testutil

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Attack is what a Flood does on each of its connections to a tunnel port.
// None of them ever logs in.
type Attack string

// The attacks.
const (
	// AttackIdle connects and sends nothing (a TLS slowloris).
	AttackIdle Attack = "idle"
	// AttackHello sends most of a huge TLS ClientHello (announcing 60,000
	// bytes), Budget bytes in all, then nothing.
	AttackHello Attack = "hello"
	// AttackStreams completes TLS and opens Streams yamux streams at once,
	// each starting an frp v2 frame that announces 64 KiB, then nothing.
	AttackStreams Attack = "streams"
	// AttackAnnounce completes TLS and opens one stream starting an frp v2
	// frame that announces 64 KiB, then nothing.
	AttackAnnounce Attack = "announce"
	// AttackFrame completes TLS and opens one stream with a yamux data
	// frame that announces what is left of Budget, then nothing: yamux
	// allocates a frame's announced length up front.
	AttackFrame Attack = "frame"
	// AttackHelloFrame is AttackFrame after a ClientHello of 16.5 KB (long
	// ALPN protocol names), which TLS keeps buffers for.
	AttackHelloFrame Attack = "hello+frame"
	// AttackOpening completes TLS and opens one stream sending all but the
	// last bytes of an frp v1 message announcing 10,240 bytes (frp's
	// largest), then nothing.
	AttackOpening Attack = "opening"
)

// Flood opens PerSource connections from each of Sources (local IP
// addresses; every 127.0.0.x works on Linux loopback) to Addr, and does
// Attack on each.
type Flood struct {
	Addr      string
	Sources   []string
	PerSource int
	Attack    Attack
	// Streams is the number of streams of AttackStreams.
	Streams int
	// Budget is the bytes the server accepts before a login (AttackFrame
	// and AttackHello stay just under it).
	Budget int
}

// FloodConns are the connections of a running flood.
type FloodConns struct {
	conns []*floodConn
	wg    sync.WaitGroup
}

type floodConn struct {
	raw      net.Conn
	sent     atomic.Int64
	attacked time.Time     // when the attack was sent
	closed   chan struct{} // closed when the server closed the connection
	closedAt atomic.Int64  // unix nanos
	failed   error         // the dial or the TLS handshake failed
}

func (c *floodConn) Write(p []byte) (int, error) {
	n, err := c.raw.Write(p)
	c.sent.Add(int64(n))
	return n, err
}

// Start runs the flood: it returns once every connection has been made
// and has sent its attack, or failed to. The connections stay open until
// Close.
func (f Flood) Start(ctx context.Context) *FloodConns {
	fc := &FloodConns{}
	var setup sync.WaitGroup
	for _, src := range f.Sources {
		for range f.PerSource {
			c := &floodConn{closed: make(chan struct{})}
			fc.conns = append(fc.conns, c)
			setup.Go(func() { f.run(ctx, src, c, &fc.wg) })
		}
	}
	setup.Wait()
	return fc
}

func (f Flood) run(ctx context.Context, src string, c *floodConn, watchers *sync.WaitGroup) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	raw, err := d.DialContext(ctx, "tcp", f.Addr)
	if err != nil {
		c.failed = fmt.Errorf("dial from %s: %w", src, err)
		close(c.closed)
		return
	}
	c.raw = raw
	c.failed = f.attack(ctx, c)
	c.attacked = time.Now()
	watchers.Go(c.watch)
}

// longProtocolNames are 65 ALPN protocol names of 250 bytes, which make a
// ClientHello of 16.5 KB: more than one TLS record, which the server
// buffers whole.
var longProtocolNames = func() []string {
	names := make([]string, 65)
	for i := range names {
		names[i] = fmt.Sprintf("%0250d", i)
	}
	return names
}()

func (f Flood) attack(ctx context.Context, c *floodConn) error {
	switch f.Attack {
	case AttackIdle:
		return nil
	case AttackHello:
		return sendHugeClientHello(c, f.Budget)
	}
	// An attacker neither verifies nor offers the costlier post-quantum
	// key exchange: X25519 alone makes its handshakes the cheapest it can,
	// so that hundreds of them are open at once within the 5 s the server
	// gives a connection for its first message, even on a busy machine.
	cfg := &tls.Config{InsecureSkipVerify: true, CurvePreferences: []tls.CurveID{tls.X25519}} //nolint:gosec // an attacker does not verify
	if f.Attack == AttackHelloFrame {
		cfg.NextProtos = longProtocolNames
	}
	tc := tls.Client(&sentCounter{Conn: c.raw, c: c}, cfg)
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	var out []byte
	switch f.Attack {
	case AttackStreams:
		for i := range f.Streams {
			out = append(out, muxFrame(muxFlagSYN, uint32(2*i+1), v2Announce(64<<10))...) //nolint:gosec // i is small
		}
	case AttackAnnounce:
		out = muxFrame(muxFlagSYN, 1, v2Announce(64<<10))
	case AttackFrame, AttackHelloFrame:
		left := f.Budget - int(c.sent.Load()) - muxHeaderSize - 64 // what the guard sees may include a record header or two
		out = muxHeader(muxFlagSYN, 1, uint32(max(left, 0)))       //nolint:gosec // left is small
	case AttackOpening:
		const n = 10240
		m := make([]byte, 9+n-16)
		m[0] = 'o'
		binary.BigEndian.PutUint64(m[1:9], n)
		out = muxFrame(muxFlagSYN, 1, m)
	default:
		return fmt.Errorf("unknown attack %q", f.Attack)
	}
	// The server may close the connection while the attack is written:
	// watch tells.
	_, _ = tc.Write(out)
	return nil
}

// watch waits for the server to close the connection.
func (c *floodConn) watch() {
	buf := make([]byte, 512)
	for {
		if _, err := c.raw.Read(buf); err != nil {
			c.closedAt.Store(time.Now().UnixNano())
			close(c.closed)
			return
		}
	}
}

// FloodReport counts a flood's connections.
type FloodReport struct {
	Conns  int // attempted
	Failed int // the dial or the TLS handshake failed
	Open   int // still open
	// SlowestClose is the longest time from the attack to the server
	// closing a connection, of those that did not fail.
	SlowestClose time.Duration
	// FirstError is the first failure, for messages.
	FirstError error
}

// Report counts the connections now.
func (fc *FloodConns) Report() FloodReport {
	r := FloodReport{Conns: len(fc.conns)}
	for _, c := range fc.conns {
		if c.failed != nil {
			r.Failed++
			if r.FirstError == nil {
				r.FirstError = c.failed
			}
			continue
		}
		select {
		case <-c.closed:
			r.SlowestClose = max(r.SlowestClose, time.Unix(0, c.closedAt.Load()).Sub(c.attacked))
		default:
			r.Open++
		}
	}
	return r
}

// Close closes every connection and waits for the watchers.
func (fc *FloodConns) Close() {
	for _, c := range fc.conns {
		if c.raw != nil {
			_ = c.raw.Close()
		}
	}
	fc.wg.Wait()
}

// sentCounter counts the bytes TLS writes.
type sentCounter struct {
	net.Conn
	c *floodConn
}

func (s *sentCounter) Write(p []byte) (int, error) { return s.c.Write(p) }

// sendHugeClientHello sends TLS records of a ClientHello announcing 60,000
// bytes, budget bytes in all (less a margin), and stops.
func sendHugeClientHello(c *floodConn, budget int) error {
	const record = 16384
	left := budget - 64
	first := true
	for left > 5 {
		n := min(record, left-5)
		rec := make([]byte, 5+n)
		rec[0], rec[1], rec[2] = 0x16, 0x03, 0x01       // handshake record, TLS 1.0 framing as ClientHellos use
		binary.BigEndian.PutUint16(rec[3:5], uint16(n)) //nolint:gosec // n <= 16384
		if first {
			rec[5] = 1 // ClientHello
			rec[6], rec[7], rec[8] = 0, 0xea, 0x60
			first = false
		}
		if _, err := c.Write(rec); err != nil {
			return nil //nolint:nilerr // the server closed the connection: watch tells
		}
		left -= len(rec)
	}
	return nil
}

// yamux framing (hashicorp/yamux): version, type, flags, stream, length.
const (
	muxHeaderSize = 12
	muxFlagSYN    = 1
)

func muxHeader(flags uint16, stream, length uint32) []byte {
	h := make([]byte, muxHeaderSize)
	h[1] = 0 // data
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], stream)
	binary.BigEndian.PutUint32(h[8:12], length)
	return h
}

func muxFrame(flags uint16, stream uint32, body []byte) []byte {
	return append(muxHeader(flags, stream, uint32(len(body))), body...) //nolint:gosec // bodies are small
}

// v2Announce is frp's v2 magic and the header of a message frame announcing
// n bytes.
func v2Announce(n uint32) []byte {
	b := []byte("FRP\x00\x02\r\n")
	var h [8]byte
	binary.BigEndian.PutUint16(h[0:2], 16) // message frame
	binary.BigEndian.PutUint32(h[4:8], n)
	return append(b, h[:]...)
}

// Siege keeps PerSource connections from each of Sources to a tunnel port
// at Addr for as long as it runs: when the server closes one (at a
// deadline, or to make room for another) it dials again at once, and when
// the server refuses one at accept it dials again after RefusedPause. A
// connection sends nothing, or, with Trickle, a TLS record header and then
// one more byte every Trickle, a ClientHello that never ends.
type Siege struct {
	Addr         string
	Sources      []string
	PerSource    int
	Trickle      time.Duration
	RefusedPause time.Duration
}

// Sieging is a running Siege.
type Sieging struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	dials  atomic.Int64
	open   atomic.Int64
}

// Start starts the siege; it runs until Stop or ctx ends.
func (s Siege) Start(ctx context.Context) *Sieging {
	ctx, cancel := context.WithCancel(ctx)
	g := &Sieging{cancel: cancel}
	for _, src := range s.Sources {
		for range s.PerSource {
			g.wg.Go(func() { s.hold(ctx, src, g) })
		}
	}
	return g
}

// Dials is the number of connections made so far.
func (g *Sieging) Dials() int64 { return g.dials.Load() }

// Open is the number of connections open now.
func (g *Sieging) Open() int64 { return g.open.Load() }

// Stop closes every connection and waits for the siege to end.
func (g *Sieging) Stop() {
	g.cancel()
	g.wg.Wait()
}

// hold keeps one connection from src open until ctx ends.
func (s Siege) hold(ctx context.Context, src string, g *Sieging) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	for ctx.Err() == nil {
		conn, err := d.DialContext(ctx, "tcp", s.Addr)
		if err == nil {
			g.dials.Add(1)
			g.open.Add(1)
			lived := s.keep(ctx, conn)
			g.open.Add(-1)
			if lived >= s.RefusedPause {
				continue
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(s.RefusedPause):
		}
	}
}

// trickleHead is the start of a TLS record that announces a 16 KiB
// ClientHello; the rest is zeros.
var trickleHead = []byte{0x16, 0x03, 0x01, 0x40, 0x00, 0x01}

// keep holds conn until the server closes it or ctx ends, and returns how
// long it was open.
func (s Siege) keep(ctx context.Context, conn net.Conn) time.Duration {
	start := time.Now()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	defer conn.Close()
	buf := make([]byte, 512)
	for sent := 0; ; sent++ {
		if s.Trickle > 0 {
			b := []byte{0}
			if sent < len(trickleHead) {
				b[0] = trickleHead[sent]
			}
			if _, err := conn.Write(b); err != nil {
				return time.Since(start)
			}
			_ = conn.SetReadDeadline(time.Now().Add(s.Trickle))
		}
		if _, err := conn.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return time.Since(start)
		}
	}
}
