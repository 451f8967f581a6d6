package buffer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tether-dev/tether/tunnel/server/registry"
)

// redisBackend stores buffered requests in the registry's Redis, shared by
// the replicas; the package doc lists the keys. Every change is one Lua
// script over the tunnel's keys (tunnelKeys), so that its checks and writes
// are one atomic step.
type redisBackend struct {
	conn    *registry.RedisConn
	client  *redis.Client
	replica string
	prefix  string // P buffer:
}

// Bounds of the buffer's Redis operations: a small one (a lease, a count)
// takes the registry's timeout; one that carries a body up to the server's
// --buffer-max-body gets longer.
const (
	bodyTimeout = 30 * time.Second
	// scriptBatch bounds the requests one script call deletes, so that
	// expiring or dropping a large queue does not block Redis.
	scriptBatch = 200
	// poolSize bounds the connections of the buffer's client: appends of
	// many callers share them.
	poolSize = 16
)

func newRedisBackend(conn *registry.RedisConn) *redisBackend {
	return &redisBackend{
		conn:    conn,
		client:  conn.Client("buffer", poolSize),
		replica: conn.Replica(),
		prefix:  conn.Prefix() + "buffer:",
	}
}

func (b *redisBackend) close() error { return b.client.Close() }

// tunnelKeys are the KEYS of every script, in the order the scripts use.
func (b *redisBackend) tunnelKeys(tunnel string) []string {
	t := b.prefix + tunnel + ":"
	return []string{
		t + "queued", t + "rejected", t + "meta", t + "payload", t + "stats", // 1-5
		b.prefix + "tunnels", b.prefix + "bytes", t + "lease", b.prefix + "last", b.prefix + "fence", // 6-10
	}
}

// scriptPrelude defines what the scripts share: remove deletes a request
// with its counts; holds checks the lease.
const scriptPrelude = `
local function remove(tunnel, id)
	local m = redis.call('HGET', KEYS[3], id)
	if not m then return 0 end
	local size = cjson.decode(m).size
	redis.call('ZREM', KEYS[1], id)
	redis.call('ZREM', KEYS[2], id)
	redis.call('HDEL', KEYS[3], id)
	redis.call('HDEL', KEYS[4], id)
	redis.call('DECRBY', KEYS[7], size)
	if redis.call('HINCRBY', KEYS[5], 'n', -1) <= 0 then
		redis.call('DEL', KEYS[5])
		redis.call('SREM', KEYS[6], tunnel)
	else
		redis.call('HINCRBY', KEYS[5], 'bytes', -size)
	end
	return 1
end
local function holds(value)
	return redis.call('GET', KEYS[8]) == value
end
`

func script(body string) *redis.Script { return redis.NewScript(scriptPrelude + body) }

// appendScript checks the quotas, makes the next ID from Redis's clock
// (never going back; see nextID) and stores the request.
//
// ARGV: tunnel, size, max requests, max bytes, max total bytes, meta,
// payload. Returns {"ok", id} or {"full", flag, used}.
var appendScript = script(`
local size = tonumber(ARGV[2])
local n = tonumber(redis.call('HGET', KEYS[5], 'n') or '0')
local used = tonumber(redis.call('HGET', KEYS[5], 'bytes') or '0')
local total = tonumber(redis.call('GET', KEYS[7]) or '0')
if n + 1 > tonumber(ARGV[3]) then return {'full', 'requests', tostring(n)} end
if used + size > tonumber(ARGV[4]) then return {'full', 'bytes', tostring(used)} end
if total + size > tonumber(ARGV[5]) then return {'full', 'total', tostring(total)} end
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seq = 0
local last = redis.call('GET', KEYS[9])
if last then
	local lms, lseq = string.match(last, '^(%d+) (%d+)$')
	lms, lseq = tonumber(lms), tonumber(lseq)
	if ms <= lms then
		ms, seq = lms, lseq + 1
		if seq > 16777215 then ms, seq = lms + 1, 0 end
	end
end
redis.call('SET', KEYS[9], string.format('%d %d', ms, seq))
local id = string.format('%012x-%06x', ms, seq)
redis.call('ZADD', KEYS[1], 0, id)
redis.call('HSET', KEYS[3], id, ARGV[6])
redis.call('HSET', KEYS[4], id, ARGV[7])
redis.call('HINCRBY', KEYS[5], 'n', 1)
redis.call('HINCRBY', KEYS[5], 'bytes', size)
redis.call('INCRBY', KEYS[7], size)
redis.call('SADD', KEYS[6], ARGV[1])
return {'ok', id}
`)

func (b *redisBackend) append(ctx context.Context, tunnel string, m meta, payload []byte, q quotas) (string, error) {
	val, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, bodyTimeout)
	defer cancel()
	res, err := appendScript.Run(ctx, b.client, b.tunnelKeys(tunnel),
		tunnel, m.Size, q.requests, q.bytes, q.total, val, payload).StringSlice()
	if err != nil {
		return "", b.conn.Explain(err)
	}
	switch {
	case len(res) == 2 && res[0] == "ok":
		return res[1], nil
	case len(res) == 3 && res[0] == "full":
		used, _ := strconv.ParseInt(res[2], 10, 64)
		flag := map[string]string{"requests": FlagMaxRequests, "bytes": FlagMaxBytes, "total": FlagMaxTotalBytes}[res[1]]
		limit := map[string]int64{FlagMaxRequests: int64(q.requests), FlagMaxBytes: q.bytes, FlagMaxTotalBytes: q.total}[flag]
		return "", &FullError{Tunnel: tunnel, Flag: flag, Used: used, Size: m.Size, Limit: limit}
	}
	return "", fmt.Errorf("append script answered %q", res)
}

// nextScript returns the oldest queued request: {id, meta, payload} when
// due at ARGV[2] (Unix ms), {id, meta} when not, {} when none is queued.
var nextScript = script(`
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if #head == 0 then return {} end
local id = head[1]
local m = redis.call('HGET', KEYS[3], id)
if not m then return redis.error_reply('meta of ' .. id .. ' is missing') end
if cjson.decode(m).next_at > tonumber(ARGV[2]) then return {id, m} end
return {id, m, redis.call('HGET', KEYS[4], id)}
`)

func (b *redisBackend) next(ctx context.Context, tunnel string, now time.Time) (string, meta, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, bodyTimeout)
	defer cancel()
	res, err := nextScript.Run(ctx, b.client, b.tunnelKeys(tunnel), tunnel, now.UnixMilli()).Slice()
	if err != nil {
		return "", meta{}, nil, b.conn.Explain(err)
	}
	if len(res) == 0 {
		return "", meta{}, nil, ErrEmpty
	}
	id, _ := res[0].(string)
	var m meta
	if s, _ := res[1].(string); json.Unmarshal([]byte(s), &m) != nil {
		return "", meta{}, nil, fmt.Errorf("buffered request %s: unreadable metadata", id)
	}
	if len(res) < 3 {
		return id, m, nil, nil
	}
	payload, ok := res[2].(string)
	if !ok {
		return "", meta{}, nil, errPayload
	}
	return id, m, []byte(payload), nil
}

// leaseResult maps a holder script's answer: -1 lost the lease, 0 no such
// request, 1 done.
func leaseResult(n int64, err error) error {
	switch {
	case err != nil:
		return err
	case n < 0:
		return ErrLeaseLost
	case n == 0:
		return ErrNotFound
	}
	return nil
}

// ackScript deletes a delivered request. ARGV: tunnel, lease, id.
var ackScript = script(`
if not holds(ARGV[2]) then return -1 end
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) then return 0 end
return remove(ARGV[1], ARGV[3])
`)

func (b *redisBackend) ack(ctx context.Context, h holder, id string) error {
	return b.holderScript(ctx, ackScript, h, id)
}

// retryScript records a failed attempt. ARGV: tunnel, lease, id, reached
// (0 or 1), last error, next attempt (Unix ms). It mirrors meta.failed.
var retryScript = script(`
if not holds(ARGV[2]) then return -1 end
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) then return 0 end
local m = cjson.decode(redis.call('HGET', KEYS[3], ARGV[3]))
m.attempts = m.attempts + tonumber(ARGV[4])
m.last_error = ARGV[5]
m.next_at = tonumber(ARGV[6])
redis.call('HSET', KEYS[3], ARGV[3], cjson.encode(m))
return 1
`)

func (b *redisBackend) retry(ctx context.Context, h holder, id string, f Failure) error {
	reached := 0
	if f.Reached {
		reached = 1
	}
	return b.holderScript(ctx, retryScript, h, id, reached, truncateError(f.Err), f.NextAttemptAt.UnixMilli())
}

// rejectScript moves a request the upstream refused to the rejected list.
// ARGV: tunnel, lease, id, reason. It mirrors meta.rejected.
var rejectScript = script(`
if not holds(ARGV[2]) then return -1 end
if redis.call('ZREM', KEYS[1], ARGV[3]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], 0, ARGV[3])
local m = cjson.decode(redis.call('HGET', KEYS[3], ARGV[3]))
m.attempts = m.attempts + 1
m.last_error = ARGV[4]
m.next_at = 0
redis.call('HSET', KEYS[3], ARGV[3], cjson.encode(m))
return 1
`)

func (b *redisBackend) reject(ctx context.Context, h holder, id, reason string) error {
	return b.holderScript(ctx, rejectScript, h, id, truncateError(reason))
}

func (b *redisBackend) holderScript(ctx context.Context, s *redis.Script, h holder, id string, more ...any) error {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	args := append([]any{h.tunnel, h.value, id}, more...)
	return leaseResult(s.Run(ctx, b.client, b.tunnelKeys(h.tunnel), args...).Int64())
}

// requeueScript moves a rejected request back to the queue, due now.
// ARGV: tunnel, id, now (Unix ms).
var requeueScript = script(`
if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then return 0 end
redis.call('ZADD', KEYS[1], 0, ARGV[2])
local m = cjson.decode(redis.call('HGET', KEYS[3], ARGV[2]))
m.next_at = tonumber(ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], cjson.encode(m))
return 1
`)

func (b *redisBackend) requeue(ctx context.Context, tunnel, id string, now time.Time) error {
	return b.plainScript(ctx, requeueScript, tunnel, id, now.UnixMilli())
}

// dropScript deletes a request, queued or rejected. ARGV: tunnel, id.
var dropScript = script(`return remove(ARGV[1], ARGV[2])`)

func (b *redisBackend) drop(ctx context.Context, tunnel, id string) error {
	return b.plainScript(ctx, dropScript, tunnel, id)
}

func (b *redisBackend) plainScript(ctx context.Context, s *redis.Script, tunnel string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	n, err := s.Run(ctx, b.client, b.tunnelKeys(tunnel), append([]any{tunnel}, args...)...).Int64()
	return leaseResult(n, b.conn.Explain(err))
}

// removeBeforeScript deletes up to ARGV[3] requests, queued and rejected,
// whose IDs sort below ARGV[2] ("+" for all), and returns how many.
// ARGV: tunnel, bound, batch.
var removeBeforeScript = script(`
local n = 0
for _, key in ipairs({KEYS[1], KEYS[2]}) do
	local bound = ARGV[2]
	if bound ~= '+' then bound = '(' .. bound end
	local ids = redis.call('ZRANGEBYLEX', key, '-', bound, 'LIMIT', 0, tonumber(ARGV[3]) - n)
	for _, id in ipairs(ids) do n = n + remove(ARGV[1], id) end
	if n >= tonumber(ARGV[3]) then break end
end
return n
`)

// removeBefore deletes the tunnel's requests with IDs below bound ("+":
// all), a batch per script call.
func (b *redisBackend) removeBefore(ctx context.Context, tunnel, bound string) (int, error) {
	total := 0
	for {
		ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
		n, err := removeBeforeScript.Run(ctx, b.client, b.tunnelKeys(tunnel), tunnel, bound, scriptBatch).Int()
		cancel()
		total += n
		if err != nil {
			return total, b.conn.Explain(err)
		}
		if n < scriptBatch {
			return total, nil
		}
	}
}

func (b *redisBackend) dropAll(ctx context.Context, tunnel string) (int, error) {
	return b.removeBefore(ctx, tunnel, "+")
}

func (b *redisBackend) expire(ctx context.Context, cutoff time.Time) (int, error) {
	tunnels, err := b.tunnels(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, tunnel := range tunnels {
		n, err := b.removeBefore(ctx, tunnel, idBefore(cutoff.UnixMilli()))
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func (b *redisBackend) tunnels(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	list, err := b.client.SMembers(ctx, b.prefix+"tunnels").Result()
	return list, b.conn.Explain(err)
}

func (b *redisBackend) list(ctx context.Context, tunnel string) ([]Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	k := b.tunnelKeys(tunnel)
	var queued, rejected *redis.StringSliceCmd
	var metas *redis.MapStringStringCmd
	if _, err := b.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		queued = p.ZRange(ctx, k[0], 0, -1)
		rejected = p.ZRange(ctx, k[1], 0, -1)
		metas = p.HGetAll(ctx, k[2])
		return nil
	}); err != nil {
		return nil, b.conn.Explain(err)
	}
	list := make([]Entry, 0, len(metas.Val()))
	for _, s := range []struct {
		ids   []string
		state State
	}{{queued.Val(), Queued}, {rejected.Val(), Rejected}} {
		for _, id := range s.ids {
			var m meta
			if err := json.Unmarshal([]byte(metas.Val()[id]), &m); err != nil {
				return nil, fmt.Errorf("buffered request %s: unreadable metadata: %w", id, err)
			}
			e, err := m.entry(tunnel, id, s.state)
			if err != nil {
				return nil, err
			}
			list = append(list, e)
		}
	}
	sortEntries(list)
	return list, nil
}

// statsCmds are the replies that make one tunnel's Stats.
type statsCmds struct {
	queued, rejected *redis.IntCmd
	bytes            *redis.StringCmd
	headQ, headR     *redis.StringSliceCmd
}

func (b *redisBackend) queueStats(ctx context.Context, p redis.Pipeliner, tunnel string) statsCmds {
	k := b.tunnelKeys(tunnel)
	return statsCmds{
		queued:   p.ZCard(ctx, k[0]),
		rejected: p.ZCard(ctx, k[1]),
		bytes:    p.HGet(ctx, k[4], "bytes"),
		headQ:    p.ZRange(ctx, k[0], 0, 0),
		headR:    p.ZRange(ctx, k[1], 0, 0),
	}
}

func (c statsCmds) stats() Stats {
	s := Stats{Queued: int(c.queued.Val()), Rejected: int(c.rejected.Val())}
	s.Bytes, _ = strconv.ParseInt(c.bytes.Val(), 10, 64)
	heads := slices.Concat(c.headQ.Val(), c.headR.Val())
	if len(heads) > 0 {
		if ms, _, ok := parseID(slices.Min(heads)); ok {
			s.Oldest = time.UnixMilli(ms).UTC()
		}
	}
	return s
}

func (b *redisBackend) stats(ctx context.Context, tunnel string) (Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	var c statsCmds
	_, err := b.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		c = b.queueStats(ctx, p, tunnel)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Stats{}, b.conn.Explain(err)
	}
	return c.stats(), nil
}

func (b *redisBackend) all(ctx context.Context) (map[string]Stats, error) {
	tunnels, err := b.tunnels(ctx)
	if err != nil {
		return nil, err
	}
	all := make(map[string]Stats, len(tunnels))
	for chunk := range slices.Chunk(tunnels, scriptBatch) {
		ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
		cmds := make([]statsCmds, len(chunk))
		_, err := b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, tunnel := range chunk {
				cmds[i] = b.queueStats(ctx, p, tunnel)
			}
			return nil
		})
		cancel()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, b.conn.Explain(err)
		}
		for i, tunnel := range chunk {
			if s := cmds[i].stats(); s.Queued+s.Rejected > 0 {
				all[tunnel] = s
			}
		}
	}
	return all, nil
}

// acquireScript takes the lease if it is free, with a new fencing number.
// ARGV: tunnel, TTL (ms), replica. Returns {1, value} or {0, holder's
// value}.
var acquireScript = script(`
local cur = redis.call('GET', KEYS[8])
if cur then return {0, cur} end
local v = redis.call('INCR', KEYS[10]) .. ' ' .. ARGV[3]
redis.call('SET', KEYS[8], v, 'PX', ARGV[2])
return {1, v}
`)

func (b *redisBackend) acquire(ctx context.Context, tunnel string, ttl time.Duration) (holder, error) {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	res, err := acquireScript.Run(ctx, b.client, b.tunnelKeys(tunnel), tunnel, ttl.Milliseconds(), b.replica).Slice()
	if err != nil {
		return holder{}, b.conn.Explain(err)
	}
	if len(res) != 2 {
		return holder{}, fmt.Errorf("acquire script answered %v", res)
	}
	value, _ := res[1].(string)
	if ok, _ := res[0].(int64); ok != 1 {
		_, replica, _ := strings.Cut(value, " ")
		return holder{}, fmt.Errorf("%w: replica %s", ErrLeased, replica)
	}
	fence, _, _ := strings.Cut(value, " ")
	n, err := strconv.ParseUint(fence, 10, 64)
	if err != nil {
		return holder{}, fmt.Errorf("lease value %q: %w", value, err)
	}
	return holder{tunnel: tunnel, fence: n, value: value}, nil
}

// renewScript extends the lease if it is still the holder's.
// ARGV: tunnel, value, TTL (ms).
var renewScript = script(`
if not holds(ARGV[2]) then return -1 end
redis.call('PEXPIRE', KEYS[8], ARGV[3])
return 1
`)

func (b *redisBackend) renew(ctx context.Context, h holder, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	n, err := renewScript.Run(ctx, b.client, b.tunnelKeys(h.tunnel), h.tunnel, h.value, ttl.Milliseconds()).Int64()
	return leaseResult(n, b.conn.Explain(err))
}

// releaseScript deletes the lease if it is still the holder's.
// ARGV: tunnel, value.
var releaseScript = script(`
if holds(ARGV[2]) then redis.call('DEL', KEYS[8]) end
return 1
`)

func (b *redisBackend) release(ctx context.Context, h holder) error {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	return b.conn.Explain(releaseScript.Run(ctx, b.client, b.tunnelKeys(h.tunnel), h.tunnel, h.value).Err())
}
