package test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// spreadWithin bounds how long after a rolling restart every tunnel's
// sessions are on two replicas again: a slot that shares a replica tries
// in rounds, the rounds at most 30 s apart, and a round of three tries
// behind a round-robin balancer reaches the other replica.
const spreadWithin = 3 * time.Minute

// TestHASessionsSpreadAfterRollingRestart: two replicas restart one after
// the other. While the second drains, every client's sessions move to the
// first, the only one that takes connections then, and their quick retries
// cannot reach another. Once the second is back, the slots that share a
// replica keep trying, with sessions opened beside the ones that serve,
// until every tunnel has its two sessions on two replicas: no tunnel is
// left with a single point of failure.
func TestHASessionsSpreadAfterRollingRestart(t *testing.T) {
	t.Parallel()
	const replicas, tunnels = 2, 4
	f := newFleet(t, replicas)
	var list []haTunnel
	for i := range tunnels {
		list = append(list, f.startTunnel(fmt.Sprintf("spread%d", i), fmt.Sprintf("backend-%d", i), f.lb.addr(), 2))
	}
	waitSessions(t, list, time.Now(), recoverIn)
	for i := range replicas {
		r := f.replica(i)
		termAt := time.Now()
		r.signal(syscall.SIGTERM)
		if code, ok := r.wait(stopTimeout); !ok || code != 0 {
			t.Fatalf("%s after SIGTERM: exited %v with code %d; want it to exit 0", r.id, ok, code)
		}
		f.restart(i)
		waitSessions(t, list, termAt, recoverIn)
	}
	rolled := time.Now()

	shared := map[string]bool{} // tunnels seen with both sessions on one replica
	testutil.WaitFor(t, spreadWithin, func() error {
		var apart []string
		for _, tu := range list {
			sessions, err := sessionReplicas(tu.client)
			if err != nil {
				return fmt.Errorf("client of %s: %w", tu.name, err)
			}
			ready := sessions["ready"]
			if len(ready) == 2 && ready[0] == ready[1] {
				shared[tu.name] = true
			}
			if len(ready) != 2 || ready[0] == ready[1] {
				apart = append(apart, fmt.Sprintf("%s has ready sessions on %v (all: %v)", tu.name, ready, sessions))
			}
		}
		if len(apart) > 0 {
			return errors.New(strings.Join(apart, "; "))
		}
		return nil
	})
	t.Logf("every tunnel has its two sessions on two replicas %v after the rolling restart; %d of %d were seen on one replica first",
		time.Since(rolled).Round(time.Millisecond), len(shared), tunnels)
	for _, tu := range list {
		if res, err := f.replica(0).get(tu.name, "/after-spread"); err != nil || res.code != http.StatusOK {
			t.Errorf("%s after spreading: %v %v", tu.name, res.code, err)
		}
	}
}

// sessionReplicas returns the replicas of a client's sessions by state,
// from its /status.
func sessionReplicas(c *client) (map[string][]string, error) {
	st, err := c.status()
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, s := range st.Sessions {
		out[s.State] = append(out[s.State], s.Replica)
	}
	return out, nil
}
