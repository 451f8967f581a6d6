package registry

import "errors"

// Backing says where the state the replicas share beyond their holds
// (revocations, remembered routes, the webhook buffer) is kept: with a Redis
// registry in its Redis, on a single replica with --data-dir in the Store,
// and otherwise in this process's memory only. At most one of the fields is
// set; the zero Backing is memory.
type Backing struct {
	// Redis is the registry's Redis (Redis.Conn), with a Redis registry.
	Redis *RedisConn
	// Store is the embedded database in --data-dir, on a single replica.
	Store *Store
}

// BackingFor is where a server keeps its shared state: in Redis with a
// Redis registry, else in store (--data-dir; nil without one), else in
// memory. Giving a store to a server with a Redis registry is an error: the
// replicas share their state in Redis.
func BackingFor(reg Registry, store *Store) (Backing, error) {
	b := Backing{Store: store}
	if r, ok := reg.(*Redis); ok {
		b.Redis = r.Conn()
	}
	return b, b.valid()
}

// Where the state is kept, as Backing.Kind says it.
const (
	KindMemory  = "memory"
	KindDataDir = "data-dir"
	KindRedis   = "redis"
)

// Kind is KindRedis, KindDataDir or KindMemory.
func (b Backing) Kind() string {
	switch {
	case b.Redis != nil:
		return KindRedis
	case b.Store != nil:
		return KindDataDir
	}
	return KindMemory
}

// Durable reports whether the state outlives this process. When it does
// not, the server says so at start: revocations are forgotten on a restart,
// and webhooks cannot be buffered.
func (b Backing) Durable() bool { return b.Kind() != KindMemory }

// valid reports the misuse of setting both.
func (b Backing) valid() error {
	if b.Redis != nil && b.Store != nil {
		return errBothBackings
	}
	return nil
}

// errBothBackings is returned when state is given both Redis and a data
// directory: with replicas sharing Redis, a replica's own directory would
// hide what the others wrote.
var errBothBackings = errors.New("--data-dir is for a single replica; with a Redis --registry the replicas share their state in Redis: leave --data-dir out")
