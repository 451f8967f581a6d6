// Package source is how tether's per-source caps tell callers apart: the
// tunnel port's caps on anonymous connections, the public entry's on
// connections and a tunnel's on each caller's requests all count by the
// same key, and close what they refuse the same way.
//
// A source is an IPv4 address, or the /64 of an IPv6 address (one
// subscriber's or one host's prefix), and its network an IPv4 /24 or an
// IPv6 /48, the block a single hosting customer gets.
package source

import (
	"net"
	"net/netip"
)

// Addr is the IP address of a TCP peer, IPv4 unmapped; the zero Addr for
// anything else.
func Addr(remote net.Addr) netip.Addr {
	ta, ok := remote.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	return ta.AddrPort().Addr().Unmap()
}

// KeyOf is the source a TCP peer counts as.
func KeyOf(remote net.Addr) netip.Addr { return Key(Addr(remote)) }

// Key is the source ip counts as: ip itself, or its /64 for IPv6.
func Key(ip netip.Addr) netip.Addr {
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// Network is the network of a source key: its IPv4 /24, its IPv6 /48.
func Network(key netip.Addr) netip.Addr {
	bits := 24
	if key.Is6() {
		bits = 48
	}
	p, _ := key.Prefix(bits)
	return p.Addr()
}

// Refuse closes a connection refused at a cap with a reset, so that it
// leaves no socket in TIME_WAIT.
func Refuse(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
