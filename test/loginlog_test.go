package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestLoginRejectionLoggedOnce: a refused login is logged once, by the
// auth plugin with its reason, not a second time by frp.
func TestLoginRejectionLoggedOnce(t *testing.T) {
	k := newKeys(t)
	s := startServer(t, k, serverOpts{})
	other := newKeys(t) // a key the server does not trust
	c := startClient(t, s, clientOpts{tokenFile: writeToken(t, other.issue(t, "alpha", time.Hour)), routes: []string{"/=http://127.0.0.1:1"}, noWait: true})
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := s.metric(t, "tether_logins_rejected_total", "reason", "bad_signature") + s.metric(t, "tether_logins_rejected_total", "reason", "unknown_key"); n < 2 {
			return fmt.Errorf("%v logins refused", n)
		}
		return nil
	})
	c.stop()
	rejected := 0
	for _, l := range s.logLines() {
		if l["msg"] == "tunnel login rejected" {
			rejected++
		}
	}
	if rejected < 2 {
		t.Errorf("%d \"tunnel login rejected\" lines for at least 2 refused logins", rejected)
	}
	if strings.Contains(s.Output(), "register control error") {
		t.Errorf("frp logged the refused login too (\"register control error\")")
	}
}
