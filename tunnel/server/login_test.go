package server

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
)

// A login whose connection died on the way, before the gate noticed, does
// not end the tunnel's working session, though it names the working
// session's run ID: the new session is checked before it replaces the old
// one.
func TestLoginOnADeadConnectionKeepsTheWorkingSession(t *testing.T) {
	s := startServer(t)
	s.startClient(t, "alpha", backend(t, "alpha").URL)
	working, ok := s.sessions.lookup("alpha")
	if !ok {
		t.Fatal("tunnel alpha not registered")
	}

	// A session as the gate holds it between the login's arrival and the
	// auth plugin's call, whose client has just gone away.
	dead, far := pipeSession(t)
	s.sessions.add(dead)
	t.Cleanup(func() { s.sessions.leave(dead) })
	routes := `["/=http://127.0.0.1:1"]`
	dead.startLogin("tether test", &routes)
	_ = far.Close()
	testutil.WaitFor(t, 5*time.Second, func() error {
		if !dead.mux.IsClosed() {
			return errors.New("the session has not seen its connection end")
		}
		return nil
	})

	claims, rej := auth.VerifyLoginToken(s.verifier, map[string]string{auth.TokenMetaKey: s.keys.token(t, "alpha", time.Hour)})
	if rej != nil {
		t.Fatal(rej)
	}
	err := (&serving{Server: s.Server}).Login(dead.id, claims, working.RunID())
	if rej, ok := errors.AsType[*auth.RejectError](err); !ok || rej.Reason != auth.ReasonSession {
		t.Fatalf("login on a dead connection: got %v, want a session rejection", err)
	}
	if cur, ok := s.sessions.lookup("alpha"); !ok || cur != working {
		t.Fatal("the login on a dead connection replaced the working session")
	}
	if reason := working.CloseReason(); reason != "" {
		t.Fatalf("the working session was closed: %s", reason)
	}
	if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
		t.Fatalf("tunnel alpha after the dead login: %d %s", code, body)
	}
}
