package buffer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Layout of the bucket "buffer" of the data directory's file:
//
//	last               the last ID
//	bytes              8 bytes: bytes stored for all tunnels
//	tunnels/{tunnel}/  a bucket per tunnel with stored requests:
//	    q/             queued: ID → JSON meta
//	    r/             rejected: ID → JSON meta
//	    p/             ID → payload
//	    n, b           8 bytes each: requests and bytes stored
//
// Numbers are big-endian. IDs sort as bytes in their order, so a cursor
// walks a queue oldest first.
var (
	bucketBuffer  = []byte("buffer")
	bucketTunnels = []byte("tunnels")
	bucketQueued  = []byte("q")
	bucketReject  = []byte("r")
	bucketPayload = []byte("p")
	keyLast       = []byte("last")
	keyBytes      = []byte("bytes")
	keyCount      = []byte("n")
	keyTunnelSize = []byte("b")
)

// boltBackend stores buffered requests in the data directory's bbolt file.
// Changes go through bbolt's Batch, so that concurrent appends share one
// fsync; each returns once its transaction is on disk.
//
// Leases live in memory: the file has one process (bbolt locks it), so a
// deliverer that died took the process with it.
type boltBackend struct {
	db *bolt.DB

	mu     sync.Mutex
	fence  uint64                // of the last lease made
	leases map[string]*boltLease // by tunnel; never deleted: one per tunnel seen
}

// boltLease is a tunnel's lease. Its mutex is held across a holder's change,
// so that a takeover waits for a change in flight and a change never lands
// after a takeover.
type boltLease struct {
	mu      sync.Mutex
	fence   uint64 // 0: free
	expires time.Time
}

func newBoltBackend(db *bolt.DB) (*boltBackend, error) {
	err := db.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(bucketBuffer)
		if err != nil {
			return err
		}
		_, err = root.CreateBucketIfNotExists(bucketTunnels)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &boltBackend{db: db, leases: map[string]*boltLease{}}, nil
}

func (b *boltBackend) close() error { return nil }

// getInt reads a count or a size (absent: 0).
func getInt(bk *bolt.Bucket, key []byte) int64 {
	if v := bk.Get(key); len(v) == 8 {
		return int64(binary.BigEndian.Uint64(v)) //nolint:gosec // written by putInt
	}
	return 0
}

// putInt writes a count or a size, never negative.
func putInt(bk *bolt.Bucket, key []byte, v int64) error {
	return bk.Put(key, binary.BigEndian.AppendUint64(nil, uint64(max(v, 0))))
}

// tunnelBucket returns the tunnel's bucket, nil if it has none.
func tunnelBucket(tx *bolt.Tx, tunnel string) *bolt.Bucket {
	return tx.Bucket(bucketBuffer).Bucket(bucketTunnels).Bucket([]byte(tunnel))
}

func (b *boltBackend) append(_ context.Context, tunnel string, m meta, payload []byte, q quotas) (string, error) {
	val, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	var id string
	var full error
	err = b.db.Batch(func(tx *bolt.Tx) error {
		id, full = "", nil // Batch may call this more than once
		root := tx.Bucket(bucketBuffer)
		var n, size int64
		if t := tunnelBucket(tx, tunnel); t != nil {
			n, size = getInt(t, keyCount), getInt(t, keyTunnelSize)
		}
		total := getInt(root, keyBytes)
		if full = quotaError(tunnel, n, size, total, m.Size, q); full != nil {
			return nil
		}
		id = b.newID(root)
		t, err := root.Bucket(bucketTunnels).CreateBucketIfNotExists([]byte(tunnel))
		if err != nil {
			return err
		}
		for _, kv := range []struct {
			bucket, val []byte
		}{{bucketQueued, val}, {bucketPayload, payload}} {
			bk, err := t.CreateBucketIfNotExists(kv.bucket)
			if err != nil {
				return err
			}
			if err := bk.Put([]byte(id), kv.val); err != nil {
				return err
			}
		}
		return errors.Join(
			root.Put(keyLast, []byte(id)),
			putInt(t, keyCount, n+1),
			putInt(t, keyTunnelSize, size+m.Size),
			putInt(root, keyBytes, total+m.Size),
		)
	})
	if err != nil {
		return "", err
	}
	return id, full
}

// newID returns the ID after the last one stored in root.
func (b *boltBackend) newID(root *bolt.Bucket) string {
	lastMS, lastSeq, _ := parseID(string(root.Get(keyLast)))
	return formatID(nextID(lastMS, lastSeq, time.Now().UnixMilli()))
}

// quotaError is the *FullError for a request of size added to a tunnel
// that stores n requests of used bytes, with total bytes stored in all; nil
// if it fits.
func quotaError(tunnel string, n, used, total, size int64, q quotas) error {
	switch {
	case n+1 > int64(q.requests):
		return &FullError{Tunnel: tunnel, Flag: FlagMaxRequests, Used: n, Size: size, Limit: int64(q.requests)}
	case used+size > q.bytes:
		return &FullError{Tunnel: tunnel, Flag: FlagMaxBytes, Used: used, Size: size, Limit: q.bytes}
	case total+size > q.total:
		return &FullError{Tunnel: tunnel, Flag: FlagMaxTotalBytes, Used: total, Size: size, Limit: q.total}
	}
	return nil
}

// remove deletes the request id from t, queued or rejected, and updates the
// counts; it reports whether there was one.
func remove(tx *bolt.Tx, tunnel string, id []byte) (bool, error) {
	t := tunnelBucket(tx, tunnel)
	if t == nil {
		return false, nil
	}
	var from *bolt.Bucket
	var v []byte
	for _, name := range [][]byte{bucketQueued, bucketReject} {
		if bk := t.Bucket(name); bk != nil {
			if v = bk.Get(id); v != nil {
				from = bk
				break
			}
		}
	}
	if from == nil {
		return false, nil
	}
	var m meta
	if err := json.Unmarshal(v, &m); err != nil {
		return false, err
	}
	if err := from.Delete(id); err != nil {
		return false, err
	}
	if err := t.Bucket(bucketPayload).Delete(id); err != nil {
		return false, err
	}
	root := tx.Bucket(bucketBuffer)
	if err := putInt(root, keyBytes, getInt(root, keyBytes)-m.Size); err != nil {
		return false, err
	}
	n := getInt(t, keyCount) - 1
	if n <= 0 {
		return true, root.Bucket(bucketTunnels).DeleteBucket([]byte(tunnel))
	}
	return true, errors.Join(putInt(t, keyCount, n), putInt(t, keyTunnelSize, getInt(t, keyTunnelSize)-m.Size))
}

// change runs fn in a batched transaction and returns its outcome: fn's
// error is for the caller (ErrNotFound, ErrLeaseLost), not a reason to roll
// back the other changes of the batch.
func (b *boltBackend) change(fn func(tx *bolt.Tx) (error, error)) error {
	var outcome error
	err := b.db.Batch(func(tx *bolt.Tx) error {
		var err error
		outcome, err = fn(tx)
		return err
	})
	if err != nil {
		return err
	}
	return outcome
}

func (b *boltBackend) drop(_ context.Context, tunnel, id string) error {
	return b.change(func(tx *bolt.Tx) (error, error) {
		ok, err := remove(tx, tunnel, []byte(id))
		if err != nil || ok {
			return nil, err
		}
		return ErrNotFound, nil
	})
}

func (b *boltBackend) dropAll(_ context.Context, tunnel string) (int, error) {
	n := 0
	err := b.db.Update(func(tx *bolt.Tx) error {
		var err error
		n, err = removeBefore(tx, tunnel, nil)
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// removeBefore deletes the tunnel's queued and rejected requests whose IDs
// sort below limit (all of them for nil), and returns how many.
func removeBefore(tx *bolt.Tx, tunnel string, limit []byte) (int, error) {
	t := tunnelBucket(tx, tunnel)
	if t == nil {
		return 0, nil
	}
	var ids [][]byte
	for _, name := range [][]byte{bucketQueued, bucketReject} {
		bk := t.Bucket(name)
		if bk == nil {
			continue
		}
		c := bk.Cursor()
		for k, _ := c.First(); k != nil && (limit == nil || bytes.Compare(k, limit) < 0); k, _ = c.Next() {
			ids = append(ids, bytes.Clone(k)) // out of the cursor's memory before the deletes
		}
	}
	for _, id := range ids {
		if _, err := remove(tx, tunnel, id); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

func (b *boltBackend) expire(_ context.Context, cutoff time.Time) (int, error) {
	limit := []byte(idBefore(cutoff.UnixMilli()))
	n := 0
	err := b.db.Update(func(tx *bolt.Tx) error {
		n = 0
		var tunnels []string
		if err := tx.Bucket(bucketBuffer).Bucket(bucketTunnels).ForEachBucket(func(k []byte) error {
			tunnels = append(tunnels, string(k))
			return nil
		}); err != nil {
			return err
		}
		for _, tunnel := range tunnels {
			m, err := removeBefore(tx, tunnel, limit)
			if err != nil {
				return err
			}
			n += m
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

func (b *boltBackend) requeue(_ context.Context, tunnel, id string, now time.Time) error {
	return b.change(func(tx *bolt.Tx) (error, error) {
		return move(tx, tunnel, id, bucketReject, bucketQueued, func(m *meta) { m.NextAt = now.UnixMilli() })
	})
}

// move moves the request id of tunnel from one state's bucket to another's
// (or the same), changing its meta. Its first result is ErrNotFound when id
// is not in from.
func move(tx *bolt.Tx, tunnel, id string, from, to []byte, change func(*meta)) (error, error) {
	t := tunnelBucket(tx, tunnel)
	if t == nil || t.Bucket(from) == nil {
		return ErrNotFound, nil
	}
	src := t.Bucket(from)
	v := src.Get([]byte(id))
	if v == nil {
		return ErrNotFound, nil
	}
	var m meta
	if err := json.Unmarshal(v, &m); err != nil {
		return nil, err
	}
	change(&m)
	val, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if err := src.Delete([]byte(id)); err != nil {
		return nil, err
	}
	dst, err := t.CreateBucketIfNotExists(to)
	if err != nil {
		return nil, err
	}
	return nil, dst.Put([]byte(id), val)
}

func (b *boltBackend) list(_ context.Context, tunnel string) ([]Entry, error) {
	var list []Entry
	err := b.db.View(func(tx *bolt.Tx) error {
		t := tunnelBucket(tx, tunnel)
		if t == nil {
			return nil
		}
		for _, s := range []struct {
			bucket []byte
			state  State
		}{{bucketQueued, Queued}, {bucketReject, Rejected}} {
			bk := t.Bucket(s.bucket)
			if bk == nil {
				continue
			}
			if err := bk.ForEach(func(k, v []byte) error {
				var m meta
				if err := json.Unmarshal(v, &m); err != nil {
					return err
				}
				e, err := m.entry(tunnel, string(k), s.state)
				list = append(list, e)
				return err
			}); err != nil {
				return err
			}
		}
		return nil
	})
	sortEntries(list)
	return list, err
}

func (b *boltBackend) stats(_ context.Context, tunnel string) (Stats, error) {
	var s Stats
	err := b.db.View(func(tx *bolt.Tx) error {
		s = tunnelStats(tunnelBucket(tx, tunnel))
		return nil
	})
	return s, err
}

func (b *boltBackend) all(context.Context) (map[string]Stats, error) {
	all := map[string]Stats{}
	err := b.db.View(func(tx *bolt.Tx) error {
		tunnels := tx.Bucket(bucketBuffer).Bucket(bucketTunnels)
		return tunnels.ForEachBucket(func(k []byte) error {
			all[string(k)] = tunnelStats(tunnels.Bucket(k))
			return nil
		})
	})
	return all, err
}

// tunnelStats reads the stats of a tunnel's bucket (nil: none).
func tunnelStats(t *bolt.Bucket) Stats {
	var s Stats
	if t == nil {
		return s
	}
	n := int(getInt(t, keyCount))
	s.Bytes = getInt(t, keyTunnelSize)
	var oldest string
	if bk := t.Bucket(bucketReject); bk != nil {
		s.Rejected = bk.Stats().KeyN
		if k, _ := bk.Cursor().First(); k != nil {
			oldest = string(k)
		}
	}
	s.Queued = n - s.Rejected
	if bk := t.Bucket(bucketQueued); bk != nil {
		if k, _ := bk.Cursor().First(); k != nil && (oldest == "" || string(k) < oldest) {
			oldest = string(k)
		}
	}
	if ms, _, ok := parseID(oldest); ok {
		s.Oldest = time.UnixMilli(ms).UTC()
	}
	return s
}

func (b *boltBackend) next(_ context.Context, tunnel string, now time.Time) (string, meta, []byte, error) {
	var id string
	var m meta
	var payload []byte
	err := b.db.View(func(tx *bolt.Tx) error {
		t := tunnelBucket(tx, tunnel)
		if t == nil || t.Bucket(bucketQueued) == nil {
			return ErrEmpty
		}
		k, v := t.Bucket(bucketQueued).Cursor().First()
		if k == nil {
			return ErrEmpty
		}
		id = string(k)
		if err := json.Unmarshal(v, &m); err != nil {
			return err
		}
		if m.NextAt <= now.UnixMilli() {
			// Copied: bbolt's memory is valid only in the transaction.
			payload = bytes.Clone(t.Bucket(bucketPayload).Get(k))
			if payload == nil {
				return errPayload
			}
		}
		return nil
	})
	return id, m, payload, err
}

func (b *boltBackend) lease(tunnel string) *boltLease {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.leases[tunnel]
	if l == nil {
		l = &boltLease{}
		b.leases[tunnel] = l
	}
	return l
}

func (b *boltBackend) acquire(_ context.Context, tunnel string, ttl time.Duration) (holder, error) {
	l := b.lease(tunnel)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.fence != 0 && now.Before(l.expires) {
		return holder{}, ErrLeased
	}
	b.mu.Lock()
	b.fence++
	l.fence = b.fence
	b.mu.Unlock()
	l.expires = now.Add(ttl)
	return holder{tunnel: tunnel, fence: l.fence}, nil
}

// holding runs fn while h holds its lease, or returns ErrLeaseLost.
func (b *boltBackend) holding(h holder, fn func() error) error {
	l := b.lease(h.tunnel)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fence != h.fence || !time.Now().Before(l.expires) {
		return ErrLeaseLost
	}
	return fn()
}

func (b *boltBackend) renew(_ context.Context, h holder, ttl time.Duration) error {
	return b.holding(h, func() error {
		b.lease(h.tunnel).expires = time.Now().Add(ttl)
		return nil
	})
}

func (b *boltBackend) release(_ context.Context, h holder) error {
	l := b.lease(h.tunnel)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fence == h.fence {
		l.fence = 0
	}
	return nil
}

func (b *boltBackend) ack(_ context.Context, h holder, id string) error {
	return b.holding(h, func() error {
		return b.change(func(tx *bolt.Tx) (error, error) {
			if t := tunnelBucket(tx, h.tunnel); t == nil || t.Bucket(bucketQueued) == nil || t.Bucket(bucketQueued).Get([]byte(id)) == nil {
				return ErrNotFound, nil
			}
			_, err := remove(tx, h.tunnel, []byte(id))
			return nil, err
		})
	})
}

func (b *boltBackend) retry(_ context.Context, h holder, id string, f Failure) error {
	return b.holding(h, func() error {
		return b.change(func(tx *bolt.Tx) (error, error) {
			return move(tx, h.tunnel, id, bucketQueued, bucketQueued, func(m *meta) { m.failed(f) })
		})
	})
}

func (b *boltBackend) reject(_ context.Context, h holder, id, reason string) error {
	return b.holding(h, func() error {
		return b.change(func(tx *bolt.Tx) (error, error) {
			return move(tx, h.tunnel, id, bucketQueued, bucketReject, func(m *meta) { m.rejected(reason) })
		})
	})
}
