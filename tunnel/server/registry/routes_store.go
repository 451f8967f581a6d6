package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"
)

// boltRoutes keeps remembered routes of a single replica in the data
// directory's bucket "routes": tunnel → JSON Remembered. A write of many
// tunnels is one fsynced transaction.
type boltRoutes struct{ db *bolt.DB }

func (b boltRoutes) write(_ context.Context, list []Remembered, _ time.Duration) error {
	return b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRoutes)
		for _, rem := range list {
			val, err := json.Marshal(rem)
			if err != nil {
				return err
			}
			if err := bk.Put([]byte(rem.Tunnel), val); err != nil {
				return err
			}
		}
		return nil
	})
}

func (b boltRoutes) read(_ context.Context, tunnel string) (Remembered, bool, error) {
	var rem Remembered
	var ok bool
	err := b.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRoutes).Get([]byte(tunnel))
		if v == nil {
			return nil
		}
		ok = true
		return json.Unmarshal(v, &rem)
	})
	return rem, ok, err
}

func (b boltRoutes) prune(_ context.Context, cutoff time.Time) error {
	return b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRoutes)
		var ended [][]byte
		err := bk.ForEach(func(k, v []byte) error {
			var rem Remembered
			if err := json.Unmarshal(v, &rem); err != nil || rem.LastSeen.Before(cutoff) {
				ended = append(ended, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range ended {
			if err := bk.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

func (boltRoutes) close() error { return nil }

// redisRoutes keeps remembered routes in Redis, shared by the replicas:
//
//	{prefix}routes:{tunnel}   string: JSON Remembered, PX until LastSeen plus the retention
type redisRoutes struct {
	conn   *RedisConn
	client *redis.Client
	prefix string
}

func newRedisRoutes(conn *RedisConn) *redisRoutes {
	return &redisRoutes{conn: conn, client: conn.Client("routes", 2), prefix: conn.Prefix() + "routes:"}
}

func (b *redisRoutes) write(ctx context.Context, list []Remembered, retention time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	now := time.Now()
	pipe := b.client.Pipeline()
	n := 0
	for _, rem := range list {
		ttl := rem.LastSeen.Add(retention).Sub(now)
		if ttl < time.Millisecond {
			continue
		}
		val, err := json.Marshal(rem)
		if err != nil {
			return err
		}
		pipe.Set(ctx, b.prefix+rem.Tunnel, val, ttl)
		n++
	}
	if n == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return b.conn.Explain(fmt.Errorf("write the remembered routes of %d tunnels: %w", n, err))
	}
	return nil
}

func (b *redisRoutes) read(ctx context.Context, tunnel string) (Remembered, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, b.conn.Timeout())
	defer cancel()
	v, err := b.client.Get(ctx, b.prefix+tunnel).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return Remembered{}, false, nil
	case err != nil:
		return Remembered{}, false, b.conn.Explain(err)
	}
	var rem Remembered
	if err := json.Unmarshal(v, &rem); err != nil {
		return Remembered{}, false, fmt.Errorf("%s%s holds %d bytes that tether did not write: %w", b.prefix, tunnel, len(v), err)
	}
	return rem, true, nil
}

func (*redisRoutes) prune(context.Context, time.Time) error { return nil }

func (b *redisRoutes) close() error { return b.client.Close() }
