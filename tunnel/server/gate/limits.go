package gate

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// The gate's limits: what a connection that has not logged in (anonymous)
// can make the server hold, and how many streams a session may open. Each
// limit says what it bounds; the worst case they add up to is measured by
// TestAnonymousFloodMemory and stated in docs/limits.md ("Limits of the tunnel
// port").
//
// An anonymous connection goes through: TCP accept (a slot among
// MaxAnonymous, MaxAnonymousPerIP and the per-network cap, or closed at
// once, before TLS; at MaxAnonymous the stalest anonymous connection makes
// room, see anonymousSlots) → its first byte within firstByteTimeout → TLS
// (or wss) handshake within HandshakeTimeout → one stream whose first frp
// message (the login, or a probe) arrives within loginOpeningTimeout and
// is at most MaxOpeningSize → the login verified within LoginTimeout. All
// the while it may send at most LoginBudget bytes. Once the login is
// verified the connection is a tunnel's session: it leaves the anonymous
// slots, and only MaxClientStreams and the ping rate still apply.
const (
	// DefaultMaxAnonymous bounds the connections that have not logged in,
	// on the whole server: it is what bounds their memory (each at most
	// AnonymousConnMemory, so 1024 of them at most 160 MiB). A reconnect
	// storm does not need more: a legitimate connection is anonymous for a
	// TLS handshake and one login round trip, a few milliseconds, and one
	// refused at the cap costs the server an accept and a close, and its
	// client retries after a jittered backoff (200 ms, doubling). While a
	// storm exceeds what the CPUs can handshake, refusing the excess at
	// once serves the rest sooner than queueing everyone into timeouts.
	DefaultMaxAnonymous = 1024
	// DefaultMaxAnonymousPerIP bounds the anonymous connections from one
	// source address (one /64 for IPv6), so one address cannot take all of
	// DefaultMaxAnonymous. 64 lets 64 runtimes behind one NAT address
	// handshake at the same instant; more behind it still get in, a few
	// milliseconds later. Behind a load balancer that hides client
	// addresses (a Kubernetes Service with externalTrafficPolicy: Cluster)
	// every client shares a node's address: raise --max-anonymous-per-ip
	// there, or keep client addresses.
	DefaultMaxAnonymousPerIP = 64

	// firstByteTimeout bounds the wait for a connection's first byte (the
	// ClientHello, or frp's 0x17 before it). A client sends it as soon as
	// its TCP connect returns, so it arrives within a round trip, or
	// within 3 s when the path loses it twice (TCP retransmits after 1 s,
	// then 2 s more). Until then the connection is a bare TCP connect,
	// which costs its sender nothing to hold: the rest of
	// HandshakeTimeout would let 1,024 slots be held with 100 connects a
	// second.
	firstByteTimeout = 5 * time.Second

	// LoginBudget bounds the bytes a connection may send before its login
	// is verified, counted on the TCP connection: the TLS handshake, the
	// wss upgrade, yamux frames and the login. The largest login is about
	// 6 KiB and a handshake about 2 KiB, so 32 KiB leaves room to spare
	// while bounding what TLS, the websocket and yamux can buffer for an
	// anonymous client. yamux alone would buffer up to its per-stream
	// receive window (256 KiB, which hashicorp/yamux v0.1.2 cannot shrink)
	// on every stream, and it allocates a data frame's announced length
	// before the data arrives: muxGuard refuses an announcement larger
	// than the budget left.
	LoginBudget = 32 << 10
	// MaxOpeningSize bounds a stream's first frp message, the only message
	// the gate reads, and is checked in the frame header before the frame
	// is allocated. It is frp's own bound for a v1 message, so every
	// opening frp could read still passes; the largest login a tether
	// client sends (32 routes with long upstream names, a token with long
	// claims) is about 6 KiB.
	MaxOpeningSize = frpMaxV1Message
	// loginOpeningTimeout is how long after the handshake a connection
	// has to deliver its first message: the login or probe a client sends
	// at once (or half of LoginTimeout, if that is shorter).
	loginOpeningTimeout = 5 * time.Second

	// MaxClientStreams bounds the streams a logged-in client has open at
	// once. A tether client opens one, its control stream: the server
	// opens the streams that carry requests. A stock frpc opens its control
	// stream and a work connection per request in flight through frp's
	// HTTP vhost (frps asks for one whenever its pool is empty, without a
	// bound), so 256 leaves a busy frpc tunnel room for 250 concurrent
	// requests, long polls and websockets while bounding what one token
	// can hold open.
	MaxClientStreams = 256

	// yamux answers each ping from a goroutine of its own, which waits up
	// to the connection write timeout when the client does not read: pings
	// beyond PingBurst, refilled at pingRate per second, close the session.
	// A tether client pings every two thirds of its heartbeat timeout, at
	// most every 2s (tunnel.KeepAlive); frpc every 30s.
	PingBurst = 32
	pingRate  = 2
)

// AnonymousConnMemory is the most memory (heap and stacks) one anonymous
// connection can make the server hold, whatever it sends: the login budget
// held in TLS, yamux and opening buffers or announced in a yamux frame,
// plus the connection's goroutines and state. TestAnonymousFloodMemory
// measures each attack and asserts this bound; the costliest, a 16.5 KB
// ClientHello (which TLS keeps buffers for) and then a yamux frame
// announcing the rest of the budget, holds about 100 KiB (130 KiB with the
// race detector).
const AnonymousConnMemory = 160 << 10

// limitError is a limit a client went over; the gate closes its session.
// Reason is the metric label, a fixed set.
type limitError struct {
	reason string
	detail string
}

func (e *limitError) Error() string { return e.detail }

// Reasons for closing a session at a limit (label values of
// tether_sessions_closed_by_limit_total).
const (
	LimitLoginBudget       = "login_budget"
	LimitStreamBeforeLogin = "stream_before_login"
	LimitStreams           = "streams"
	LimitPings             = "pings"
	LimitNoLogin           = "no_login"
	LimitLoginTimeout      = "login_timeout"
	// The anonymous connection's first byte did not come within
	// firstByteTimeout.
	LimitFirstByte = "first_byte"
	// The anonymous connection was evicted to make room for a new one
	// (anonymousSlots).
	LimitEvicted = "evicted"
)

// Reasons for refusing a connection at accept (label values of
// tether_connections_refused_total).
const (
	RefusedAnonymous          = "anonymous"
	RefusedAnonymousPerIP     = "anonymous_per_ip"
	RefusedAnonymousPerSubnet = "anonymous_per_subnet"
)

// connLimits are the limits of one connection: what it may still send
// before its login is verified (lifted at login), and the first limit it
// went over. The gate reads that after the session ends: yamux reports an
// error of the connection only when nothing else ended the session first.
type connLimits struct {
	left    atomic.Int64
	lifted  atomic.Bool
	tripped atomic.Pointer[limitError]
}

func newConnLimits(budget int64) *connLimits {
	l := &connLimits{}
	l.left.Store(budget)
	return l
}

// lift ends the login budget: the connection logged in. A nil connLimits
// is none.
func (l *connLimits) lift() {
	if l != nil {
		l.lifted.Store(true)
	}
}

// anonymous reports whether the login budget still counts.
func (l *connLimits) anonymous() bool { return l != nil && !l.lifted.Load() }

// trip records lim as the limit the connection went over, unless another
// was first, and returns it.
func (l *connLimits) trip(lim *limitError) *limitError {
	l.tripped.CompareAndSwap(nil, lim)
	return lim
}

func (l *connLimits) overBudget() *limitError {
	return l.trip(&limitError{reason: LimitLoginBudget,
		detail: fmt.Sprintf("sent more than %d bytes before logging in", LoginBudget)})
}

// budgetConn charges what is read from the TCP connection to the login
// budget. Reads stop at the budget, so nothing beyond it is even read.
// Until the login, it tells the connection's slot when the server waits
// for the client.
type budgetConn struct {
	net.Conn
	limits *connLimits
	slot   *anonymousSlot
}

func (c *budgetConn) Read(p []byte) (int, error) {
	if !c.limits.anonymous() {
		return c.Conn.Read(p)
	}
	left := c.limits.left.Load()
	if left <= 0 {
		return 0, c.limits.overBudget()
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	c.slot.waitingSince.Store(time.Now().UnixNano())
	n, err := c.Conn.Read(p)
	c.slot.waitingSince.Store(0)
	c.limits.left.Add(int64(-n))
	return n, err
}

// yamux frame header (hashicorp/yamux const.go): version(1) type(1)
// flags(2) stream(4) length(4).
const (
	muxHeaderSize    = 12
	muxTypeData      = 0
	muxTypeWindowUpd = 1
	muxTypePing      = 2
	muxFlagSYN       = 1
)

// muxGuard reads the yamux frames a client sends, below yamux, and ends
// the session (a Read error, which ends yamux's receive loop) when
// the client goes over a limit that yamux itself would only pay for:
//
//   - before login, more than one stream (one SYN): yamux would allocate
//     each and queue up to 256 before the gate saw the second;
//   - before login, a data frame announcing more than the budget left:
//     yamux allocates the announced length before the data arrives;
//   - at any time, pings faster than pingRate: yamux answers each from a
//     goroutine of its own.
//
// Only yamux's receive loop reads, so the parsing state needs no lock.
type muxGuard struct {
	// Static after openSession. opening, when set, runs for each stream
	// the client opens, before yamux sees it (the gate's accept loop may
	// be parked).
	net.Conn
	limits  *connLimits
	opening func()

	// Owned by yamux's receive loop, the only reader.
	header [muxHeaderSize]byte
	have   int    // header bytes gathered
	body   uint32 // body bytes of the current frame still to come
	syns   int    // streams opened (SYN frames)
	pings  pingLimiter
}

func (g *muxGuard) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if lerr := g.inspect(p[:n]); lerr != nil {
		return 0, lerr
	}
	return n, err
}

func (g *muxGuard) inspect(b []byte) *limitError {
	for len(b) > 0 {
		if g.body > 0 {
			k := min(uint32(len(b)), g.body) //nolint:gosec // len(b) fits: it is at most the body left
			g.body -= k
			b = b[k:]
			continue
		}
		k := copy(g.header[g.have:], b)
		g.have += k
		b = b[k:]
		if g.have < muxHeaderSize {
			return nil
		}
		g.have = 0
		if err := g.frame(); err != nil {
			return err
		}
	}
	return nil
}

// frame checks the header just read.
func (g *muxGuard) frame() *limitError {
	typ := g.header[1]
	flags := binary.BigEndian.Uint16(g.header[2:4])
	length := binary.BigEndian.Uint32(g.header[8:12])
	anonymous := g.limits.anonymous()
	switch typ {
	case muxTypeData:
		g.body = length
		if anonymous && int64(length) > g.limits.left.Load() {
			return g.limits.overBudget()
		}
	case muxTypePing:
		if flags&muxFlagSYN != 0 && !g.pings.allow(time.Now()) {
			return g.limits.trip(&limitError{reason: LimitPings,
				detail: fmt.Sprintf("pinged more than %d times at once or %d times a second", PingBurst, pingRate)})
		}
	}
	if (typ == muxTypeData || typ == muxTypeWindowUpd) && flags&muxFlagSYN != 0 {
		if g.syns++; anonymous && g.syns > 1 {
			return g.limits.trip(&limitError{reason: LimitStreamBeforeLogin,
				detail: "opened a second stream before its login was verified"})
		}
		if g.opening != nil {
			g.opening()
		}
	}
	return nil
}

// pingLimiter is a token bucket of PingBurst pings, refilled at pingRate.
type pingLimiter struct {
	tokens float64
	last   time.Time
}

func (l *pingLimiter) allow(now time.Time) bool {
	if l.last.IsZero() {
		l.tokens = PingBurst
	} else {
		l.tokens = min(PingBurst, l.tokens+now.Sub(l.last).Seconds()*pingRate)
	}
	l.last = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// closeAtLimit closes a session that went over lim, and counts and logs it
// unless the session had already ended.
func (g *Gate) closeAtLimit(sess *Session, lim *limitError) {
	if sess.beginClose(lim.detail) {
		g.obs.SessionLimited(lim.reason)
		// One message per reason, so that a flood of one kind does not
		// hide another from the sampled log.
		g.cfg.FloodLog.Warn("tunnel connection closed at a limit: "+lim.reason, zap.String("client_address", sess.remoteAddr),
			zap.String("tunnel", sess.Tunnel()), zap.String("detail", lim.detail))
	}
	sess.Close(lim.detail)
}
