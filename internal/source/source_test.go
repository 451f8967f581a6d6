package source

import (
	"net"
	"net/netip"
	"testing"
)

// The per-address caps count an IPv6 client by its /64.
func TestSourceKey(t *testing.T) {
	key := func(s string) netip.Addr { return KeyOf(net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s))) }
	for _, tc := range []struct{ a, b string }{
		{"192.0.2.1:1", "192.0.2.1:2"},
		{"[2001:db8:1:2::1]:1", "[2001:db8:1:2:ffff::9]:2"},
		{"[::ffff:192.0.2.1]:1", "192.0.2.1:2"},
	} {
		if ka, kb := key(tc.a), key(tc.b); ka != kb {
			t.Errorf("%s and %s count apart (%v, %v), want together", tc.a, tc.b, ka, kb)
		}
	}
	if a, b := key("[2001:db8:1:2::1]:1"), key("[2001:db8:1:3::1]:1"); a == b {
		t.Errorf("two /64s count together (%v)", a)
	}
}
