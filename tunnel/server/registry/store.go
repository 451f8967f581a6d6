package registry

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// StoreFile is the name of the embedded database in --data-dir.
const StoreFile = "tether.db"

// storeVersion is the layout of the database this code reads and writes; a
// file written by a newer layout is refused rather than misread.
const storeVersion = 1

// Buckets of the embedded database: one per kind of state.
var (
	bucketMeta        = []byte("meta")        // "version": storeVersion, 8 bytes big-endian
	bucketRevocations = []byte("revocations") // revocation ID → JSON Revocation
	bucketRoutes      = []byte("routes")      // tunnel → JSON Remembered
)

// Store is the embedded database of a single replica in --data-dir: one
// bbolt file, DIR/tether.db, with a bucket per kind of state (revocations,
// remembered routes, the webhook buffer). The server opens it once and hands
// it to each user; each write is fsynced before the call that made it
// returns. The file is readable by its owner only (0600): it holds tenants'
// buffered requests.
//
// One process at a time holds the file: a second server on the same
// directory fails to open it instead of corrupting it.
type Store struct {
	db *bolt.DB
}

// lockWait is how long OpenStore waits for another process to let go of the
// file.
const lockWait = time.Second

// OpenStore opens (or creates) the embedded database in dir, creating dir
// (0700) when it does not exist. Close it when the server stops.
func OpenStore(dir string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("--data-dir is empty: name a directory on a persistent volume, or leave the flag out to keep state in memory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create --data-dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, StoreFile)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockWait, FreelistType: bolt.FreelistMapType})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, fmt.Errorf("open %s: another process holds it (a second tether server on the same --data-dir?); give each replica its own directory, or share state through --registry redis://…", path)
	case err != nil:
		return nil, fmt.Errorf("open %s: %w; check that --data-dir is writable by the server's user", path, err)
	}
	// bbolt creates the file 0600, but an existing one keeps its mode: a
	// volume mounted with group access (Kubernetes fsGroup) widens it.
	if err := os.Chmod(path, 0o600); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("make %s readable by its owner only: %w", path, err)
	}
	// A lone write (a webhook's 202) waits this long for others to share
	// its fsync; concurrent writes queue behind the commit in flight
	// anyway, so a short window costs little sharing (BENCHMARKS.md).
	db.MaxBatchDelay = time.Millisecond
	s := &Store{db: db}
	if err := s.init(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return s, nil
}

// init checks the layout version and creates the shared buckets.
func (s *Store) init() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get([]byte("version")); v != nil {
			if len(v) != 8 {
				return errors.New("the layout version is unreadable: this file was not written by tether")
			}
			if got := binary.BigEndian.Uint64(v); got > storeVersion {
				return fmt.Errorf("written by a newer tether (layout %d; this one reads %d): run that version, or start with an empty --data-dir", got, storeVersion)
			}
		}
		if err := meta.Put([]byte("version"), binary.BigEndian.AppendUint64(nil, storeVersion)); err != nil {
			return err
		}
		for _, b := range [][]byte{bucketRevocations, bucketRoutes} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
}

// DB is the database, for the packages that keep their own buckets in it
// (the webhook buffer). They must not close it.
func (s *Store) DB() *bolt.DB { return s.db }

// Path is the database file.
func (s *Store) Path() string { return s.db.Path() }

// Close closes the database. It is idempotent; the users of the store must
// have stopped.
func (s *Store) Close() error { return s.db.Close() }
