package gate

import (
	"errors"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
)

// A login whose connection died on the way, before the gate noticed, does
// not bind its session, though it names the run ID of a session that
// works: the host refuses the login, and the working session is not
// replaced.
func TestBindRefusesADeadConnection(t *testing.T) {
	dead, far := pipeSession(t)
	routes := `["/=http://127.0.0.1:1"]`
	dead.startLogin("tether test", &routes)
	_ = far.Close()
	testutil.WaitFor(t, 5*time.Second, func() error {
		if !dead.mux.IsClosed() {
			return errors.New("the session has not seen its connection end")
		}
		return nil
	})
	if err := dead.Bind(&auth.Claims{Tunnel: "alpha"}, "alpha.run", false); !errors.Is(err, ErrClosed) {
		t.Fatalf("Bind on a dead connection: %v, want %v", err, ErrClosed)
	}
	if name := dead.Tunnel(); name != "" {
		t.Fatalf("the dead session is tunnel %q's, want no tunnel's", name)
	}
}
