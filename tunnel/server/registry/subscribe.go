package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// subscribeLoop keeps the cache current: it subscribes to the channel,
// rebuilds the cache from a scan each time the subscription (re)connects,
// then applies the events. While Redis is away it keeps the cache as it was
// and retries with backoff.
func (r *Redis) subscribeLoop(ctx context.Context) {
	retryFollow(ctx, r.follow, func(err error) { r.health.fail(pathSubscribe, err) }, r.cfg.Refresh)
}

// retryFollow runs follow until ctx ends, handing each failure to fail and
// waiting between tries from minBackoff, doubling up to limit; a try that
// connected starts the backoff over.
func retryFollow(ctx context.Context, follow func(context.Context) (connected bool, err error), fail func(error), limit time.Duration) {
	backoff := minBackoff
	for {
		connected, err := follow(ctx)
		if ctx.Err() != nil {
			return
		}
		fail(err)
		if connected {
			backoff = minBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, limit)
	}
}

// follow runs one subscription until it fails; connected reports whether it
// got as far as a scan.
func (r *Redis) follow(ctx context.Context) (connected bool, err error) {
	// Once subscribed, every event reaches ps, so the scan that follows
	// misses nothing.
	ps, done, err := r.conn.subscribe(ctx, r.client, r.schema.channel)
	if err != nil {
		return false, err
	}
	defer done()
	if err := r.resync(ctx); err != nil {
		return false, err
	}
	r.health.succeed(pathSubscribe)
	// Redis may have come back empty: write every hold again, announced.
	r.rewriteAll()

	// The channel is never quiet for long: a ping every sweep while no
	// message comes proves the connection, and a missing reply ends it.
	sweep := r.cfg.TTL / 10
	heard := time.Now()  // when Redis last delivered something
	var pinged time.Time // when the ping now unanswered was sent
	resyncWanted, lastResync := false, time.Now()
	for {
		msg, err := ps.ReceiveTimeout(ctx, sweep)
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return true, ctx.Err()
		case err == nil:
			heard, pinged = now, time.Time{}
			if !r.apply(msg, now) {
				resyncWanted = true
			}
		case isTimeout(err):
			if pinged.IsZero() {
				if err := ps.Ping(ctx); err != nil {
					return true, r.explain(fmt.Errorf("ping on %s: %w", r.schema.channel, err))
				}
				pinged = now
			} else if now.Sub(pinged) >= r.opTimeout {
				return true, fmt.Errorf("receive from %s: no reply to ping within %v", r.schema.channel, r.opTimeout)
			}
		default:
			return true, r.explain(fmt.Errorf("receive from %s: %w", r.schema.channel, err))
		}
		// A replica is dead when its deadline passed while Redis still
		// delivered: a Redis that stopped answering says nothing about it.
		if gone := r.table.expire(heard); len(gone) > 0 {
			r.log.Info("replicas stopped refreshing their tunnels for a TTL; dropped them from the cache",
				zap.Strings("replicas", gone), zap.Duration("ttl", r.cfg.TTL))
		}
		// A missed event is repaired by a scan, at most once per Refresh.
		if resyncWanted && now.Sub(lastResync) >= r.cfg.Refresh {
			if err := r.resync(ctx); err != nil {
				return true, err
			}
			resyncWanted, lastResync = false, now
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// apply applies one message from the channel to the cache. It returns false
// when a beat shows that the cache missed an event.
func (r *Redis) apply(msg any, now time.Time) bool {
	switch m := msg.(type) {
	case *redis.Message:
		var ev event
		if err := json.Unmarshal([]byte(m.Payload), &ev); err != nil {
			r.log.Debug("ignoring a registry event that is not JSON", zap.Error(err))
			return true
		}
		if ev.Replica == r.cfg.Replica || ev.Replica == "" {
			return true
		}
		ttl := time.Duration(ev.TTLMillis) * time.Millisecond
		if ttl <= 0 {
			ttl = r.cfg.TTL
		}
		deadline := now.Add(ttl)
		switch ev.Op {
		case opHold:
			r.table.applyHold(ev.Tunnel, Holder{Replica: ev.Replica, Addr: ev.Addr, Epoch: ev.Epoch}, deadline)
		case opRelease:
			r.table.applyRelease(ev.Tunnel, ev.Replica, ev.Epoch)
		case opBeat:
			return r.table.beat(ev.Replica, deadline, ev.Tunnels)
		}
	case *redis.Subscription:
		// A resubscription that go-redis made on its own: events may have
		// been missed.
		return false
	}
	return true
}

// resync rebuilds the cache from a scan of every tunnel key, and queues
// for deletion the keys under this replica's ID that it does not hold.
func (r *Redis) resync(ctx context.Context) error {
	peers := map[string]*peer{}
	var stale []entry
	var cursor uint64
	for {
		keys, next, err := r.scan(ctx, cursor)
		if err != nil {
			return err
		}
		found, err := r.read(ctx, keys)
		if err != nil {
			return err
		}
		now := time.Now()
		for _, f := range found {
			if f.holder.Replica == r.cfg.Replica {
				if e, ok := r.table.ownEpoch(f.tunnel); !ok || e != f.holder.Epoch {
					stale = append(stale, entry{f.tunnel, f.holder.Epoch})
				}
				continue
			}
			p := peers[f.holder.Replica]
			if p == nil {
				p = &peer{holds: map[string]Holder{}}
				peers[f.holder.Replica] = p
			}
			p.holds[f.tunnel] = f.holder
			if d := now.Add(f.ttl); d.After(p.deadline) {
				p.deadline = d
			}
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	r.table.replace(peers)
	r.dropStale(stale)
	return nil
}

func (r *Redis) scan(ctx context.Context, cursor uint64) ([]string, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	keys, next, err := r.client.Scan(ctx, cursor, r.schema.tunnelPattern(), 1000).Result()
	if err != nil {
		return nil, 0, r.explain(fmt.Errorf("scan tunnel keys: %w", err))
	}
	return keys, next, nil
}

// found is one tunnel key read by a scan.
type found struct {
	tunnel string
	holder Holder
	ttl    time.Duration
}

// read reads the values and TTLs of keys in one round trip. Keys that
// vanished since the scan, or that do not parse, are left out.
func (r *Redis) read(ctx context.Context, keys []string) ([]found, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	pipe := r.client.Pipeline()
	gets := make([]*redis.StringCmd, len(keys))
	ttls := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, k)
		ttls[i] = pipe.PTTL(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, r.explain(fmt.Errorf("read %d tunnel keys: %w", len(keys), err))
	}
	list := make([]found, 0, len(keys))
	for i, k := range keys {
		tunnel, replica, ok := r.schema.parseKey(k)
		if !ok {
			continue
		}
		v, err := gets[i].Result()
		if err != nil {
			continue // gone since the scan
		}
		epoch, addr, err := parseValue(v)
		if err != nil {
			r.log.Debug("ignoring a tunnel key that tether did not write", zap.String("key", k), zap.Error(err))
			continue
		}
		ttl := ttls[i].Val()
		switch {
		case ttl == -1: // no TTL: not ours, but keep it for as long as ours
			ttl = r.cfg.TTL
		case ttl < 0:
			continue // gone since the scan
		}
		list = append(list, found{tunnel, Holder{Replica: replica, Addr: addr, Epoch: epoch}, ttl})
	}
	return list, nil
}
