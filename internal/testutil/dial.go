package testutil

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
)

// DialFrom connects to addr from the local address src (on loopback, any
// 127.x.y.z: each is a source of its own to per-address caps). The
// connection closes when the test ends.
func DialFrom(t testing.TB, addr, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	conn, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// DialRefusable is DialFrom for a connection the server may reset before
// the dial returns: then nil.
func DialRefusable(t testing.TB, addr, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	conn, err := d.DialContext(t.Context(), "tcp", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// DialTLSFrom connects from src and completes TLS, trusting any
// certificate (a test server's self-signed one).
func DialTLSFrom(t testing.TB, addr, src string) *tls.Conn {
	t.Helper()
	conn := tls.Client(DialFrom(t, addr, src), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a test server's self-signed certificate
	if err := conn.HandshakeContext(t.Context()); err != nil {
		t.Fatalf("TLS handshake from %s: %v", src, err)
	}
	return conn
}

// ClosedByServer reports whether the server closed c (or reset it) within
// d, without sending anything; a nil c was reset as it was dialed.
func ClosedByServer(c net.Conn, d time.Duration) error {
	if c == nil {
		return nil
	}
	_ = c.SetReadDeadline(time.Now().Add(d))
	n, err := c.Read(make([]byte, 1))
	switch {
	case n > 0:
		return errors.New("the server sent data")
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("still open after %v", d)
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return nil
	default:
		return err
	}
}

// ConnFrom is a connection from addr, port 40000, for the bookkeeping of a
// cap: only its RemoteAddr may be called.
func ConnFrom(addr string) net.Conn {
	return fakeConn{addr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(addr), 40000))}
}

type fakeConn struct {
	net.Conn
	addr net.Addr
}

func (c fakeConn) RemoteAddr() net.Addr { return c.addr }
