package gate

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"

	"github.com/tether-dev/tether/auth"
)

var phaseNames = [...]string{anonymous: "anonymous", loggingIn: "loggingIn", bound: "bound", closing: "closing", closed: "closed"}

func phaseName(p phase) string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", p)
}

// sessionAt is a session over a net.Pipe brought to p by the transitions
// that lead there: a login, Bind as alpha, Close ("first"), its end.
func sessionAt(t *testing.T, p phase) *Session {
	t.Helper()
	sess, _ := pipeSession(t)
	steps := []func(){
		func() { sess.startLogin("tether test", nil) },
		func() { _ = sess.Bind(&auth.Claims{Tunnel: "alpha"}, "alpha.r1", false) },
		func() { sess.Close("first") },
		func() { sess.ended() },
	}
	for _, step := range steps[:p] {
		step()
	}
	if got := phaseOf(sess); got != p {
		t.Fatalf("setting up: the session is %s, want %s", phaseName(got), phaseName(p))
	}
	return sess
}

// From every phase, every transition moves a session forward or leaves it
// where it is: one login per session, one Bind, and a closing or closed
// session is never bound; Close keeps the first reason.
func TestLifecyclePhasesOnlyMoveForward(t *testing.T) {
	all := []phase{anonymous, loggingIn, bound, closing, closed}
	for _, tc := range []struct {
		name string
		// do makes the transition, and says what it returned.
		do   func(*Session) string
		want [closed + 1]phase
		// says is what do returns, from each phase.
		says [closed + 1]string
	}{
		{
			name: "startLogin",
			do:   func(s *Session) string { return fmt.Sprint(s.startLogin("frpc 0.71.0", nil)) },
			want: [...]phase{loggingIn, loggingIn, bound, closing, closed},
			says: [...]string{"true", "false", "false", "false", "false"},
		},
		{
			name: "Bind",
			do: func(s *Session) string {
				return fmt.Sprint(s.Bind(&auth.Claims{Tunnel: "beta"}, "beta.r2", true))
			},
			want: [...]phase{anonymous, bound, bound, closing, closed},
			says: [...]string{ErrNoLogin.Error(), "<nil>", ErrBound.Error(), ErrClosed.Error(), ErrClosed.Error()},
		},
		{
			name: "Close",
			do:   func(s *Session) string { s.Close("second"); return s.CloseReason() },
			want: [...]phase{closing, closing, closing, closing, closed},
			says: [...]string{"second", "second", "second", "first", "first"},
		},
		{
			name: "ended",
			do:   func(s *Session) string { s.ended(); return "" },
			want: [...]phase{closed, closed, closed, closed, closed},
		},
	} {
		for _, from := range all {
			t.Run(tc.name+" from "+phaseName(from), func(t *testing.T) {
				sess := sessionAt(t, from)
				tunnelBefore := sess.Tunnel()
				says := tc.do(sess)
				got := phaseOf(sess)
				if got < from {
					t.Errorf("moved back from %s to %s", phaseName(from), phaseName(got))
				}
				if got != tc.want[from] {
					t.Errorf("now %s, want %s", phaseName(got), phaseName(tc.want[from]))
				}
				if says != tc.says[from] {
					t.Errorf("returned %q, want %q", says, tc.says[from])
				}
				if tunnelBefore != "" && sess.Tunnel() != tunnelBefore {
					t.Errorf("the session moved from tunnel %q to %q", tunnelBefore, sess.Tunnel())
				}
			})
		}
	}
}

// Through the gate, a session is anonymous until its login is handed over,
// logging in until the host binds it, bound until closed, and closed once
// the host hears it ended; a second Bind fails and keeps the first
// identity; Close keeps the first reason; OnEnd hooks run after the host
// heard of the end, and at once once it has.
func TestLifecycleThroughTheGate(t *testing.T) {
	g := serveWithHost(t)
	c := dialRawFrom(t, g.addr, "127.0.0.1")
	sess := g.anonymousSession(t, c)
	expect := func(want phase) {
		t.Helper()
		if got := phaseOf(sess); got != want {
			t.Fatalf("the session is %s, want %s", phaseName(got), phaseName(want))
		}
	}
	expect(anonymous)
	if err := sess.Bind(&auth.Claims{Tunnel: "alpha"}, "alpha.r1", true); !errors.Is(err, ErrNoLogin) {
		t.Fatalf("Bind before a login: %v, want %v", err, ErrNoLogin)
	}
	expect(anonymous)

	c.open(v1Encode(t, &msg.Login{Version: "0.71.0", Metas: map[string]string{auth.TokenMetaKey: "alpha"}}))
	ho := g.host.next(t)
	if ho.phase != loggingIn {
		t.Fatalf("the session was %s when its login was handed over, want %s", phaseName(ho.phase), phaseName(loggingIn))
	}
	if err := sess.Bind(&auth.Claims{Tunnel: "alpha"}, "alpha.r1", true); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	expect(bound)
	if err := sess.Bind(&auth.Claims{Tunnel: "beta"}, "beta.r2", true); !errors.Is(err, ErrBound) {
		t.Fatalf("a second Bind: %v, want %v", err, ErrBound)
	}
	if sess.Tunnel() != "alpha" || sess.RunID() != "alpha.r1" {
		t.Fatalf("after a second Bind: tunnel %q run ID %q, want alpha and alpha.r1", sess.Tunnel(), sess.RunID())
	}

	hookSaw := make(chan int, 1)
	sess.OnEnd(func() { hookSaw <- len(g.host.endedCalls(sess)) })
	sess.Close("token revoked")
	if got := phaseOf(sess); got < closing {
		t.Fatalf("after Close the session is %s, want closing or closed", phaseName(got))
	}
	sess.Close("drain")
	if err := sess.Bind(&auth.Claims{Tunnel: "alpha"}, "alpha.r1", true); !errors.Is(err, ErrClosed) {
		t.Errorf("Bind of a closed session: %v, want %v", err, ErrClosed)
	}
	call := g.host.waitEnded(t, sess)
	if call.phase != closed {
		t.Errorf("the session was %s when the host heard of its end, want %s", phaseName(call.phase), phaseName(closed))
	}
	select {
	case n := <-hookSaw:
		if n != 1 {
			t.Errorf("the OnEnd hook ran when the host had heard %d times of the end, want after it heard", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the OnEnd hook did not run within 10s of the end")
	}
	late := false
	sess.OnEnd(func() { late = true })
	if !late {
		t.Error("an OnEnd hook registered after the end did not run at once")
	}
	sess.Close("late")
	expect(closed)
	if got := sess.CloseReason(); got != "token revoked" {
		t.Errorf("close reason %q, want the first, %q", got, "token revoked")
	}
}
