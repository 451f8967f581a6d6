package gate

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// evictAfter sets how long a client must have kept its anonymous
// connection waiting before the connection may be evicted.
func (g *testGate) evictAfter(d time.Duration) {
	g.anonymous.mu.Lock()
	defer g.anonymous.mu.Unlock()
	g.anonymous.silence = d
}

// Connections that have not logged in are capped per source address and
// in total, from TCP accept: a TLS slowloris counts, and one over a cap is
// closed before TLS. A quarter of the total is kept for addresses whose
// clients logged in. A login, or the end of the connection, frees the
// slot. (Nothing here is silent long enough to be evicted.)
func TestAnonymousConnectionsAreCappedBeforeTLS(t *testing.T) {
	const maxAnonymous, reserved = 8, 2
	g := startGate(t, func(c *Config) { c.MaxAnonymous, c.MaxAnonymousPerIP = maxAnonymous, 3 })
	g.evictAfter(time.Hour)
	waitAnonymous := func(want int) { t.Helper(); waitCount(t, "anonymous connections", g.Anonymous, want) }
	refusedAtOnce := func(t *testing.T, src string) {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		raw, err := d.DialContext(t.Context(), "tcp", g.addr)
		if err != nil {
			return // reset before connect returned
		}
		defer raw.Close()
		tc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // self-signed test server
		if err := tc.HandshakeContext(t.Context()); err == nil {
			t.Fatalf("a connection from %s over the cap completed TLS", src)
		}
	}

	var held []net.Conn
	for range 3 {
		held = append(held, testutil.DialFrom(t, g.addr, "127.0.0.2")) // TCP only: a TLS slowloris
	}
	waitAnonymous(3)
	refusedAtOnce(t, "127.0.0.2")
	if got := g.obs.get("refused", RefusedAnonymousPerIP); got != 1 {
		t.Errorf("connections refused for %s: %d, want 1", RefusedAnonymousPerIP, got)
	}

	// Other addresses get in, up to what unknown addresses may hold.
	other := dialRawFrom(t, g.addr, "127.0.0.3")
	testutil.DialFrom(t, g.addr, "127.0.0.3")
	testutil.DialFrom(t, g.addr, "127.0.0.4")
	waitAnonymous(maxAnonymous - reserved)
	refusedAtOnce(t, "127.0.0.5")
	if got := g.obs.get("refused", RefusedAnonymous); got != 1 {
		t.Errorf("connections refused for %s: %d, want 1", RefusedAnonymous, got)
	}

	// A login frees its slot, and makes its address known: it may use the
	// reserved slots, and an unknown one the slot the login freed.
	if resp, _ := other.login("alpha", ""); resp.Error != "" {
		t.Fatalf("login: %s", resp.Error)
	}
	waitAnonymous(maxAnonymous - reserved - 1)
	testutil.DialFrom(t, g.addr, "127.0.0.3")
	testutil.DialFrom(t, g.addr, "127.0.0.5")
	waitAnonymous(maxAnonymous - reserved + 1)
	refusedAtOnce(t, "127.0.0.6")
	if got := g.obs.get("refused", RefusedAnonymous); got != 2 {
		t.Errorf("connections refused for %s: %d, want 2", RefusedAnonymous, got)
	}

	// So does the end of a connection.
	for _, c := range held {
		_ = c.Close()
	}
	waitAnonymous(maxAnonymous - reserved - 2)
	for range 3 {
		dialRawFrom(t, g.addr, "127.0.0.2")
	}
	waitAnonymous(maxAnonymous - reserved + 1)
}

// Closing a client stream twice takes it off the count once.
func TestClientStreamCountsOnce(t *testing.T) {
	sess, _ := pipeSession(t)
	stream, err := sess.mux.OpenStream() // any stream will do
	if err != nil {
		t.Fatal(err)
	}
	sess.clientStreams.Add(1)
	sess.track(stream)
	cs := &clientStream{Stream: stream, sess: sess}
	before := sess.clientStreams.Load()
	_ = cs.Close()
	_ = cs.Close()
	if got := sess.clientStreams.Load(); got != before-1 {
		t.Errorf("open client streams went from %d to %d, want %d", before, got, before-1)
	}
}
