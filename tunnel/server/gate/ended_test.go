package gate

import (
	"strings"
	"testing"
	"time"
)

// The host hears once that a session ended (Host.Ended), however it
// ended, and only once its connection is gone and the gate no longer lists
// it: the host may then let go of everything it keeps for the session.
func TestEndedOncePerSessionAfterItsConnectionIsGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config func(*Config)
		// end ends the session of client c, and returns it.
		end        func(t *testing.T, g *hostGate, c *rawClient) *Session
		wantReason string // the session's close reason starts with it
	}{
		{
			name: "the client left before login",
			end: func(t *testing.T, g *hostGate, c *rawClient) *Session {
				sess := g.anonymousSession(t, c)
				_ = c.mux.Close()
				return sess
			},
			wantReason: "connection lost: closed",
		},
		{
			name: "the client left after login",
			end: func(t *testing.T, g *hostGate, c *rawClient) *Session {
				sess, _, _ := g.logIn(t, c, "alpha", "alpha.r1", false)
				_ = c.mux.Close()
				return sess
			},
			wantReason: "connection lost: closed",
		},
		{
			name: "the host closed it",
			end: func(t *testing.T, g *hostGate, c *rawClient) *Session {
				sess, _, _ := g.logIn(t, c, "alpha", "alpha.r1", true)
				sess.Close("replaced by a newer login")
				sess.Close("replaced again")
				return sess
			},
			wantReason: "replaced by a newer login",
		},
		{
			name:   "the gate closed it at a limit",
			config: func(c *Config) { c.LoginTimeout = time.Second },
			end: func(t *testing.T, g *hostGate, c *rawClient) *Session {
				if _, err := c.mux.Ping(); err != nil {
					t.Fatal(err)
				}
				return g.host.waitOneEnded(t) // no login within half of it
			},
			wantReason: "no login within 500ms",
		},
		{
			name: "the gate shut down",
			end: func(t *testing.T, g *hostGate, c *rawClient) *Session {
				sess, _, _ := g.logIn(t, c, "alpha", "alpha.r1", false)
				g.CloseAll("server shutting down")
				return sess
			},
			wantReason: "server shutting down",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := serveWithHost(t, tc.config)
			c := dialRawFrom(t, g.addr, "127.0.0.1")
			sess := tc.end(t, g, c)

			call := g.host.waitEnded(t, sess)
			if !call.connGone {
				t.Error("the host heard of the end while the session's connection was still up")
			}
			if call.listed {
				t.Error("the host heard of the end while the gate still listed the session")
			}
			if call.phase != closed {
				t.Errorf("the session was %s when the host heard of its end, want %s", phaseName(call.phase), phaseName(closed))
			}
			if got := sess.CloseReason(); !strings.HasPrefix(got, tc.wantReason) {
				t.Errorf("close reason %q, want %q", got, tc.wantReason)
			}
			if sess.Alive() {
				t.Error("the session is alive after its end")
			}
			waitClosed(t, c.mux.CloseChan(), "the client's connection")

			g.stop() // every session closed, the gate done: no call may follow
			if n := len(g.host.endedCalls(sess)); n != 1 {
				t.Errorf("the host heard %d times that the session ended, want once", n)
			}
			if n := g.host.endedTotal(); n != 1 {
				t.Errorf("the host heard of %d sessions' end, want 1", n)
			}
		})
	}
}
