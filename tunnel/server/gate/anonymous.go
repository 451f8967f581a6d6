package gate

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/internal/source"
)

// anonymousSlots counts the connections that have not logged in: in total,
// by source address and by source network, and apart for the addresses
// whose clients are logged in or were lately (known addresses).
//
// Full, it makes room by evicting the connection whose client has kept it
// waiting longest (stalest): a legitimate client answers each step of the
// handshake and the login within a round trip, while a connection held
// for its slot sits silent. Only a connection the server is waiting on
// counts (a read is pending), so that one whose bytes the server has not
// got round to reading yet, or whose login it is verifying, is never
// blamed for the server's delay; and only after evictableSilence, so that
// a reconnect storm that fills the slots with live handshakes is not made
// to kill its own. The victim's address must hold at least two more
// anonymous connections than the newcomer's: an address takes slots from
// those that hold more than it, never from its equals, so a flood from a
// few addresses that keeps reconnecting cannot evict its way around the
// slots that grow stale, and a client from an address that holds none
// finds them. A connection from an address that is not known takes only
// an unknown one's place, and unknown ones hold at most MaxAnonymous less
// the reserved quarter: a flood from fresh addresses cannot keep the
// clients that were just connected (after a network blip, all of them at
// once) from logging back in.
type anonymousSlots struct {
	// Static after construction, but for silence, which tests shorten
	// or lengthen under mu.
	max, perIP, perSubnet, reserved int

	mu       sync.Mutex
	silence  time.Duration
	held     []*anonymousSlot // every slot taken, in no order
	unknown  int              // of held, those of addresses not known when they came
	byIP     map[netip.Addr]int
	bySubnet map[netip.Addr]int
	// known are the addresses (source.Key) of clients logged in now or
	// within knownClientFor, at most maxKnownClients of them.
	known     map[netip.Addr]knownClient
	lastSweep time.Time
}

// knownClient is what anonymousSlots remembers of an address whose
// clients logged in.
type knownClient struct {
	live int   // sessions from it logged in now
	last int64 // when one last logged in or ended, Unix nanoseconds
}

// The anonymous slots' shares. See anonymousSlots.
const (
	// SubnetShare times MaxAnonymousPerIP is the cap on anonymous
	// connections from one IPv4 /24 or IPv6 /48, the block a single
	// hosting customer gets: an attacker with a block of addresses has
	// four addresses' worth, not a /24's 256 times the per-address cap.
	// It follows --max-anonymous-per-ip, so that raising that for a load
	// balancer that hides client addresses (all of them then in the
	// nodes' network) raises both.
	SubnetShare = 4
	// ReservedDivisor: MaxAnonymous / ReservedDivisor slots (256 of the
	// default 1024) are kept for known addresses. A client is anonymous
	// for a TLS handshake and one login round trip, a few milliseconds:
	// 256 at once readmit thousands of clients a second, more than the
	// CPUs can handshake.
	ReservedDivisor = 4
	// evictableSilence is how long a client must have kept its connection
	// waiting before the connection may be evicted: a round trip is
	// under a second on any path, and over a lossy one TCP retransmits a
	// lost segment after 1 s.
	evictableSilence = 2 * time.Second
	// knownClientFor is how long an address stays known after its last
	// session ended: long enough for a network blip, a restarted node or
	// a rolling restart of the clients.
	knownClientFor = time.Hour
	// maxKnownClients bounds the known addresses (about 100 bytes each,
	// 6 MiB in all). Only a client with a valid token adds one. When
	// every place is taken by an address seen within knownClientFor, a
	// new address is not remembered until one expires.
	maxKnownClients = 1 << 16
	// knownSweepEvery bounds how often a full table of known addresses is
	// swept for expired ones.
	knownSweepEvery = time.Minute
)

func newAnonymousSlots(maxTotal, perIP int) *anonymousSlots {
	return &anonymousSlots{
		max: maxTotal, perIP: perIP, perSubnet: SubnetShare * perIP, reserved: maxTotal / ReservedDivisor,
		silence: evictableSilence,
		byIP:    make(map[netip.Addr]int), bySubnet: make(map[netip.Addr]int), known: make(map[netip.Addr]knownClient),
	}
}

// acquire takes a slot for conn, accepted now, or returns the reason it
// may not have one. When the slots are full for conn it evicts a
// connection (victim) to make room: the caller closes it.
func (a *anonymousSlots) acquire(conn net.Conn, now time.Time) (slot, victim *anonymousSlot, refused string) {
	ip := source.KeyOf(conn.RemoteAddr())
	subnet := source.Network(ip)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byIP[ip] >= a.perIP {
		return nil, nil, RefusedAnonymousPerIP
	}
	if a.bySubnet[subnet] >= a.perSubnet {
		return nil, nil, RefusedAnonymousPerSubnet
	}
	known := a.isKnown(ip, now)
	if len(a.held) >= a.max || !known && a.unknown >= a.max-a.reserved {
		victim = a.stalest(false, a.byIP[ip]+2, now)
		if victim == nil && known {
			victim = a.stalest(true, a.byIP[ip]+2, now)
		}
		if victim == nil {
			return nil, nil, RefusedAnonymous
		}
		a.releaseLocked(victim)
	}
	slot = &anonymousSlot{slots: a, conn: conn, ip: ip, subnet: subnet, known: known, i: len(a.held)}
	a.held = append(a.held, slot)
	if !known {
		a.unknown++
	}
	a.byIP[ip]++
	a.bySubnet[subnet]++
	return slot, victim, ""
}

// stalest is the held connection, of a known address or not and from an
// address holding at least minFromIP, that has kept the server waiting
// longest, at least silence; nil when none has.
func (a *anonymousSlots) stalest(known bool, minFromIP int, now time.Time) *anonymousSlot {
	var victim *anonymousSlot
	longest := a.silence.Nanoseconds()
	for _, s := range a.held {
		if s.known != known || s.loggingIn.Load() || a.byIP[s.ip] < minFromIP {
			continue
		}
		since := s.waitingSince.Load()
		if since == 0 {
			continue // the server's turn
		}
		if d := now.UnixNano() - since; d >= longest {
			victim, longest = s, d
		}
	}
	return victim
}

func (a *anonymousSlots) releaseLocked(s *anonymousSlot) {
	if s.i < 0 {
		return
	}
	last := a.held[len(a.held)-1]
	a.held[s.i], last.i = last, s.i
	a.held[len(a.held)-1] = nil
	a.held = a.held[:len(a.held)-1]
	s.i = -1
	if !s.known {
		a.unknown--
	}
	if a.byIP[s.ip]--; a.byIP[s.ip] <= 0 {
		delete(a.byIP, s.ip)
	}
	if a.bySubnet[s.subnet]--; a.bySubnet[s.subnet] <= 0 {
		delete(a.bySubnet, s.subnet)
	}
}

// count is the number of slots taken.
func (a *anonymousSlots) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.held)
}

func (a *anonymousSlots) isKnown(ip netip.Addr, now time.Time) bool {
	k, ok := a.known[ip]
	return ok && (k.live > 0 || now.UnixNano()-k.last < knownClientFor.Nanoseconds())
}

// clientIn records a session from ip logged in now.
func (a *anonymousSlots) clientIn(ip netip.Addr, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.known[ip]
	if !ok && len(a.known) >= maxKnownClients {
		if now.Sub(a.lastSweep) < knownSweepEvery {
			return
		}
		a.lastSweep = now
		for addr := range a.known {
			if !a.isKnown(addr, now) {
				delete(a.known, addr)
			}
		}
		if len(a.known) >= maxKnownClients {
			return
		}
	}
	k.live++
	k.last = now.UnixNano()
	a.known[ip] = k
}

// clientOut records a logged-in session from ip ended now: the address
// stays known for knownClientFor.
func (a *anonymousSlots) clientOut(ip netip.Addr, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.known[ip]
	if !ok {
		return // not remembered: the table was full at its login
	}
	k.live = max(k.live-1, 0)
	k.last = now.UnixNano()
	a.known[ip] = k
}

// anonymousSlot is one connection's place among the anonymous ones. A nil
// slot is none.
type anonymousSlot struct {
	// Static after acquire.
	slots      *anonymousSlots
	conn       net.Conn // closed when the slot is evicted
	ip, subnet netip.Addr
	known      bool // the address was known when the connection came

	// Guarded by slots.mu: the index in slots.held; -1 once released.
	i int

	// Atomics written by the connection's reads (budgetConn) and its
	// login's arrival (admit.go), read by acquire's search for the stalest.
	// waitingSince is when the server began to wait for the client's next
	// bytes, in Unix nanoseconds; 0 while it is not waiting. loggingIn is
	// set once the login has arrived: the connection waits for the
	// server's verdict, not the other way round.
	waitingSince atomic.Int64
	loggingIn    atomic.Bool
}

// release gives the slot back; later calls do nothing.
func (s *anonymousSlot) release() {
	if s == nil {
		return
	}
	a := s.slots
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked(s)
}

// loggedIn gives the slot back for a verified login, and remembers the
// client's address as known.
func (s *anonymousSlot) loggedIn() {
	if s == nil {
		return
	}
	s.release()
	s.slots.clientIn(s.ip, time.Now())
}

// loggedOut records the end of the logged-in session that had the slot.
func (s *anonymousSlot) loggedOut() {
	if s != nil {
		s.slots.clientOut(s.ip, time.Now())
	}
}

// loginArrived marks the connection as waiting for the server's verdict.
func (s *anonymousSlot) loginArrived() {
	if s != nil {
		s.loggingIn.Store(true)
	}
}
