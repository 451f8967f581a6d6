package gate

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/source"
	"github.com/tether-dev/tether/internal/testutil"
)

// waitedSince sets how long the server has been waiting for the client of
// slot (0: it is the server's turn).
func waitedSince(slot *anonymousSlot, now time.Time, d time.Duration) {
	if d == 0 {
		slot.waitingSince.Store(0)
		return
	}
	slot.waitingSince.Store(now.Add(-d).UnixNano())
}

// At the cap, the connection evicted is the one that has kept the server
// waiting longest, and at least the evictable silence: never one whose
// login is being verified, or that the server has not waited on; and only
// from an address that holds at least two more than the newcomer's. A
// connection from an address that is not known takes only an unknown
// one's place, within the three quarters of the slots unknown addresses
// may hold; a known address's may take the reserved quarter, and evicts a
// known one only when no unknown one can go. An address stays known for
// knownClientFor after its last session.
func TestAnonymousEvictionOrder(t *testing.T) {
	now := time.Now()
	a := newAnonymousSlots(8, 64) // 2 reserved, 6 for unknown addresses
	take := func(addr string) (*anonymousSlot, *anonymousSlot, string) {
		t.Helper()
		return a.acquire(testutil.ConnFrom(addr), now)
	}
	var held []*anonymousSlot
	for _, addr := range []string{"192.0.2.1", "192.0.2.1", "192.0.2.1", "192.0.2.1", "203.0.113.1", "203.0.113.1"} {
		s, victim, refused := take(addr)
		if s == nil || victim != nil {
			t.Fatalf("slot %d: evicted %v, refused %q; want a free slot", len(held), victim != nil, refused)
		}
		held = append(held, s)
	}
	x1, x2, x3, x4, y1 := held[0], held[1], held[2], held[3], held[4]
	waitedSince(x1, now, 5*time.Second)
	waitedSince(x2, now, 10*time.Second)
	waitedSince(y1, now, time.Minute)

	_, victim, _ := take("198.51.100.1")
	if victim != y1 {
		t.Fatalf("evicted %+v, want the connection waited on for a minute", victim)
	}
	if y1.i != -1 || a.count() != 6 {
		t.Fatalf("the evicted slot is still held (index %d), %d slots taken; want it given back and 6", y1.i, a.count())
	}
	if _, victim, _ := take("198.51.100.1"); victim != x2 {
		t.Fatalf("a second connection from the newcomer's address evicted %+v, want the stalest of the address holding 4", victim)
	}

	// 192.0.2.1 holds 3 and 198.51.100.1 2: no eviction between them.
	x1.loggingIn.Store(true)
	waitedSince(x3, now, time.Minute)
	if s, victim, refused := take("198.51.100.1"); s != nil || victim != nil || refused != RefusedAnonymous {
		t.Fatalf("from an address holding 2, with the stale one's holding 3: slot %v, evicted %v, refused %q; want refused %q",
			s != nil, victim != nil, refused, RefusedAnonymous)
	}
	waitedSince(x3, now, evictableSilence/2)
	if s, victim, refused := take("198.51.100.99"); s != nil || victim != nil || refused != RefusedAnonymous {
		t.Fatalf("with a login being verified, a connection silent for %v, and ones the server does not wait on: slot %v, evicted %v, refused %q; want refused %q",
			evictableSilence/2, s != nil, victim != nil, refused, RefusedAnonymous)
	}

	// A known address has the reserved slots, then evicts unknown ones.
	known := func(addr string) string {
		a.clientIn(source.Key(netip.MustParseAddr(addr)), now)
		return addr
	}
	k := known("192.0.2.200")
	k1, victim, _ := take(k)
	k2, victim2, _ := take(k)
	if k1 == nil || k2 == nil || victim != nil || victim2 != nil {
		t.Fatalf("a known address with the reserved slots free: slots %v %v, evicted %v %v; want the reserved slots", k1 != nil, k2 != nil, victim != nil, victim2 != nil)
	}
	waitedSince(x3, now, 3*time.Second)
	if _, victim, _ := take(known("192.0.2.201")); victim != x3 {
		t.Fatalf("a known address at the cap: evicted %+v, want the stalest unknown connection", victim)
	}
	waitedSince(k1, now, time.Minute)
	if _, victim, _ := take(known("192.0.2.202")); victim != k1 {
		t.Fatalf("a known address at the cap, no unknown connection to evict: evicted %+v, want the stalest known one", victim)
	}
	_ = x4

	// Known for an hour after its last session ends.
	ip := source.Key(netip.MustParseAddr(k))
	a.clientOut(ip, now)
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.isKnown(ip, now.Add(knownClientFor-time.Minute)) || a.isKnown(ip, now.Add(knownClientFor+time.Minute)) {
		t.Errorf("known %v just before knownClientFor and %v just after; want true and false",
			a.isKnown(ip, now.Add(knownClientFor-time.Minute)), a.isKnown(ip, now.Add(knownClientFor+time.Minute)))
	}
}

// Connections that have not logged in are capped per IPv4 /24 (and IPv6
// /48) at four times the per-address cap: a block of addresses cannot take
// the whole gate.
func TestAnonymousPerSubnetCap(t *testing.T) {
	const perIP = 2
	g := startGate(t, func(c *Config) { c.MaxAnonymousPerIP = perIP })
	g.evictAfter(time.Hour)
	for host := 1; host <= SubnetShare; host++ {
		for range perIP {
			testutil.DialFrom(t, g.addr, "127.3.3."+strconv.Itoa(host))
		}
	}
	waitCount(t, "anonymous connections", g.Anonymous, SubnetShare*perIP)
	if err := testutil.ClosedByServer(testutil.DialRefusable(t, g.addr, "127.3.3.200"), 5*time.Second); err != nil {
		t.Errorf("a connection from a fifth address of the /24: %v; want it closed at once", err)
	}
	if got := g.obs.get("refused", RefusedAnonymousPerSubnet); got != 1 {
		t.Errorf("connections refused for %s: %d, want 1", RefusedAnonymousPerSubnet, got)
	}
	testutil.DialFrom(t, g.addr, "127.3.4.1") // another /24
	waitCount(t, "anonymous connections", g.Anonymous, SubnetShare*perIP+1)
}
