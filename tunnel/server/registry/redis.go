package registry

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Redis is the registry shared by the replicas through Redis; the package
// doc describes how.
type Redis struct {
	cfg    Config
	target string // the URL without password
	conn   *RedisConn
	client *redis.Client
	schema schema
	log    *zap.Logger
	table  *table
	health *health

	// opTimeout bounds each Redis operation (and the final release), so
	// that a Redis that stopped answering is noticed.
	opTimeout time.Duration

	mu sync.Mutex
	// dirty is the tunnels held since the last write.
	dirty map[string]struct{}
	// releases is the holds to delete from Redis, released here or left by
	// an earlier process with this replica ID, with when they were queued.
	releases map[entry]time.Time
	// full asks the next write to rewrite every hold and beat: at each
	// Refresh, after a failure, and when the subscription (re)connects.
	full bool
	// kick wakes the write loop.
	kick chan struct{}
}

var _ Registry = (*Redis)(nil)

// Backoff between retries while Redis fails: from minBackoff, doubling, up
// to Config.Refresh.
const minBackoff = 100 * time.Millisecond

// batch bounds the keys of one script call, so that a replica holding many
// tunnels does not block Redis with one long script.
const batch = 200

// NewRedis returns a registry on the Redis server at cfg.URL. password is
// used when not empty (the URL then must not hold one). It validates cfg but
// does not connect: Run does.
func NewRedis(cfg Config, password string, log *zap.Logger) (*Redis, error) {
	conn, err := NewRedisConn(cfg, password)
	if err != nil {
		return nil, err
	}
	cfg = conn.cfg
	opTimeout := conn.timeout
	r := &Redis{
		cfg:       cfg,
		target:    conn.target,
		conn:      conn,
		client:    conn.Client("", 4),
		schema:    newSchema(cfg.Prefix),
		log:       log.Named("registry"),
		table:     newTable(cfg.Replica, cfg.Addr),
		opTimeout: opTimeout,
		dirty:     map[string]struct{}{},
		releases:  map[entry]time.Time{},
		full:      true,
		kick:      make(chan struct{}, 1),
	}
	r.health = newHealth(r.log, r.target)
	return r, nil
}

// Hold implements Registry.
func (r *Redis) Hold(tunnel string) {
	if !r.table.hold(tunnel) {
		return
	}
	r.mu.Lock()
	r.dirty[tunnel] = struct{}{}
	r.mu.Unlock()
	r.wake()
}

// Release implements Registry.
func (r *Redis) Release(tunnel string) {
	epoch, ok := r.table.release(tunnel)
	if !ok {
		return
	}
	r.mu.Lock()
	r.releases[entry{tunnel, epoch}] = time.Now()
	r.mu.Unlock()
	r.wake()
}

// Holders implements Registry.
func (r *Redis) Holders(tunnel string) []Holder { return r.table.holders(tunnel) }

// Wait implements Registry.
func (r *Redis) Wait(ctx context.Context, tunnel string) error { return r.table.wait(ctx, tunnel) }

// Snapshot implements Registry.
func (r *Redis) Snapshot() map[string][]Holder { return r.table.snapshot() }

// Status implements Registry.
func (r *Redis) Status() Status {
	s := Status{Backend: "redis", Target: r.target}
	r.health.status(&s)
	s.Held, s.Remote = r.table.counts()
	return s
}

func (r *Redis) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// rewriteAll asks the write loop to rewrite every hold and beat.
func (r *Redis) rewriteAll() {
	r.mu.Lock()
	r.full = true
	r.mu.Unlock()
	r.wake()
}

// dropStale queues holds found in Redis under this replica's ID that it
// does not hold (left by an earlier process) for deletion.
func (r *Redis) dropStale(stale []entry) {
	if len(stale) == 0 {
		return
	}
	now := time.Now()
	r.mu.Lock()
	for _, e := range stale {
		r.releases[e] = now
	}
	r.mu.Unlock()
	r.wake()
}

// Run implements Registry. It returns nil when ctx ends, after the final
// release.
func (r *Redis) Run(ctx context.Context) error {
	r.log.Info("redis registry starting", zap.String("registry", r.target),
		zap.String("replica", r.cfg.Replica), zap.String("peer_addr", r.cfg.Addr),
		zap.String("prefix", r.cfg.Prefix), zap.Duration("ttl", r.cfg.TTL))
	var wg sync.WaitGroup
	wg.Go(func() { r.writeLoop(ctx) })
	wg.Go(func() { r.subscribeLoop(ctx) })
	wg.Wait()
	r.releaseAll()
	if err := r.client.Close(); err != nil {
		r.log.Debug("close redis client", zap.Error(err))
	}
	return nil
}

// releaseAll deletes every hold of this replica from Redis as it stops, so
// that the others stop forwarding to it at once rather than after the TTL.
func (r *Redis) releaseAll() {
	list := r.table.ownHolds(nil)
	r.mu.Lock()
	for e := range r.releases {
		list = append(list, e)
	}
	r.mu.Unlock()
	if len(list) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.opTimeout)
	defer cancel()
	if err := r.deleteHolds(ctx, list); err != nil {
		level := zap.WarnLevel
		if !r.Status().Up {
			level = zap.InfoLevel // the outage has been logged
		}
		r.log.Log(level, "could not release tunnels in redis on stop; the other replicas drop them when their TTL ends",
			zap.Int("tunnels", len(list)), zap.Duration("ttl", r.cfg.TTL), zap.Error(err))
		return
	}
	r.log.Info("released tunnels in redis", zap.Int("tunnels", len(list)))
}

// writeLoop writes this replica's holds and releases to Redis when they
// change, rewrites them all every Refresh, and retries with backoff while
// Redis fails.
func (r *Redis) writeLoop(ctx context.Context) {
	refresh := time.NewTicker(r.cfg.Refresh)
	defer refresh.Stop()
	backoff := minBackoff
	for {
		var retry <-chan time.Time // not nil while failing
		if err := r.write(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			r.health.fail(pathWrite, err)
			retry = time.After(backoff)
			backoff = min(2*backoff, r.cfg.Refresh)
		} else {
			r.health.succeed(pathWrite)
			backoff = minBackoff
		}
		if !r.waitToWrite(ctx, refresh.C, retry) {
			return
		}
	}
}

// waitToWrite waits for a reason to write: a change, the refresh, or, while
// failing, only the retry (what changed meanwhile waits for it). It returns
// false when ctx ends.
func (r *Redis) waitToWrite(ctx context.Context, refresh, retry <-chan time.Time) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-refresh:
			r.mu.Lock()
			r.full = true
			r.mu.Unlock()
			if retry == nil {
				return true
			}
		case <-r.kick:
			if retry == nil {
				return true
			}
		case <-retry:
			return true
		}
	}
}

// write runs one pass: the holds that changed (or all of them, and then a
// beat), then the releases. Releases go last so that a hold written in the
// same pass and released meanwhile is deleted at once.
func (r *Redis) write(ctx context.Context) error {
	r.mu.Lock()
	full := r.full
	dirty := r.dirty
	r.full, r.dirty = false, map[string]struct{}{}
	r.mu.Unlock()
	var holds []entry
	if full {
		holds = r.table.ownHolds(nil)
	} else {
		holds = r.table.ownHolds(dirty)
	}
	r.mu.Lock()
	releases := make([]entry, 0, len(r.releases))
	for e, queued := range r.releases {
		// Nobody refreshed the key since it was queued: after a TTL it is
		// gone, so that a long outage with many reconnects does not pile up
		// releases.
		if time.Since(queued) > r.cfg.TTL {
			delete(r.releases, e)
			continue
		}
		releases = append(releases, e)
	}
	r.mu.Unlock()

	err := r.writeHolds(ctx, holds)
	if err == nil {
		err = r.deleteHolds(ctx, releases)
	}
	if err == nil && full {
		err = r.beat(ctx, len(holds)-overlap(holds, releases))
	}
	if err != nil {
		// Redis may come back empty: rewrite everything then.
		r.mu.Lock()
		r.full = true
		r.mu.Unlock()
		return err
	}
	r.mu.Lock()
	for _, e := range releases {
		delete(r.releases, e)
	}
	r.mu.Unlock()
	return nil
}

// overlap counts the holds that are also in releases.
func overlap(holds, releases []entry) int {
	if len(releases) == 0 {
		return 0
	}
	set := make(map[entry]struct{}, len(releases))
	for _, e := range releases {
		set[e] = struct{}{}
	}
	n := 0
	for _, e := range holds {
		if _, ok := set[e]; ok {
			n++
		}
	}
	return n
}

func (r *Redis) writeHolds(ctx context.Context, holds []entry) error {
	ttl := r.cfg.TTL.Milliseconds()
	for chunk := range slices.Chunk(holds, batch) {
		keys := make([]string, 0, len(chunk))
		args := make([]any, 0, 2+2*len(chunk))
		args = append(args, ttl, r.schema.channel)
		for _, e := range chunk {
			keys = append(keys, r.schema.key(e.tunnel, r.cfg.Replica))
			args = append(args, value(e.epoch, r.cfg.Addr), event{
				Op: opHold, Tunnel: e.tunnel, Replica: r.cfg.Replica, Addr: r.cfg.Addr,
				Epoch: e.epoch, TTLMillis: ttl,
			}.encode())
		}
		if err := r.script(ctx, holdScript, keys, args); err != nil {
			return fmt.Errorf("write %d tunnel holds: %w", len(chunk), err)
		}
	}
	return nil
}

func (r *Redis) deleteHolds(ctx context.Context, holds []entry) error {
	for chunk := range slices.Chunk(holds, batch) {
		keys := make([]string, 0, len(chunk))
		args := make([]any, 0, 1+2*len(chunk))
		args = append(args, r.schema.channel)
		for _, e := range chunk {
			keys = append(keys, r.schema.key(e.tunnel, r.cfg.Replica))
			args = append(args, e.epoch, event{
				Op: opRelease, Tunnel: e.tunnel, Replica: r.cfg.Replica, Epoch: e.epoch,
			}.encode())
		}
		if err := r.script(ctx, releaseScript, keys, args); err != nil {
			return fmt.Errorf("delete %d tunnel holds: %w", len(chunk), err)
		}
	}
	return nil
}

// beat tells the other replicas that this one is alive and holds n tunnels.
func (r *Redis) beat(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	msg := event{Op: opBeat, Replica: r.cfg.Replica, Addr: r.cfg.Addr, TTLMillis: r.cfg.TTL.Milliseconds(), Tunnels: n}
	if err := r.client.Publish(ctx, r.schema.channel, msg.encode()).Err(); err != nil {
		return r.explain(fmt.Errorf("publish liveness: %w", err))
	}
	return nil
}

func (r *Redis) script(ctx context.Context, s *redis.Script, keys []string, args []any) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	return r.explain(s.Run(ctx, r.client, keys, args...).Err())
}

// explain adds what to do to the errors that need the operator.
func (r *Redis) explain(err error) error { return r.conn.Explain(err) }

// Conn is how to reach this registry's Redis, for the other state the
// replicas share there.
func (r *Redis) Conn() *RedisConn { return r.conn }
