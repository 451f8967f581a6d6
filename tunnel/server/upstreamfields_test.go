package server

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// A tunnel's service cannot speak for tether between replicas: a 503 of its
// own with X-Tether-Peer-Miss reaches the caller as the service's answer,
// without the field, and the forwarding replica does not take it for a
// replica that no longer serves the tunnel and send the request to the
// tunnel's other holder: a DELETE reaches the service once.
func TestUpstreamTetherFieldsStopAtTheRouter(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	b := startReplica(t, f, k, "b")
	c := startReplica(t, f, k, "c")
	var deletes atomic.Int32
	be := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
		}
		w.Header().Set(peerMissHeader, "1")
		w.Header().Set("X-Tether-Error", "tunnel_down")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	a.runClient(t, "alpha", a.tunnel, 1, be.URL)
	c.runClient(t, "alpha", c.tunnel, 1, be.URL)
	a.waitSessions(t, "alpha", 1)
	c.waitSessions(t, "alpha", 1)
	testutil.WaitFor(t, 5*time.Second, func() error {
		if len(b.registry.Holders("alpha")) != 2 {
			return errors.New("replica b does not see alpha's two holders")
		}
		return nil
	})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodDelete, b.entry+"/items/1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "alpha." + testDomain
	code, _, h := do(t, req)
	if code != http.StatusServiceUnavailable {
		t.Errorf("through replica b: %d, want the service's 503", code)
	}
	for k := range h {
		if strings.HasPrefix(k, "X-Tether-") {
			t.Errorf("the caller got the service's %s", k)
		}
	}
	if n := deletes.Load(); n != 1 {
		t.Errorf("the service received the DELETE %d times, want once", n)
	}
}
