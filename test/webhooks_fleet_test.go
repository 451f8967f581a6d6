package test

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestWebhooksFromTwoReplicasDeliveredOnAThird: three replicas on Redis;
// while the tunnel is down, two replicas accept its webhooks in turn; its
// client then logs in to the third, which delivers every one of them, in
// the order they were stored, each once.
func TestWebhooksFromTwoReplicasDeliveredOnAThird(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3)
	var in inbox
	events := in.start(t)
	token := writeToken(t, f.keys.issue(t, "acme", time.Hour))
	routes := []string{"/webhooks=" + events.url() + "/"}
	knownThenDown(t, f.replica(0).server, clientOpts{server: f.replica(0).tunnelAddr, tokenFile: token, routes: routes})
	f.waitGone(t, "acme")

	marker := randomMarker()
	hooks := bufferWaves(t, "acme", marker, 6, 2, func(i int) *server { return f.replica(i % 2).server })
	last := f.replica(2)
	startClient(t, last.server, clientOpts{server: last.tunnelAddr, tokenFile: token, routes: routes})
	in.waitCount(t, len(hooks))
	last.waitDrained(t, "acme")
	in.checkExactlyOnce(t, hooks)
}

// waitGone waits until no replica of the fleet lists a session of tunnel.
func (f *fleet) waitGone(t testing.TB, tunnel string) {
	t.Helper()
	testutil.WaitFor(t, 15*time.Second, func() error {
		for _, i := range f.live() {
			fl, err := f.fleetView(i)
			if err != nil {
				return err
			}
			if len(fl.Tunnels[tunnel]) > 0 {
				return fmt.Errorf("replica %d's fleet view still lists %s: %+v", i, tunnel, fl.Tunnels[tunnel])
			}
		}
		return nil
	})
}

// TestWebhooksDelivererKilledMidQueue: thirty webhooks wait for a tunnel
// whose client comes back through the balancer. The replica delivering
// them is killed (-9) while the tenth is at the upstream; another replica
// takes the queue over and delivers the rest, in order. Only the one in
// flight may arrive twice.
func TestWebhooksDelivererKilledMidQueue(t *testing.T) {
	t.Parallel()
	const n, held = 30, 9
	f := newFleet(t, 3)
	inFlight, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	in := &inbox{answer: func(r *http.Request, i int) int {
		if i == held {
			close(inFlight)
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		return http.StatusOK
	}}
	events := in.start(t)
	t.Cleanup(letGo) // before the backend closes: it waits for its handlers
	token := writeToken(t, f.keys.issue(t, "acme", time.Hour))
	routes := []string{"/webhooks=" + events.url() + "/"}
	knownThenDown(t, f.replica(0).server, clientOpts{server: f.replica(0).tunnelAddr, tokenFile: token, routes: routes})
	f.waitGone(t, "acme")

	marker := randomMarker()
	hooks := bufferWaves(t, "acme", marker, n, 10, func(i int) *server { return f.replica(i % 3).server })
	startClient(t, f.replica(0).server, clientOpts{server: f.lb.addr(), tokenFile: token, routes: routes})
	select {
	case <-inFlight:
	case <-time.After(deliveryWait):
		t.Fatalf("the delivery of webhook %d did not reach the upstream within %v; %d arrived", held, deliveryWait, len(in.list()))
	}

	// The deliverer is the replica that counts the held ones before it
	// delivered: exactly one does.
	deliverer := -1
	for i := range f.size() {
		switch d := f.replica(i).metric(t, "tether_buffer_requests_total", "outcome", "delivered"); d {
		case held:
			if deliverer >= 0 {
				t.Fatalf("replicas %d and %d both delivered %d webhooks", deliverer, i, held)
			}
			deliverer = i
		case 0:
		default:
			t.Fatalf("replica %d delivered %v webhooks while the %d-th is in flight", i, d, held+1)
		}
	}
	if deliverer < 0 {
		t.Fatalf("no replica counts %d webhooks delivered while the next is in flight", held)
	}
	killed := time.Now()
	f.replica(deliverer).kill()
	letGo()

	in.waitCount(t, n)
	other := f.replica((deliverer + 1) % 3)
	other.waitDrained(t, "acme")
	t.Logf("the queue was drained %v after the deliverer was killed", time.Since(killed).Round(time.Millisecond))

	got := in.ids()
	want := hookIDs(hooks)
	withDup := slices.Insert(slices.Clone(want), held, want[held])
	if !slices.Equal(got, want) && !slices.Equal(got, withDup) {
		t.Fatalf("deliveries %v;\nwant %v,\nthe one in flight (%s) at most twice", got, want, want[held])
	}
	byID := map[string]ghHook{}
	for _, h := range hooks {
		byID[h.id] = h
	}
	for _, a := range in.list() {
		a.check(t, byID[a.id()])
	}
	var rest float64
	for _, i := range f.live() {
		rest += f.replica(i).metric(t, "tether_buffer_requests_total", "outcome", "delivered")
	}
	if rest != n-held {
		t.Errorf("the live replicas count %v webhooks delivered; want the %d the killed one left", rest, n-held)
	}
}

// TestWebhooksUpstreamRefusedThroughAnotherReplica: a webhook reaches a
// replica that does not serve its tunnel, which forwards it to the one
// that does; there the tunnel's client finds its upstream refusing
// connections. The serving replica stores it (the replicas share the
// store) and the caller gets the 202 through the replica it reached; the
// webhook is delivered once the upstream listens.
func TestWebhooksUpstreamRefusedThroughAnotherReplica(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	port := freePort(t)
	serving := f.replica(1)
	startClient(t, serving.server, clientOpts{server: serving.tunnelAddr, tokenFile: writeToken(t, f.keys.issue(t, "acme", time.Hour)),
		routes: []string{fmt.Sprintf("/webhooks=http://127.0.0.1:%d/", port)}})
	testutil.WaitFor(t, 15*time.Second, func() error {
		fl, err := f.fleetView(0)
		if err == nil && len(fl.Tunnels["acme"]) == 0 {
			err = fmt.Errorf("replica 0 does not know that replica 1 serves acme yet")
		}
		return err
	})

	h := f.replica(0).buffer(t, "acme", newHook(randomMarker(), 0))
	var in inbox
	in.startOn(t, port)
	in.waitCount(t, 1)
	serving.waitDrained(t, "acme")
	in.checkExactlyOnce(t, []ghHook{h})
}
