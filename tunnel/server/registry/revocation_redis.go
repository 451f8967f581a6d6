package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// redisRevocations keeps the revocations in Redis, shared by the replicas:
//
//	{prefix}revocations           hash: ID → JSON Revocation
//	{prefix}revocations:version   integer, incremented by every change
//	{prefix}revocations:events    pub/sub channel: the new version at each change
//
// Each change is one Lua script that writes, increments the version and
// publishes it, so a replica that sees a version it has not loaded reloads
// the hash, whether it heard the message or found the version in its check
// every second.
type redisRevocations struct {
	conn    *RedisConn
	log     *zap.Logger
	client  *redis.Client
	hash    string
	version string
	channel string
}

// revocationPoll is how often a replica compares its version with Redis's:
// the bound on how late it learns a change whose message it missed (a
// resubscription, a Redis failover).
const revocationPoll = time.Second

func newRedisRevocations(conn *RedisConn, log *zap.Logger) *redisRevocations {
	p := conn.Prefix()
	return &redisRevocations{
		conn:    conn,
		log:     log,
		client:  conn.Client("revocations", 2),
		hash:    p + "revocations",
		version: p + "revocations:version",
		channel: p + "revocations:events",
	}
}

// revocationAddScript stores a revocation unless the hash holds ARGV[3]
// already, then increments the version and publishes it. It returns the new
// version, or -1 at the limit.
//
// KEYS: hash, version. ARGV: ID, JSON, limit, channel.
var revocationAddScript = redis.NewScript(`
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', ARGV[4], v)
return v
`)

// revocationRemoveScript deletes revocations by ID and, when one was there,
// increments the version and publishes it. It returns how many it deleted.
//
// KEYS: hash, version. ARGV: channel, then the IDs.
var revocationRemoveScript = redis.NewScript(`
local n = 0
for i = 2, #ARGV do n = n + redis.call('HDEL', KEYS[1], ARGV[i]) end
if n > 0 then redis.call('PUBLISH', ARGV[1], redis.call('INCR', KEYS[2])) end
return n
`)

// revocationRestoreScript writes a replica's copy of the revocations back
// into a Redis that lost them (no version key: restarted without
// persistence, or failed over to an empty server), so that a revoked tunnel
// does not come back. Only the first replica to notice writes. It returns
// 1 if it wrote.
//
// KEYS: hash, version. ARGV: channel, version, then ID and JSON pairs.
var revocationRestoreScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
`)

func (b *redisRevocations) add(ctx context.Context, rev Revocation, limit int) error {
	val, err := json.Marshal(rev)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	v, err := revocationAddScript.Run(ctx, b.client, []string{b.hash, b.version}, rev.ID, val, limit, b.channel).Int64()
	switch {
	case err != nil:
		return b.conn.Explain(err)
	case v < 0:
		return ErrTooManyRevocations
	}
	return nil
}

func (b *redisRevocations) remove(ctx context.Context, ids ...string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	args := make([]any, 0, 1+len(ids))
	args = append(args, b.channel)
	for _, id := range ids {
		args = append(args, id)
	}
	n, err := revocationRemoveScript.Run(ctx, b.client, []string{b.hash, b.version}, args...).Int()
	return n, b.conn.Explain(err)
}

// load reads the set. A Redis without a version lost what it had (it
// restarted without persistence, or failed over to an empty server) if cur,
// this replica's copy, holds revocations: they came from Redis or were
// written there. Then load writes cur back first, so that a revoked tunnel
// does not come back.
func (b *redisRevocations) load(ctx context.Context, cur *revocationSet) (uint64, map[string]Revocation, error) {
	v, revs, err := b.read(ctx)
	if err != nil || v != 0 || len(cur.byID) == 0 {
		return v, revs, err
	}
	if err := b.restore(ctx, cur); err != nil {
		return 0, nil, err
	}
	return b.read(ctx)
}

func (b *redisRevocations) read(ctx context.Context) (uint64, map[string]Revocation, error) {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	var version *redis.StringCmd
	var all *redis.MapStringStringCmd
	_, err := b.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		version = p.Get(ctx, b.version)
		all = p.HGetAll(ctx, b.hash)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, nil, b.conn.Explain(fmt.Errorf("read %s: %w", b.hash, err))
	}
	v, err := parseVersion(version)
	if err != nil {
		return 0, nil, err
	}
	revs := make(map[string]Revocation, len(all.Val()))
	for id, val := range all.Val() {
		var rev Revocation
		if err := json.Unmarshal([]byte(val), &rev); err != nil || rev.ID != id {
			continue // not written by tether; Revoked could not use it
		}
		revs[id] = rev
	}
	return v, revs, nil
}

// parseVersion reads the version key: 0 when it does not exist.
func parseVersion(cmd *redis.StringCmd) (uint64, error) {
	s, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, nil
	case err != nil:
		return 0, err
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("revocations version %q is not a number: %w", s, err)
	}
	return v, nil
}

func (b *redisRevocations) close() error { return b.client.Close() }

// watch follows the changes until ctx ends, resubscribing with backoff
// while Redis fails.
func (b *redisRevocations) watch(ctx context.Context, r *Revocations) {
	follow := func(ctx context.Context) (bool, error) { return b.follow(ctx, r) }
	retryFollow(ctx, follow, r.health.fail, revocationPoll)
}

// follow runs one subscription until it fails: a full load once subscribed
// (so nothing published meanwhile is missed), then a check at each message
// and every revocationPoll. connected reports whether it got as far as the
// load.
func (b *redisRevocations) follow(ctx context.Context, r *Revocations) (connected bool, err error) {
	ps, done, err := b.conn.subscribe(ctx, b.client, b.channel)
	if err != nil {
		return false, err
	}
	defer done()
	if err := b.check(ctx, r); err != nil {
		return false, err
	}
	r.health.ok()
	pinged := false // a ping is unanswered
	for {
		_, err := ps.ReceiveTimeout(ctx, revocationPoll)
		switch {
		case ctx.Err() != nil:
			return true, ctx.Err()
		case err == nil:
			pinged = false
		case isTimeout(err):
			// A quiet channel: a ping proves the subscription is alive,
			// and its reply is a message like any other.
			if pinged {
				return true, fmt.Errorf("receive from %s: no reply to ping within %v", b.channel, revocationPoll)
			}
			if err := ps.Ping(ctx); err != nil {
				return true, b.conn.Explain(fmt.Errorf("ping on %s: %w", b.channel, err))
			}
			pinged = true
		default:
			return true, b.conn.Explain(fmt.Errorf("receive from %s: %w", b.channel, err))
		}
		if err := b.check(ctx, r); err != nil {
			return true, err
		}
	}
}

// check reloads the set when Redis's version differs from the loaded one.
func (b *redisRevocations) check(ctx context.Context, r *Revocations) error {
	v, err := b.currentVersion(ctx)
	if err != nil {
		return err
	}
	if v == r.set.Load().version && r.isReady() {
		return nil
	}
	return r.reload(ctx)
}

func (b *redisRevocations) currentVersion(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	v, err := parseVersion(b.client.Get(ctx, b.version))
	return v, b.conn.Explain(err)
}

// restore writes cur, less what has ended, back into Redis, unless another
// replica did already.
func (b *redisRevocations) restore(ctx context.Context, cur *revocationSet) error {
	args := []any{b.channel, max(cur.version, 1)}
	now := time.Now()
	n := 0
	for id, rev := range cur.byID {
		if !rev.active(now) {
			continue
		}
		val, err := json.Marshal(rev)
		if err != nil {
			return err
		}
		args = append(args, id, val)
		n++
	}
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	wrote, err := revocationRestoreScript.Run(ctx, b.client, []string{b.hash, b.version}, args...).Int()
	if err != nil {
		return b.conn.Explain(fmt.Errorf("restore revocations: %w", err))
	}
	if wrote == 1 {
		b.log.Warn("redis had lost the revocations (restarted without persistence, or failed over to an empty server); wrote this replica's copy back: run Redis with AOF to keep them",
			zap.String("registry", b.conn.Target()), zap.Int("revocations", n))
	}
	return nil
}
