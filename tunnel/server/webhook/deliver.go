package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/server/buffer"
)

// Kick asks for tunnel's queue to be delivered from this replica: call it
// when a session of the tunnel logs in here. It does not block; the
// delivery starts once Run runs and a delivery slot is free, if this
// replica still serves the tunnel and no other deliverer holds its lease.
func (f *Forwarder) Kick(tunnel string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.kicked[tunnel] = struct{}{}
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// worker delivers one tunnel's queue.
type worker struct {
	tunnel string
	// wake holds a kick the worker has not looked at yet: it drains it
	// before each look at the queue, so that a kick that comes later stays
	// visible, and the loop starts the worker again if it had ended.
	wake chan struct{}
}

// deliverLoop gives each kicked tunnel a worker, at most
// Config.MaxDeliveries at once, until ctx ends; then it waits for them.
func (f *Forwarder) deliverLoop(ctx context.Context) error {
	workers := map[string]*worker{}
	done := make(chan *worker)
	for {
		f.startKicked(ctx, workers, done)
		select {
		case <-ctx.Done():
			for range workers {
				<-done
			}
			return nil
		case <-f.kick:
		case w := <-done:
			delete(workers, w.tunnel)
			if len(w.wake) > 0 {
				f.Kick(w.tunnel)
			}
		}
	}
}

// startKicked wakes the worker of each kicked tunnel, or starts one while
// fewer than Config.MaxDeliveries run; the others stay kicked.
func (f *Forwarder) startKicked(ctx context.Context, workers map[string]*worker, done chan<- *worker) {
	if ctx.Err() != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for tunnel := range f.kicked {
		w := workers[tunnel]
		switch {
		case w != nil:
			w.poke()
		case len(workers) < f.cfg.MaxDeliveries:
			w = &worker{tunnel: tunnel, wake: make(chan struct{}, 1)}
			workers[tunnel] = w
			go f.runWorker(ctx, w, done)
		default:
			continue
		}
		delete(f.kicked, tunnel)
	}
}

func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// runWorker delivers w's queue, then tells the loop it ended.
func (f *Forwarder) runWorker(ctx context.Context, w *worker, done chan<- *worker) {
	f.deliverQueue(ctx, w)
	done <- w
}

// releaseTimeout bounds giving a lease back when a delivery ends.
const releaseTimeout = 2 * time.Second

// deliverQueue takes the tunnel's lease and delivers its queue, oldest
// first, one request at a time, until the queue is empty, the tunnel is
// not served here, the lease is lost or ctx ends.
func (f *Forwarder) deliverQueue(ctx context.Context, w *worker) {
	log := f.log.With(zap.String("tunnel", w.tunnel))
	if !f.sender.Serves(w.tunnel) {
		return
	}
	lease, err := f.buf.Acquire(ctx, w.tunnel)
	if err != nil {
		if !errors.Is(err, buffer.ErrLeased) && ctx.Err() == nil {
			log.Warn("could not deliver buffered requests; retrying later", zap.Error(err))
		}
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	kept := make(chan struct{})
	go f.keepLease(ctx, cancel, lease, log, kept)
	defer func() {
		cancel()
		<-kept
		rctx, rcancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer rcancel()
		if err := lease.Release(rctx); err != nil {
			log.Debug("could not give the delivery lease back; it expires", zap.Error(err))
		}
	}()

	b := backoff{min: f.cfg.RetryFirst, max: f.cfg.RetryMax}
	// storeWait spaces the tries while the store fails (Redis away), so
	// that an outage of hours is not a warning a second.
	storeWait := backoff{min: f.cfg.RetryFirst, max: f.cfg.RetryMax}
	for {
		select {
		case <-w.wake:
		default:
		}
		req, err := lease.Next(ctx)
		var notDue *buffer.NotDueError
		switch {
		case errors.Is(err, buffer.ErrEmpty):
			return
		case errors.As(err, &notDue):
			if !w.sleep(ctx, time.Until(notDue.At)) {
				return
			}
			continue
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			wait := storeWait.next("", 0)
			log.Warn("could not read the buffered requests; retrying", zap.Error(err), zap.Duration("retry_in", wait))
			if !w.sleep(ctx, wait) {
				return
			}
			continue
		}
		storeWait.reset()
		if time.Since(req.QueuedAt) > f.cfg.Buffer.Retention+time.Millisecond {
			// Its retention ended (the store's expiry counts in whole
			// milliseconds): drop it, and any other whose retention
			// ended, now rather than at the next expiry round.
			n, err := f.buf.Expire(ctx)
			if n > 0 {
				log.Info("dropped buffered requests older than the retention", zap.Int("requests", n), zap.Duration("retention", f.cfg.Buffer.Retention))
			}
			if err != nil && ctx.Err() == nil {
				wait := storeWait.next("", 0)
				log.Warn("could not drop buffered requests older than the retention; retrying", zap.Error(err), zap.Duration("retry_in", wait))
				if !w.sleep(ctx, wait) {
					return
				}
			}
			continue
		}
		if !f.attempt(ctx, lease, req, &b, log) {
			return
		}
	}
}

// keepLease renews the lease until ctx ends, and cancels the delivery
// when it is lost.
func (f *Forwarder) keepLease(ctx context.Context, cancel context.CancelFunc, lease *buffer.Lease, log *zap.Logger, kept chan<- struct{}) {
	defer close(kept)
	if err := lease.Keep(ctx); err != nil {
		log.Warn("lost the delivery lease: another replica delivers the queue", zap.Error(err))
		cancel()
	}
}

// sleep waits d, or until a kick or the end of ctx; it reports whether
// ctx is still alive.
func (w *worker) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-w.wake:
	case <-t.C:
	}
	return true
}

// attempt delivers req once and records the outcome under the lease; it
// reports whether to go on with the queue.
func (f *Forwarder) attempt(ctx context.Context, lease *buffer.Lease, req *buffer.Request, b *backoff, log *zap.Logger) bool {
	n := req.Attempts + 1
	actx, cancel := context.WithTimeout(ctx, f.cfg.AttemptTimeout)
	hr, err := deliveryRequest(actx, req, n)
	var a Answer
	if err == nil {
		a, err = f.sender.Send(actx, lease.Tunnel(), hr)
	}
	cancel()
	if ctx.Err() != nil {
		return false // stopping, or the lease is lost: the request stays at the head
	}
	o := judge(a, err)
	log = log.With(zap.String("id", req.ID), zap.String("method", req.Method), zap.String("path", req.Path), zap.Int("attempt", n))
	switch o.verdict {
	case notServed:
		log.Debug("buffered request not delivered: the tunnel is not served here")
		return false
	case delivered:
		err = lease.Ack(ctx, req.ID)
		if err == nil {
			b.reset()
			log.Debug("buffered request delivered", zap.Int("status", a.Status))
		}
	case rejected:
		err = lease.Reject(ctx, req.ID, o.reason)
		if err == nil {
			b.reset()
			log.Warn("buffered request rejected: kept in the tunnel's rejected list, which the admin API lists and requeues", zap.String("reason", o.reason))
		}
	case retry:
		wait := b.next(req.ID, req.Attempts)
		err = lease.Retry(ctx, req.ID, buffer.Failure{Err: o.reason, Reached: o.reached, NextAttemptAt: time.Now().Add(wait)})
		if err == nil {
			log.Info("buffered request not delivered; retrying", zap.String("reason", o.reason), zap.Duration("retry_in", wait))
		}
	}
	switch {
	case err == nil, errors.Is(err, buffer.ErrNotFound):
		// Dropped through the admin API meanwhile: on to the next one.
		return true
	case errors.Is(err, buffer.ErrLeaseLost):
		log.Warn("lost the delivery lease: another replica delivers the queue; this request may be delivered again")
		return false
	}
	if ctx.Err() == nil {
		log.Warn("could not record a delivery; the request may be delivered again", zap.Error(err))
	}
	return false
}

// errUndeliverable is matched by the error of a stored request that no
// HTTP request can carry (a store changed behind tether's back): no retry
// mends it, so it is rejected, kept for a person to look at.
var errUndeliverable = errors.New("undeliverable")

// deliveryRequest is the request that delivers r for its n-th attempt.
func deliveryRequest(ctx context.Context, r *buffer.Request, n int) (*http.Request, error) {
	u, err := url.ParseRequestURI(r.URI)
	if err != nil {
		return nil, fmt.Errorf("%w: the stored request URI is not one: %w", errUndeliverable, err)
	}
	hr, err := http.NewRequestWithContext(ctx, r.Method, "/", bytes.NewReader(r.Body))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUndeliverable, err)
	}
	hr.URL = u
	hr.RequestURI = r.URI
	hr.Header = r.Header
	if hr.Header == nil {
		hr.Header = http.Header{}
	}
	hr.Header[DeliveryHeader] = []string{r.ID}
	hr.Header[AttemptHeader] = []string{strconv.Itoa(n)}
	return hr, nil
}

// verdict is what an attempt's answer asks of its request.
type verdict int

const (
	// retry later, with backoff.
	retry verdict = iota
	// delivered: remove it.
	delivered
	// rejected: keep it aside, for a person to look at.
	rejected
	// notServed: nothing happened; leave it for a replica that serves
	// the tunnel.
	notServed
)

// outcome is the verdict on an attempt, and what the listing says of it.
type outcome struct {
	verdict verdict
	// reached is true when the attempt reached the tunnel's client, and
	// counts in X-Tether-Attempt.
	reached bool
	reason  string
}

// judge reads an attempt's answer. The upstream's own answer decides: 2xx
// and 3xx deliver, 4xx rejects, anything else retries. An answer tether
// gave itself retries, but when the tunnel's routes refuse the request (no
// route any more, a method or path the router refuses), which no retry
// mends: that rejects.
func judge(a Answer, err error) outcome {
	switch {
	case errors.Is(err, errUndeliverable):
		return outcome{verdict: rejected, reason: err.Error()}
	case errors.Is(err, ErrNotServed):
		return outcome{verdict: notServed}
	case errors.Is(err, context.DeadlineExceeded):
		return outcome{verdict: retry, reached: true, reason: "no answer within the delivery attempt timeout"}
	case err != nil:
		return outcome{verdict: retry, reason: "not delivered: " + err.Error()}
	}
	status := strconv.Itoa(a.Status) + " " + http.StatusText(a.Status)
	switch a.Code {
	case "":
	case proxy.CodeNoRoute, proxy.CodeBadRequest, proxy.CodeMethodNotAllowed:
		return outcome{verdict: rejected, reason: "the tunnel's routes refuse it: tether answered " + status + ", " + a.Code}
	case proxy.CodeUpstreamUnreachable, proxy.CodeUpstreamTLS, proxy.CodeUpstreamTimeout,
		proxy.CodeUpstreamFailed, proxy.CodeUpstreamBadResponse, proxy.CodeCanceled:
		return outcome{verdict: retry, reached: true, reason: "tether answered " + status + ", " + a.Code}
	default:
		return outcome{verdict: retry, reason: "tether answered " + status + ", " + a.Code}
	}
	switch {
	case a.Status >= 200 && a.Status < 400:
		return outcome{verdict: delivered, reached: true}
	case a.Status >= 400 && a.Status < 500:
		return outcome{verdict: rejected, reached: true, reason: "the upstream answered " + status}
	}
	return outcome{verdict: retry, reached: true, reason: "the upstream answered " + status}
}

// backoff is the wait before the next attempt at the head of a queue: min
// after its first failure, doubling with each one up to max, each wait
// drawn between half of it and all of it so that tunnels that failed
// together do not retry together.
type backoff struct {
	min, max time.Duration
	id       string // the request the failures are of
	failures int
}

// next counts a failure of request id, which had attempts before this
// deliverer took it, and returns the wait before the next attempt.
func (b *backoff) next(id string, attempts int) time.Duration {
	if b.id != id {
		b.id, b.failures = id, attempts
	}
	b.failures++
	d := b.max
	if shift := b.failures - 1; shift < 32 && b.min<<shift < b.max && b.min<<shift > 0 {
		d = b.min << shift
	}
	return d/2 + rand.N(d/2+1) //nolint:gosec // jitter, not a secret
}

func (b *backoff) reset() { b.id, b.failures = "", 0 }

// sweep kicks, every Config.SweepInterval, the tunnels served here whose
// queues wait, until ctx ends: a kick for a tunnel whose deliverer is
// alive elsewhere costs one failed Acquire.
func (f *Forwarder) sweep(ctx context.Context) error {
	t := time.NewTicker(f.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		all, err := f.buf.All(ctx)
		if err != nil {
			if ctx.Err() == nil {
				f.log.Debug("could not look for queues to deliver", zap.Error(err))
			}
			continue
		}
		for tunnel, st := range all {
			if st.Queued > 0 && f.sender.Serves(tunnel) {
				f.Kick(tunnel)
			}
		}
	}
}
