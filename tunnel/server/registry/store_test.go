package registry

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestStoreFile: the file is its owner's only, even when it was created
// wider (a volume with group access); a second process cannot open it; a
// layout from a newer tether is refused.
func TestStoreFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s := openStore(t, dir)
	path := filepath.Join(dir, StoreFile)
	if s.Path() != path {
		t.Errorf("path: got %s, want %s", s.Path(), path)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, path: 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("mode of %s: got %v, want %v", p, got, want)
		}
	}
	if _, err := OpenStore(dir); err == nil || !strings.Contains(err.Error(), "another process holds it") {
		t.Errorf("a second open of the same directory: got %v, want it refused", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}

	if err := os.Chmod(path, 0o664); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode after reopening a 0664 file: got %v, want 0600", fi.Mode().Perm())
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("version"), binary.BigEndian.AppendUint64(nil, storeVersion+1))
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := OpenStore(dir); err == nil || !strings.Contains(err.Error(), "newer tether") {
		t.Errorf("opening a newer layout: got %v, want it refused", err)
	}
	if _, err := OpenStore(""); err == nil {
		t.Error("OpenStore(\"\") succeeded")
	}
}

// TestBackingBoth: state is in Redis or in a data directory, not both.
func TestBackingBoth(t *testing.T) {
	b := Backing{Store: openStore(t, t.TempDir()), Redis: redisConn(t, "redis://127.0.0.1:1", "a")}
	if _, err := NewRevocations(b, nopLog); err == nil {
		t.Error("NewRevocations with both backings succeeded")
	}
	if _, err := NewRoutes(RoutesConfig{}, b, nopLog); err == nil {
		t.Error("NewRoutes with both backings succeeded")
	}
	reg := newReplica(t, "redis://127.0.0.1:1", "a", "")
	if _, err := BackingFor(reg.Redis, b.Store); err == nil {
		t.Error("BackingFor a Redis registry and a data directory succeeded")
	}
	if got, err := BackingFor(reg.Redis, nil); err != nil || got.Redis != reg.Conn() {
		t.Errorf("BackingFor a Redis registry: got %+v, %v; want its Redis", got, err)
	}
	if got, err := BackingFor(NewMemory("a", ""), b.Store); err != nil || got.Store != b.Store || got.Redis != nil {
		t.Errorf("BackingFor a memory registry and a store: got %+v, %v; want the store", got, err)
	}
	for want, b := range map[string]Backing{KindMemory: {}, KindDataDir: {Store: b.Store}, KindRedis: {Redis: b.Redis}} {
		if b.Kind() != want || b.Durable() != (want != KindMemory) {
			t.Errorf("kind %s, durable %v; want %s", b.Kind(), b.Durable(), want)
		}
	}
}
