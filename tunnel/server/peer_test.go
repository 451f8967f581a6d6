package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// deadHolder is a registry whose cache still lists a replica that died for
// every tunnel, as a Redis registry does until the dead replica's entries
// expire.
type deadHolder struct {
	*registry.Memory
	dead registry.Holder
}

func (r deadHolder) Holders(string) []registry.Holder { return []registry.Holder{r.dead} }

// TestForwardToDeadHolderWaitsForReconnect: when the only replica the
// registry lists for a tunnel cannot be connected to (it died, and its
// entries have not expired yet), a request waits for the tunnel's client to
// reconnect, as it does for a tunnel nobody holds, instead of failing at
// once; when nobody comes, it gets 502 replica_unreachable after that wait.
func TestForwardToDeadHolderWaitsForReconnect(t *testing.T) {
	reg := deadHolder{
		Memory: registry.NewMemory("self", ""),
		dead:   registry.Holder{Replica: "dead", Addr: testutil.ClosedAddr(t), Epoch: 1},
	}
	s := startServerWith(t, serverSetup{keys: newKeys(t), log: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), opts: []Option{WithRegistry(reg)}})
	unreachable := func() float64 { return promtest.ToFloat64(s.metrics.forwarded.WithLabelValues("unreachable")) }

	start := time.Now()
	code, body, h := s.get(t, "alpha", "/")
	took := time.Since(start)
	if code != http.StatusBadGateway || h.Get("X-Tether-Error") != "replica_unreachable" {
		t.Errorf("nobody reconnects: got %d %s %q, want 502 replica_unreachable", code, h.Get("X-Tether-Error"), body)
	}
	if took < tunnelWait {
		t.Errorf("nobody reconnects: answered after %v, want it to wait %v for the client first", took, tunnelWait)
	}

	// The client reconnects here while a request waits.
	before := unreachable()
	type answer struct {
		code int
		body string
	}
	got := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, s.entry+"/waiting", nil)
		req.Host = "alpha." + testDomain
		res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			got <- answer{body: err.Error()}
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		got <- answer{code: res.StatusCode, body: res.Header.Get("X-Tether-Error") + " " + string(b)}
	}()
	testutil.WaitFor(t, 5*time.Second, func() error {
		if unreachable() <= before {
			return fmt.Errorf("the request has not tried the dead holder yet")
		}
		return nil
	})
	s.startClient(t, "alpha", backend(t, "alpha").URL)
	a := <-got
	if a.code != http.StatusOK || !strings.Contains(a.body, "alpha /waiting") {
		t.Errorf("client reconnected during the wait: got %d %q, want 200 from its backend", a.code, a.body)
	}
}
