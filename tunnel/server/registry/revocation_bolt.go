package registry

import (
	"context"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// boltRevocations keeps the revocations of a single replica in the data
// directory's bucket "revocations": ID → JSON Revocation. Each change is one
// fsynced transaction.
type boltRevocations struct{ db *bolt.DB }

func (b boltRevocations) add(_ context.Context, rev Revocation, limit int) error {
	val, err := json.Marshal(rev)
	if err != nil {
		return err
	}
	return b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRevocations)
		if bk.Stats().KeyN >= limit {
			return ErrTooManyRevocations
		}
		return bk.Put([]byte(rev.ID), val)
	})
}

func (b boltRevocations) remove(_ context.Context, ids ...string) (int, error) {
	n := 0
	err := b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRevocations)
		for _, id := range ids {
			if bk.Get([]byte(id)) == nil {
				continue
			}
			if err := bk.Delete([]byte(id)); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

func (b boltRevocations) load(context.Context, *revocationSet) (uint64, map[string]Revocation, error) {
	revs := map[string]Revocation{}
	err := b.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRevocations).ForEach(func(k, v []byte) error {
			var rev Revocation
			if err := json.Unmarshal(v, &rev); err != nil {
				return fmt.Errorf("revocation %q: %w", k, err)
			}
			revs[rev.ID] = rev
			return nil
		})
	})
	return 0, revs, err
}

func (boltRevocations) watch(ctx context.Context, _ *Revocations) { <-ctx.Done() }

func (boltRevocations) close() error { return nil }
