package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// DefaultRetention is how long a tunnel's routes are remembered after it
// was last seen, and how long the webhook buffer keeps a request
// (--buffer-retention).
const DefaultRetention = 72 * time.Hour

// Bounds of what Remember keeps of one login; the server accepts fewer
// routes than this, so they only stop a caller that forgot to check.
const (
	maxRememberedRoutes     = 64
	maxRememberedRouteBytes = 32 << 10
)

// Remembered is what the registry remembers of a tunnel that logged in: the
// routes its last login advertised, and when it was last seen.
type Remembered struct {
	Tunnel string `json:"tunnel"`
	// Routes are the route specs of the last login, as the client sent
	// them (e.g. "/webhooks=http://events:12000;buffer").
	Routes []string `json:"routes"`
	// LastLogin is when a session of the tunnel last logged in.
	LastLogin time.Time `json:"last_login"`
	// LastSeen is when the tunnel was last known to have a session: its
	// last login, the end of its last session, or the last refresh while
	// one lived. It is remembered until LastSeen plus the retention.
	LastSeen time.Time `json:"last_seen"`
}

// RoutesConfig configures Routes. Zero values take the documented defaults.
type RoutesConfig struct {
	// Retention is how long a tunnel is remembered after it was last seen
	// (--buffer-retention). Default DefaultRetention.
	Retention time.Duration
}

// routesBackend keeps remembered routes where Backing says. Its methods are
// safe for concurrent use.
type routesBackend interface {
	// write stores each entry durably, until its LastSeen plus retention.
	write(ctx context.Context, list []Remembered, retention time.Duration) error
	// read returns what is stored of tunnel, if anything.
	read(ctx context.Context, tunnel string) (Remembered, bool, error)
	// prune deletes the entries last seen before cutoff (Redis expires its
	// keys on its own).
	prune(ctx context.Context, cutoff time.Time) error
	close() error
}

// Routes remembers, for each tunnel seen within the retention, the routes
// its last login advertised, shared by the replicas as Backing says, so
// that any replica can tell whether a request for a tunnel that is down may
// be buffered. Remember and Left never wait on I/O: a background loop (Run)
// writes.
type Routes struct {
	backend   routesBackend
	kind      string
	retention time.Duration
	refresh   time.Duration // how often live tunnels' LastSeen is rewritten
	log       *zap.Logger
	health    *outage // nil unless Redis
	kick      chan struct{}

	mu sync.Mutex
	// live is the tunnels with sessions here, as their last login left
	// them.
	live map[string]Remembered
	// dirty is what the next write stores, by tunnel.
	dirty map[string]Remembered

	closeOnce sync.Once
	closeErr  error
}

// NewRoutes returns the remembered routes kept as b says. It starts no
// goroutine; Run writes.
func NewRoutes(cfg RoutesConfig, b Backing, log *zap.Logger) (*Routes, error) {
	if err := b.valid(); err != nil {
		return nil, err
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Retention < 0 {
		return nil, fmt.Errorf("--buffer-retention %v: want a positive duration, e.g. %v", cfg.Retention, DefaultRetention)
	}
	log = log.Named("routes")
	r := &Routes{
		kind:      b.Kind(),
		retention: cfg.Retention,
		refresh:   min(max(cfg.Retention/8, time.Second), time.Hour),
		log:       log,
		kick:      make(chan struct{}, 1),
		live:      map[string]Remembered{},
		dirty:     map[string]Remembered{},
	}
	switch b.Kind() {
	case KindRedis:
		r.backend = newRedisRoutes(b.Redis)
		r.health = newOutage(log, "remembered routes", b.Redis.Target())
	case KindDataDir:
		r.backend = boltRoutes{b.Store.db}
	default:
		r.backend = &memoryRoutes{m: map[string]Remembered{}}
	}
	return r, nil
}

// Kind says where the routes are kept: KindRedis, KindDataDir or
// KindMemory.
func (r *Routes) Kind() string { return r.kind }

// Retention is how long a tunnel is remembered after it was last seen.
func (r *Routes) Retention() time.Duration { return r.retention }

// Remember records a login of tunnel that advertised routes, and that the
// tunnel has a session here until Left. Call it at every login; it does not
// block.
func (r *Routes) Remember(tunnel string, routes []string) error {
	if tunnel == "" {
		return errors.New("remember routes: the tunnel name is empty")
	}
	if err := validKey("tunnel", tunnel, maxTunnelLength); err != nil {
		return err
	}
	size := 0
	for _, s := range routes {
		size += len(s)
	}
	if len(routes) > maxRememberedRoutes || size > maxRememberedRouteBytes {
		return fmt.Errorf("tunnel %s advertised %d routes of %d bytes; tether remembers at most %d routes of %d bytes in all",
			tunnel, len(routes), size, maxRememberedRoutes, maxRememberedRouteBytes)
	}
	now := time.Now().UTC()
	rem := Remembered{Tunnel: tunnel, Routes: slices.Clone(routes), LastLogin: now, LastSeen: now}
	r.mu.Lock()
	r.live[tunnel] = rem
	r.dirty[tunnel] = rem
	r.mu.Unlock()
	r.wake()
	return nil
}

// Left records that the last session of tunnel here ended: it was seen
// now, and is remembered for the retention from now. It does not block.
func (r *Routes) Left(tunnel string) {
	r.mu.Lock()
	rem, ok := r.live[tunnel]
	if ok {
		delete(r.live, tunnel)
		rem.LastSeen = time.Now().UTC()
		r.dirty[tunnel] = rem
	}
	r.mu.Unlock()
	if ok {
		r.wake()
	}
}

// Lookup returns what is remembered of tunnel, if it was seen within the
// retention: from memory when it has a session here or was seen here since
// the last write, otherwise from the store (one Redis round trip).
func (r *Routes) Lookup(ctx context.Context, tunnel string) (Remembered, bool, error) {
	r.mu.Lock()
	rem, here := r.live[tunnel]
	if here {
		rem.LastSeen = time.Now().UTC()
	} else {
		rem, here = r.dirty[tunnel]
	}
	r.mu.Unlock()
	if !here {
		var stored bool
		var err error
		rem, stored, err = r.backend.read(ctx, tunnel)
		if err != nil {
			return Remembered{}, false, fmt.Errorf("read the remembered routes of tunnel %s: %w", tunnel, err)
		}
		if !stored {
			return Remembered{}, false, nil
		}
	}
	if time.Since(rem.LastSeen) >= r.retention {
		return Remembered{}, false, nil
	}
	rem.Routes = slices.Clone(rem.Routes)
	return rem, true, nil
}

// Run writes what Remember and Left recorded, rewrites the LastSeen of the
// tunnels with sessions here at intervals (so that a tunnel served for
// longer than the retention is not forgotten if this replica dies), prunes
// what the retention ended, and retries with backoff while the store
// fails. When ctx ends it writes what is pending (bounded by a few seconds)
// and returns. Call it once.
func (r *Routes) Run(ctx context.Context) error {
	refresh := time.NewTicker(r.refresh)
	defer refresh.Stop()
	backoff := minBackoff
	var retry <-chan time.Time // not nil while failing
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			err := r.flush(final)
			cancel()
			if err != nil {
				r.log.Warn("could not write the remembered routes on stop", zap.Error(err))
			}
			return nil
		case <-r.kick:
			if retry != nil {
				continue // what changed waits for the retry
			}
		case <-retry:
		case <-refresh.C:
			r.touchLive()
			if err := r.backend.prune(ctx, time.Now().Add(-r.retention)); err != nil && ctx.Err() == nil {
				r.log.Debug("prune remembered routes", zap.Error(err))
			}
		}
		retry = nil
		if err := r.flush(ctx); err != nil {
			if ctx.Err() != nil {
				continue
			}
			if r.health != nil {
				r.health.fail(err)
			} else {
				r.log.Warn("could not write the remembered routes; retrying", zap.Error(err))
			}
			retry = time.After(backoff)
			backoff = min(2*backoff, r.refresh)
			continue
		}
		if r.health != nil {
			r.health.ok()
		}
		backoff = minBackoff
	}
}

// Close releases the connection to Redis, if any. It is idempotent; call
// it after Run returned.
func (r *Routes) Close() error {
	r.closeOnce.Do(func() { r.closeErr = r.backend.close() })
	return r.closeErr
}

func (r *Routes) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// touchLive marks every tunnel with a session here as seen now.
func (r *Routes) touchLive() {
	now := time.Now().UTC()
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, rem := range r.live {
		rem.LastSeen = now
		r.live[name] = rem
		r.dirty[name] = rem
	}
}

// flush writes what is dirty. On failure it keeps what was not written,
// unless a newer state of the same tunnel came meanwhile.
func (r *Routes) flush(ctx context.Context) error {
	r.mu.Lock()
	dirty := r.dirty
	r.dirty = map[string]Remembered{}
	r.mu.Unlock()
	if len(dirty) == 0 {
		return nil
	}
	err := r.backend.write(ctx, slices.Collect(maps.Values(dirty)), r.retention)
	if err == nil {
		return nil
	}
	r.mu.Lock()
	for name, rem := range dirty {
		if _, newer := r.dirty[name]; !newer {
			r.dirty[name] = rem
		}
	}
	r.mu.Unlock()
	return err
}

// memoryRoutes keeps remembered routes of a replica without a data
// directory or Redis: they end with the process.
type memoryRoutes struct {
	mu sync.Mutex
	m  map[string]Remembered
}

func (m *memoryRoutes) write(_ context.Context, list []Remembered, _ time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, rem := range list {
		m.m[rem.Tunnel] = rem
	}
	return nil
}

func (m *memoryRoutes) read(_ context.Context, tunnel string) (Remembered, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rem, ok := m.m[tunnel]
	return rem, ok, nil
}

func (m *memoryRoutes) prune(_ context.Context, cutoff time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	maps.DeleteFunc(m.m, func(_ string, rem Remembered) bool { return rem.LastSeen.Before(cutoff) })
	return nil
}

func (m *memoryRoutes) close() error { return nil }
