package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/server/buffer"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// offer stores req through r's Offer, without a network (for bubbles),
// and returns its ID.
func offer(t testing.TB, r *replica, req *http.Request) string {
	t.Helper()
	req.RequestURI = req.URL.RequestURI()
	rec := httptest.NewRecorder()
	tunnelDownEntry(r.Forwarder).ServeHTTP(rec, req)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("offer %s: got %d %s, want 202", req.URL, rec.Code, rec.Body)
	}
	return rec.Header().Get(BufferedHeader)
}

// slack is what the store's writes add to a wait in a bubble.
const slack = 10 * time.Millisecond

// inBubble advances a bubble's fake clock, a millisecond at a time, until
// cond holds; it fails the test if limit passes first.
func inBubble(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", limit)
		}
	}
}

// TestRetryWithBackoff: an attempt the upstream or tether's way to it
// failed is retried after a backoff that doubles from Config.RetryFirst,
// jittered, holding back the newer requests; X-Tether-Attempt counts the
// tries that reached the client; a listing shows the last error and the
// next attempt meanwhile.
func TestRetryWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newReplica(t, registry.Backing{Store: openStore(t, t.TempDir())}, Config{}, nil, nil, "acme")
		first := offer(t, r, githubHook(t, "", "acme", 0))
		second := offer(t, r, githubHook(t, "", "acme", 1))
		answers := []Answer{
			{Status: http.StatusBadGateway, Code: proxy.CodeUpstreamUnreachable}, // reached the client
			{Status: http.StatusInternalServerError},                             // the upstream's
			{Status: http.StatusServiceUnavailable, Code: "tunnel_busy"},         // did not reach
			{Status: http.StatusOK},
		}
		var calls atomic.Int32
		r.sender.setAnswer(func(_ context.Context, sr seenRequest) (Answer, error) {
			if sr.id() != first {
				return Answer{Status: http.StatusOK}, nil
			}
			return answers[calls.Add(1)-1], nil
		})
		r.sender.serve("acme", true)
		r.Kick("acme") // before Run: kept until it runs
		r.run(t)

		// The store's writes wait a millisecond for company (bbolt's
		// Batch), so the fake clock moves while they do.
		var list []buffer.Entry
		inBubble(t, time.Second, func() bool {
			var err error
			list, err = r.buf.List(t.Context(), "acme")
			return err == nil && len(list) > 0 && list[0].Attempts > 0
		})
		failedAt := r.up.deliveries()[0].at
		if len(list) != 2 || list[0].Attempts != 1 || list[0].LastError != "tether answered 502 Bad Gateway, upstream_unreachable" ||
			list[0].NextAttemptAt.Before(failedAt.Add(DefaultRetryFirst/2)) || list[0].NextAttemptAt.After(failedAt.Add(DefaultRetryFirst+slack)) {
			t.Errorf("after a failed attempt at %v: listing %+v, want attempts 1, the error and the next attempt 0.5-1s later", failedAt, list)
		}

		time.Sleep(time.Minute)
		synctest.Wait()
		got := r.up.deliveries()
		if want := []string{first, first, first, first, second}; !slices.Equal(ids(got), want) {
			t.Fatalf("delivered %q, want %q", ids(got), want)
		}
		var attempts []string
		for _, d := range got {
			attempts = append(attempts, d.attempt())
		}
		if want := []string{"1", "2", "3", "3", "1"}; !slices.Equal(attempts, want) {
			t.Errorf("X-Tether-Attempt %q, want %q", attempts, want)
		}
		for k := 1; k < 4; k++ {
			gap, base := got[k].at.Sub(got[k-1].at), DefaultRetryFirst<<(k-1)
			if gap < base/2 || gap > base+slack {
				t.Errorf("retry %d came %v after the failure, want %v to %v", k, gap, base/2, base)
			}
		}
		if got[4].at.Sub(got[3].at) > slack {
			t.Errorf("the next request waited %v after the retried one was delivered", got[4].at.Sub(got[3].at))
		}
		if all, err := r.buf.All(t.Context()); err != nil || len(all) != 0 {
			t.Errorf("left in the store: %v %v", all, err)
		}
	})
}

// TestRetriedUntilExpired: a request whose upstream keeps failing is
// retried, the waits capped at Config.RetryMax, until the retention ends;
// then it is dropped and counted as expired.
func TestRetriedUntilExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Buffer: buffer.Config{Retention: time.Hour}, RetryMax: 2 * time.Minute}
		r := newReplica(t, registry.Backing{Store: openStore(t, t.TempDir())}, cfg, nil, nil, "acme")
		offer(t, r, githubHook(t, "", "acme", 0))
		r.sender.setAnswer(func(context.Context, seenRequest) (Answer, error) {
			return Answer{Status: http.StatusServiceUnavailable}, nil
		})
		r.sender.serve("acme", true)
		r.run(t)
		r.Kick("acme")
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		got := r.up.deliveries()
		for k := 1; k < len(got); k++ {
			if gap := got[k].at.Sub(got[k-1].at); gap > cfg.RetryMax {
				t.Errorf("retry %d came %v after the failure, want at most %v", k, gap, cfg.RetryMax)
			}
		}
		if len(got) < 30 || got[len(got)-1].at.Sub(got[0].at) > time.Hour {
			t.Errorf("%d attempts, the last %v after the first; want retries every 1-2 minutes within the hour",
				len(got), got[len(got)-1].at.Sub(got[0].at))
		}
		if c := r.buf.Counts(); c.Expired != 1 || c.Delivered != 0 {
			t.Errorf("counts %+v, want 1 expired", c)
		}
		if all, err := r.buf.All(t.Context()); err != nil || len(all) != 0 {
			t.Errorf("left in the store: %v %v", all, err)
		}
	})
}

// TestTwoReplicasDeliverOnce: requests accepted by two replicas are each
// delivered once, in the order they were stored, when both serve the
// tunnel and both try to deliver.
func TestTwoReplicasDeliverOnce(t *testing.T) {
	url := testutil.StartRedis(t).URL()
	cfg := Config{Buffer: buffer.Config{LeaseTTL: 500 * time.Millisecond}, SweepInterval: 50 * time.Millisecond}
	up := &upstream{}
	a := newReplica(t, registry.Backing{Redis: redisConn(t, url, "a")}, cfg, nil, up, "acme")
	b := newReplica(t, registry.Backing{Redis: redisConn(t, url, "b")}, cfg, nil, up, "acme")
	baseA, baseB := testEntry(t, a.Forwarder), testEntry(t, b.Forwarder)
	var accepted []string
	for n := range 20 {
		base := baseA
		if n%2 == 1 {
			base = baseB
		}
		status, id, _, body := post(t, githubHook(t, base, "acme", n))
		if status != http.StatusAccepted {
			t.Fatalf("webhook %d: got %d %s", n, status, body)
		}
		accepted = append(accepted, id)
	}
	for _, r := range []*replica{a, b} {
		r.sender.serve("acme", true)
		r.run(t)
		r.Kick("acme")
	}
	up.waitDeliveries(t, 20)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if all, err := a.buf.All(t.Context()); err != nil || len(all) != 0 {
			return fmt.Errorf("left in the store: %v %v", all, err)
		}
		return nil
	})
	if got := up.deliveries(); !slices.Equal(ids(got), accepted) {
		t.Errorf("delivered %q, want each of %q once, in that order", ids(got), accepted)
	}
}

// TestTakeoverWhenTheDelivererDies: when the replica delivering a queue
// dies mid-queue (it can no longer reach the store, so its lease
// expires), another replica that serves the tunnel delivers the rest: the
// request in flight twice, every other once, in order. A webhook that
// comes meanwhile is answered at once and delivered after them.
func TestTakeoverWhenTheDelivererDies(t *testing.T) {
	url := testutil.StartRedis(t).URL()
	cfg := Config{Buffer: buffer.Config{LeaseTTL: 300 * time.Millisecond}, SweepInterval: 50 * time.Millisecond}
	up := &upstream{}
	a := newReplica(t, registry.Backing{Redis: redisConn(t, url, "a")}, cfg, nil, up, "acme")
	b := newReplica(t, registry.Backing{Redis: redisConn(t, url, "b")}, cfg, nil, up, "acme")
	base := testEntry(t, a.Forwarder)
	var accepted []string
	for n := range 10 {
		_, id, _, _ := post(t, githubHook(t, base, "acme", n))
		accepted = append(accepted, id)
	}
	inFlight := make(chan struct{})
	a.sender.setAnswer(func(ctx context.Context, sr seenRequest) (Answer, error) {
		if sr.id() != accepted[3] {
			return Answer{Status: http.StatusOK}, nil
		}
		close(inFlight)
		<-ctx.Done() // stuck until the replica gives up
		return Answer{}, ctx.Err()
	})
	a.sender.serve("acme", true)
	stopA := a.run(t)
	a.Kick("acme")
	<-inFlight

	// Normal traffic is not held behind the queue.
	status, late, _, body := post(t, githubHook(t, base, "acme", 10))
	if status != http.StatusAccepted {
		t.Fatalf("a webhook while the queue is delivered: got %d %s, want 202", status, body)
	}
	// The replica loses the store, as a dead one would: it can renew its
	// lease no more, nor give it back.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b.sender.serve("acme", true)
	b.run(t)
	b.Kick("acme")
	got := up.waitDeliveries(t, 12)
	want := append(slices.Clone(accepted[:4]), accepted[3:]...)
	if want = append(want, late); !slices.Equal(ids(got), want) {
		t.Errorf("delivered %q, want %q", ids(got), want)
	}
	stopA()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if all, err := b.buf.All(t.Context()); err != nil || len(all) != 0 {
			return fmt.Errorf("left in the store: %v %v", all, err)
		}
		return nil
	})
	if got := up.deliveries(); len(got) != 12 {
		t.Errorf("%d deliveries, want 12", len(got))
	}
}

// TestStopGivesTheLeaseBack: a replica that stops while a delivery is in
// flight returns from Run once the delivery gave up, leaves the request
// queued, and gives its lease back, so that another replica delivers at
// once rather than after the lease TTL.
func TestStopGivesTheLeaseBack(t *testing.T) {
	url := testutil.StartRedis(t).URL()
	cfg := Config{Buffer: buffer.Config{LeaseTTL: time.Hour}, SweepInterval: time.Hour}
	up := &upstream{}
	a := newReplica(t, registry.Backing{Redis: redisConn(t, url, "a")}, cfg, nil, up, "acme")
	b := newReplica(t, registry.Backing{Redis: redisConn(t, url, "b")}, cfg, nil, up, "acme")
	id := offer(t, a, githubHook(t, "", "acme", 0))
	inFlight := make(chan struct{})
	a.sender.setAnswer(func(ctx context.Context, _ seenRequest) (Answer, error) {
		close(inFlight)
		<-ctx.Done()
		return Answer{}, ctx.Err()
	})
	a.sender.serve("acme", true)
	stopA := a.run(t)
	a.Kick("acme")
	<-inFlight
	stopA()
	list, err := b.buf.List(t.Context(), "acme")
	if err != nil || len(list) != 1 || list[0].ID != id || list[0].Attempts != 0 {
		t.Fatalf("after the stop: %+v %v, want %s still queued", list, err, id)
	}
	b.sender.serve("acme", true)
	b.run(t)
	b.Kick("acme")
	if got := up.waitDeliveries(t, 2); !slices.Equal(ids(got), []string{id, id}) {
		t.Errorf("delivered %q, want %s twice", ids(got), id)
	}
}

// TestDeliveriesBounded: at most Config.MaxDeliveries tunnels are
// delivered at once; the others wait their turn and are delivered too.
func TestDeliveriesBounded(t *testing.T) {
	const tunnels, limit = 6, 2
	var names []string
	for i := range tunnels {
		names = append(names, fmt.Sprintf("t%d", i))
	}
	r := newReplica(t, registry.Backing{Store: openStore(t, t.TempDir())}, Config{MaxDeliveries: limit}, nil, nil, names...)
	for _, name := range names {
		offer(t, r, githubHook(t, "", name, 0))
		r.sender.serve(name, true)
	}
	var (
		mu        sync.Mutex
		now, most int
		proceed   = make(chan struct{})
		waiting   = make(chan struct{}, tunnels)
	)
	r.sender.setAnswer(func(ctx context.Context, _ seenRequest) (Answer, error) {
		mu.Lock()
		now++
		most = max(most, now)
		mu.Unlock()
		defer func() {
			mu.Lock()
			now--
			mu.Unlock()
		}()
		waiting <- struct{}{}
		// A Sender returns when the delivery's ctx ends: so does this one,
		// so that a failing test stops rather than hangs.
		select {
		case <-proceed:
			return Answer{Status: http.StatusOK}, nil
		case <-ctx.Done():
			return Answer{}, ctx.Err()
		}
	})
	r.run(t)
	for _, name := range names {
		r.Kick(name)
	}
	<-waiting
	<-waiting
	// The other tunnels wait their turn.
	testutil.WaitFor(t, 10*time.Second, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.kicked) != tunnels-limit {
			return fmt.Errorf("%d tunnels wait for a delivery slot, want %d", len(r.kicked), tunnels-limit)
		}
		return nil
	})
	mu.Lock()
	if now != limit {
		t.Errorf("%d deliveries at once, want %d", now, limit)
	}
	mu.Unlock()
	close(proceed)
	r.up.waitDeliveries(t, tunnels)
	mu.Lock()
	defer mu.Unlock()
	if most != limit {
		t.Errorf("at most %d deliveries at once, want %d", most, limit)
	}
}

// TestNotServedHere: a replica that does not serve the tunnel, or stops
// serving it, does not deliver; the request stays queued with no attempt
// counted.
func TestNotServedHere(t *testing.T) {
	r := newReplica(t, registry.Backing{Store: openStore(t, t.TempDir())}, Config{}, nil, nil, "acme")
	id := offer(t, r, githubHook(t, "", "acme", 0))
	r.run(t)
	r.Kick("acme")
	r.sender.serve("acme", true)
	r.sender.setAnswer(func(context.Context, seenRequest) (Answer, error) { return Answer{}, ErrNotServed })
	r.Kick("acme")
	r.up.waitDeliveries(t, 1)
	testutil.WaitFor(t, 10*time.Second, func() error {
		l, err := r.buf.Acquire(t.Context(), "acme")
		if err != nil {
			return err
		}
		defer l.Release(t.Context())
		list, err := r.buf.List(t.Context(), "acme")
		if err != nil || len(list) != 1 || list[0].ID != id || list[0].Attempts != 0 || list[0].LastError != "" {
			return fmt.Errorf("listing %+v %v, want %s queued untouched", list, err, id)
		}
		return nil
	})
}

func TestJudge(t *testing.T) {
	tests := []struct {
		answer  Answer
		err     error
		verdict verdict
		reached bool
		reason  string
	}{
		{Answer{Status: 200}, nil, delivered, true, ""},
		{Answer{Status: 204}, nil, delivered, true, ""},
		{Answer{Status: 302}, nil, delivered, true, ""},
		{Answer{Status: 400}, nil, rejected, true, "the upstream answered 400 Bad Request"},
		{Answer{Status: 404}, nil, rejected, true, "the upstream answered 404 Not Found"},
		{Answer{Status: 500}, nil, retry, true, "the upstream answered 500 Internal Server Error"},
		{Answer{Status: 503}, nil, retry, true, "the upstream answered 503 Service Unavailable"},
		{Answer{Status: 502, Code: proxy.CodeUpstreamUnreachable}, nil, retry, true, "tether answered 502 Bad Gateway, upstream_unreachable"},
		{Answer{Status: 504, Code: proxy.CodeUpstreamTimeout}, nil, retry, true, "tether answered 504 Gateway Timeout, upstream_timeout"},
		{Answer{Status: 502, Code: proxy.CodeUpstreamFailed}, nil, retry, true, "tether answered 502 Bad Gateway, upstream_failed"},
		{Answer{Status: 404, Code: proxy.CodeNoRoute}, nil, rejected, false, "the tunnel's routes refuse it: tether answered 404 Not Found, no_route"},
		{Answer{Status: 429, Code: "caller_busy"}, nil, retry, false, "tether answered 429 Too Many Requests, caller_busy"},
		{Answer{Status: 503, Code: "tunnel_busy"}, nil, retry, false, "tether answered 503 Service Unavailable, tunnel_busy"},
		{Answer{}, ErrNotServed, notServed, false, ""},
		{Answer{}, fmt.Errorf("wrapped: %w", ErrNotServed), notServed, false, ""},
		{Answer{}, context.DeadlineExceeded, retry, true, "no answer within the delivery attempt timeout"},
		{Answer{}, errors.New("session closed"), retry, false, "not delivered: session closed"},
	}
	for _, tc := range tests {
		got := judge(tc.answer, tc.err)
		if want := (outcome{tc.verdict, tc.reached, tc.reason}); got != want {
			t.Errorf("judge(%+v, %v) = %+v, want %+v", tc.answer, tc.err, got, want)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := backoff{min: time.Second, max: 5 * time.Minute}
	for k := range 40 {
		d := b.next("a", 0)
		want := min(time.Second<<min(k, 20), 5*time.Minute)
		if d < want/2 || d > want {
			t.Errorf("failure %d: waits %v, want %v to %v", k+1, d, want/2, want)
		}
	}
	// Another request starts again, from the attempts it had.
	if d := b.next("b", 2); d < 2*time.Second || d > 4*time.Second {
		t.Errorf("a request with 2 attempts before: waits %v, want 2s to 4s", d)
	}
}
