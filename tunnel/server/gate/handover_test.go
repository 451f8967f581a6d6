package gate

import (
	"encoding/hex"
	"testing"

	"github.com/fatedier/frp/pkg/msg"

	"github.com/tether-dev/tether/auth"
)

// A login reaches the host as the client sent it, byte for byte in either
// wire protocol, but stamped with the session's ID, which overwrites one
// the client forged: the auth plugin binds the session it names. What the
// client sends after the login follows it, and frp's answer reaches the
// client.
func TestLoginIsHandedOverStampedWithTheSessionID(t *testing.T) {
	for _, tc := range []struct {
		name   string
		encode func(*testing.T, msg.Message) []byte
	}{
		{"v1", func(t *testing.T, m msg.Message) []byte { return v1Encode(t, m) }},
		{"v2", func(t *testing.T, m msg.Message) []byte { return v2Encode(t, []byte(`{"hello":"from frpc"}`), m) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := serveWithHost(t)
			c := dialRawFrom(t, g.addr, "127.0.0.1")
			login := func(session string) *msg.Login {
				return &msg.Login{
					Version: "0.71.0", Hostname: "runtime-7", Os: "linux", Arch: "amd64", User: "u",
					PrivilegeKey: "key", Timestamp: 1700000000, RunID: "r1", PoolCount: 2,
					Metas: map[string]string{auth.TokenMetaKey: "alpha", auth.SessionMetaKey: session, "team": "payments"},
				}
			}
			const after = "what the client sends after its login"
			stream := c.open(append(tc.encode(t, login("forged-by-the-client")), after...))

			ho := g.host.next(t)
			id := ho.sess.ID()
			if b, err := hex.DecodeString(id); err != nil || len(b) != 16 {
				t.Errorf("session ID %q, want 128 bits in hex", id)
			}
			if sess, ok := g.Session(id); !ok || sess != ho.sess {
				t.Errorf("the session handed over is not the gate's session %s", id)
			}
			if ho.phase != loggingIn {
				t.Errorf("the session was %s when its login was handed over, want %s", phaseName(ho.phase), phaseName(loggingIn))
			}
			readExactly(t, "frp reads", ho.conn, append(tc.encode(t, login(id)), after...))
			if got := ho.sess.ClientVersion(); got != "frpc 0.71.0" {
				t.Errorf("client version %q, want %q", got, "frpc 0.71.0")
			}

			if err := msg.WriteMsg(ho.conn, &msg.LoginResp{Error: "token refused"}); err != nil {
				t.Fatal(err)
			}
			var resp msg.LoginResp
			if err := readAnswer(stream, &resp); err != nil || resp.Error != "token refused" {
				t.Errorf("the client read %+v, %v; want frp's answer", resp, err)
			}
			if r := g.obs.reports(); len(r) != 0 {
				t.Errorf("the observer was told %v, want nothing", r)
			}
		})
	}
}

// A second login on a logged-in session is refused, counted, and ends the
// session; it never reaches the host, so the session is never bound to
// another identity. Whether the accept loop is running (a stock frpc) or
// parked (a tether client) when it comes.
func TestSecondLoginNeverReachesTheHost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stock bool
	}{{"frpc", true}, {"tether client", false}} {
		t.Run(tc.name, func(t *testing.T) {
			g := serveWithHost(t)
			c := dialRawFrom(t, g.addr, "127.0.0.1")
			sess, _, _ := g.logIn(t, c, "alpha", "alpha.r1", tc.stock)

			second := c.open(v1Encode(t, &msg.Login{Version: "0.71.0", Metas: map[string]string{auth.TokenMetaKey: "beta"}}))
			waitRefused(t, second)
			g.host.waitEnded(t, sess)
			g.host.noneHandedOver(t, "a second login")
			if got := g.obs.get("stream", "second_login"); got != 1 {
				t.Errorf("streams refused as second_login: %d, want 1", got)
			}
			if got, want := sess.CloseReason(), "stream refused: second_login"; got != want {
				t.Errorf("close reason %q, want %q", got, want)
			}
			if name := sess.Tunnel(); name != "alpha" {
				t.Errorf("the session is tunnel %q's, want alpha's", name)
			}
			waitClosed(t, c.mux.CloseChan(), "the client's connection after a second login")
		})
	}
}

// A work connection reaches the host, wrapped by it (Host.WorkConn) and
// with what follows it, only from a logged-in session whose run ID it
// names. One naming another session's run ID, or sent before login, is
// refused and counted, never handed over, and ends its own session only.
func TestWorkConnReachesTheHostOnlyFromItsOwnSession(t *testing.T) {
	t.Run("its own run ID", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			v2   bool
		}{{"v1", false}, {"v2", true}} {
			t.Run(tc.name, func(t *testing.T) {
				g := serveWithHost(t)
				c := dialRawFrom(t, g.addr, "127.0.0.1")
				sess, _, _ := g.logIn(t, c, "alpha", "alpha.r1", true)
				work := &msg.NewWorkConn{RunID: "alpha.r1", PrivilegeKey: "key", Timestamp: 1700000000}
				encoded := v1Encode(t, work)
				if tc.v2 {
					encoded = v2Encode(t, nil, work)
				}
				const request = "GET / HTTP/1.1\r\nHost: alpha\r\n\r\n"
				stream := c.open(append(encoded, request...))

				ho := g.host.next(t)
				if ho.sess != sess {
					t.Fatalf("the work connection was handed over on session %s, want %s", ho.sess.ID(), sess.ID())
				}
				if got := g.host.workConnCalls(); len(got) != 1 || got[0] != tc.v2 {
					t.Errorf("WorkConn calls (v2 each): %v, want [%v]", got, tc.v2)
				}
				readExactly(t, "frp reads", ho.conn, append(encoded, request...))
				if err := msg.WriteMsg(ho.conn, &msg.StartWorkConn{ProxyName: "alpha.web"}); err != nil {
					t.Fatal(err)
				}
				var start msg.StartWorkConn
				if err := readAnswer(stream, &start); err != nil || start.ProxyName != "alpha.web" {
					t.Errorf("the client read %+v, %v; want frp's StartWorkConn", start, err)
				}
				if !sess.Alive() || sess.CloseReason() != "" {
					t.Errorf("the session closed (%q), want it serving", sess.CloseReason())
				}
				if r := g.obs.reports(); len(r) != 0 {
					t.Errorf("the observer was told %v, want nothing", r)
				}
			})
		}
	})

	t.Run("another session's run ID", func(t *testing.T) {
		g := serveWithHost(t)
		alpha, _, _ := g.logIn(t, dialRawFrom(t, g.addr, "127.0.0.1"), "alpha", "alpha.r1", true)
		c := dialRawFrom(t, g.addr, "127.0.0.1")
		beta, _, _ := g.logIn(t, c, "beta", "beta.r2", true)

		stream := c.open(v1Encode(t, &msg.NewWorkConn{RunID: alpha.RunID()}))
		waitRefused(t, stream)
		g.host.waitEnded(t, beta)
		g.host.noneHandedOver(t, "a work connection naming another session's run ID")
		if got := g.host.workConnCalls(); len(got) != 0 {
			t.Errorf("WorkConn was called %d times, want never", len(got))
		}
		if got := g.obs.get("stream", "foreign_work_conn"); got != 1 {
			t.Errorf("streams refused as foreign_work_conn: %d, want 1", got)
		}
		if !alpha.Alive() || alpha.CloseReason() != "" {
			t.Errorf("the session whose run ID was named closed (%q), want it untouched", alpha.CloseReason())
		}
	})

	t.Run("before login", func(t *testing.T) {
		g := serveWithHost(t)
		c := dialRawFrom(t, g.addr, "127.0.0.1")
		stream := c.open(v1Encode(t, &msg.NewWorkConn{RunID: "alpha.r1"}))
		waitRefused(t, stream)
		sess := g.host.waitOneEnded(t)
		g.host.noneHandedOver(t, "a work connection before login")
		if got := g.obs.get("stream", "foreign_work_conn"); got != 1 {
			t.Errorf("streams refused as foreign_work_conn: %d, want 1", got)
		}
		if got, want := sess.CloseReason(), "stream refused: foreign_work_conn"; got != want {
			t.Errorf("close reason %q, want %q", got, want)
		}
	})
}
