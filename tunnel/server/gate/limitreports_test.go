package gate

import (
	"strings"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
)

// A client that goes over one of the gate's limits loses its connection;
// the observer hears which limit, and nothing else; and the host hears
// once that the session ended.
func TestLimitsCloseTheConnectionAndAreReported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		config     func(*Config)
		overLimit  func(t *testing.T, g *hostGate, c *rawClient)
		limit      string
		wantReason string // the session's close reason starts with it
	}{
		{
			name:   "no login in time",
			config: func(c *Config) { c.LoginTimeout = time.Second },
			overLimit: func(t *testing.T, _ *hostGate, c *rawClient) {
				if _, err := c.mux.OpenStream(); err != nil { // and nothing on it
					t.Fatal(err)
				}
			},
			limit:      LimitNoLogin,
			wantReason: "no login within 500ms of the handshake",
		},
		{
			name:   "login not verified in time",
			config: func(c *Config) { c.LoginTimeout = time.Second },
			overLimit: func(t *testing.T, g *hostGate, c *rawClient) {
				c.open(v1Encode(t, &msg.Login{Version: "0.71.0", Metas: map[string]string{auth.TokenMetaKey: "alpha"}}))
				g.host.next(t) // and never bound
			},
			limit:      LimitLoginTimeout,
			wantReason: "no successful login within 1s",
		},
		{
			name: "a second stream before login",
			overLimit: func(t *testing.T, _ *hostGate, c *rawClient) {
				if _, err := c.mux.OpenStream(); err != nil {
					t.Fatal(err)
				}
				_, _ = c.mux.OpenStream() // may see the session closed
			},
			limit:      LimitStreamBeforeLogin,
			wantReason: "opened a second stream before its login was verified",
		},
		{
			name: "more than the login budget before login",
			overLimit: func(t *testing.T, _ *hostGate, c *rawClient) {
				c.open(make([]byte, LoginBudget+1))
			},
			limit:      LimitLoginBudget,
			wantReason: "sent more than 32768 bytes before logging in",
		},
		{
			name: "too many streams",
			overLimit: func(t *testing.T, g *hostGate, c *rawClient) {
				g.logIn(t, c, "alpha", "alpha.r1", true) // its control stream is one
				for range MaxClientStreams {
					if _, err := c.mux.OpenStream(); err != nil {
						break // the last may find the session closed
					}
				}
			},
			limit:      LimitStreams,
			wantReason: "opened more than 256 streams at once",
		},
		{
			name: "pings",
			overLimit: func(t *testing.T, _ *hostGate, c *rawClient) {
				for range 10 * PingBurst {
					if _, err := c.mux.Ping(); err != nil {
						break // closed
					}
				}
			},
			limit:      LimitPings,
			wantReason: "pinged more than 32 times at once",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := serveWithHost(t, tc.config)
			c := dialRawFrom(t, g.addr, "127.0.0.1")
			tc.overLimit(t, g, c)

			waitClosed(t, c.mux.CloseChan(), "the client's connection")
			sess := g.host.waitOneEnded(t)
			if got := sess.CloseReason(); !strings.HasPrefix(got, tc.wantReason) {
				t.Errorf("close reason %q, want %q", got, tc.wantReason)
			}
			g.stop()
			if r, want := g.obs.reports(), "limited "+tc.limit; len(r) != 1 || r[want] != 1 {
				t.Errorf("the observer was told %v, want %q once", r, want)
			}
			if n := g.host.endedTotal(); n != 1 {
				t.Errorf("the host heard of %d sessions' end, want 1", n)
			}
		})
	}
}

// A connection over the anonymous cap of its address is closed at accept,
// before TLS; the observer hears why, and the host never hears of it.
func TestAnonymousCapRefusesBeforeTheHostHearsOfIt(t *testing.T) {
	g := serveWithHost(t, func(c *Config) { c.MaxAnonymousPerIP = 1 })
	held := testutil.DialFrom(t, g.addr, "127.0.0.9") // holds the address's one place
	waitCount(t, "anonymous connections", g.Anonymous, 1)
	if err := testutil.ClosedByServer(testutil.DialRefusable(t, g.addr, "127.0.0.9"), 5*time.Second); err != nil {
		t.Fatalf("a second connection from the address: %v; want it closed at once", err)
	}
	if r, want := g.obs.reports(), "refused "+RefusedAnonymousPerIP; len(r) != 1 || r[want] != 1 {
		t.Errorf("the observer was told %v, want %q once", r, want)
	}
	other := dialRawFrom(t, g.addr, "127.0.0.10") // another address gets in
	waitCount(t, "anonymous connections", g.Anonymous, 2)
	_ = held.Close()
	_ = other.mux.Close()
	g.stop()
	if n := g.host.endedTotal(); n != 0 {
		t.Errorf("the host heard of %d sessions' end, want none: no session was made", n)
	}
	g.host.noneHandedOver(t, "connections that sent nothing")
}
