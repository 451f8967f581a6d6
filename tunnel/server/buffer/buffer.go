package buffer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel/server/registry"
)

// Defaults of Config.
const (
	DefaultMaxRequests   = 1000
	DefaultMaxBytes      = 64 << 20
	DefaultMaxTotalBytes = 1 << 30
	DefaultLeaseTTL      = 10 * time.Second
)

// Config configures a Buffer. Zero values take the documented defaults.
type Config struct {
	// Retention is how long a request is kept, delivered or not
	// (--buffer-retention). Default registry.DefaultRetention (72h).
	Retention time.Duration
	// MaxRequests is the most requests one tunnel may have stored, queued
	// and rejected together (--buffer-max-requests). Default 1000.
	MaxRequests int
	// MaxBytes is the most bytes one tunnel may have stored
	// (--buffer-max-bytes). Default 64 MiB.
	MaxBytes int64
	// MaxTotalBytes is the most bytes stored for all tunnels: with Redis,
	// by all replicas, in Redis's memory (--buffer-max-total-bytes).
	// Default 1 GiB.
	MaxTotalBytes int64
	// LeaseTTL is how long a deliverer's lease lasts without renewal: how
	// long a tunnel's queue waits after its deliverer died. Default 10s.
	LeaseTTL time.Duration
}

func (c Config) withDefaults() Config {
	if c.Retention == 0 {
		c.Retention = registry.DefaultRetention
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = DefaultMaxRequests
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.MaxTotalBytes == 0 {
		c.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	return c
}

// validate reports every problem of c, which has its defaults.
func (c Config) validate() error {
	var errs []error
	if c.Retention < 0 {
		errs = append(errs, fmt.Errorf("--buffer-retention %v: want a positive duration, e.g. %v", c.Retention, registry.DefaultRetention))
	}
	if c.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("--buffer-max-requests %d: want a positive number, e.g. %d", c.MaxRequests, DefaultMaxRequests))
	}
	if c.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("--buffer-max-bytes %d: want a positive number, e.g. %d", c.MaxBytes, DefaultMaxBytes))
	}
	if c.MaxTotalBytes < c.MaxBytes {
		errs = append(errs, fmt.Errorf("--buffer-max-total-bytes %d is below --buffer-max-bytes %d: the server-wide cap must hold at least one tunnel's", c.MaxTotalBytes, c.MaxBytes))
	}
	if c.LeaseTTL < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("buffer lease TTL %v: want at least 100ms", c.LeaseTTL))
	}
	return errors.Join(errs...)
}

// State is where a stored request is.
type State string

// States of a stored request.
const (
	// Queued requests wait for delivery, the oldest first.
	Queued State = "queued"
	// Rejected requests were refused by their upstream (a 4xx): kept
	// visible until dropped, requeued or expired.
	Rejected State = "rejected"
)

// Entry is what a listing shows of a stored request: never its body,
// headers or query.
type Entry struct {
	ID       string    `json:"id"`
	Tunnel   string    `json:"tunnel"`
	State    State     `json:"state"`
	QueuedAt time.Time `json:"queued_at"`
	Method   string    `json:"method"`
	// Path is the request's path, without the query.
	Path string `json:"path"`
	// Size is what the request counts against the quotas, in bytes.
	Size int64 `json:"size"`
	// Attempts counts the deliveries that reached the tunnel's client.
	Attempts int `json:"attempts"`
	// LastError says why the last attempt failed; empty before one did.
	LastError string `json:"last_error,omitempty"`
	// NextAttemptAt is when a queued request is due; zero means now.
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
}

// Request is a request to store and, as Lease.Next returns it, to deliver.
type Request struct {
	// Entry: Append reads Tunnel and Method, and sets the rest.
	Entry
	// URI is the request URI as received: path and query.
	URI    string
	Header http.Header
	Body   []byte
}

// Stats is the state of one tunnel's buffer.
type Stats struct {
	Queued   int   `json:"queued"`
	Rejected int   `json:"rejected"`
	Bytes    int64 `json:"bytes"`
	// Oldest is when the oldest stored request (queued or rejected) was
	// accepted; zero when there is none.
	Oldest time.Time `json:"oldest,omitzero"`
}

// Failure is what a delivery attempt to be retried left.
type Failure struct {
	// Err says what went wrong, for listings: a status or a transport
	// error, never a body.
	Err string
	// Reached is true when the attempt reached the tunnel's client; only
	// then does it count in Attempts.
	Reached bool
	// NextAttemptAt is when to try again.
	NextAttemptAt time.Time
}

// Counts are what this process's Buffer did since it was made, for the
// metric tether_buffer_requests_total{outcome}.
type Counts struct {
	Accepted  uint64 `json:"accepted"`
	Full      uint64 `json:"full"`
	Delivered uint64 `json:"delivered"`
	Rejected  uint64 `json:"rejected"`
	Expired   uint64 `json:"expired"`
	Dropped   uint64 `json:"dropped"`
}

// Errors callers branch on.
var (
	// ErrDisabled is returned by Open without a data directory or Redis:
	// the server does not buffer, and says so at start.
	ErrDisabled = errors.New("webhook buffering is off: it needs --data-dir on a single replica, or a Redis --registry")
	// ErrFull is matched by the error of an Append past a quota; the
	// server answers 503 with X-Tether-Error: buffer_full.
	ErrFull = errors.New("buffer full")
	// ErrEmpty is returned by Lease.Next when nothing is queued.
	ErrEmpty = errors.New("nothing queued")
	// ErrNotDue is matched by the *NotDueError of Lease.Next when the
	// oldest queued request waits for its retry.
	ErrNotDue = errors.New("not due")
	// ErrLeased is returned by Acquire when another deliverer holds the
	// tunnel's lease.
	ErrLeased = errors.New("another deliverer holds the lease")
	// ErrLeaseLost is returned by a Lease's changes once the lease expired
	// or another deliverer took it: stop delivering.
	ErrLeaseLost = errors.New("lease lost")
	// ErrNotFound is returned for an ID that names no stored request (of
	// the state the call wants).
	ErrNotFound = errors.New("no such buffered request")
)

// FullError is the error of an Append past a quota. It matches ErrFull.
type FullError struct {
	Tunnel string
	// Flag names the quota: --buffer-max-requests, --buffer-max-bytes or
	// --buffer-max-total-bytes.
	Flag string
	// Used is what is stored (requests, or bytes), Size what the request
	// would add, Limit the quota.
	Used, Size, Limit int64
}

func (e *FullError) Error() string {
	switch e.Flag {
	case FlagMaxRequests:
		return fmt.Sprintf("buffer of tunnel %s holds %d requests, the most %s allows", e.Tunnel, e.Used, e.Flag)
	case FlagMaxBytes:
		return fmt.Sprintf("buffer of tunnel %s holds %d bytes; a request of %d would pass %s (%d)", e.Tunnel, e.Used, e.Size, e.Flag, e.Limit)
	}
	return fmt.Sprintf("buffers of all tunnels hold %d bytes; a request of %d for tunnel %s would pass %s (%d)", e.Used, e.Size, e.Tunnel, e.Flag, e.Limit)
}

// Is makes a FullError match ErrFull.
func (e *FullError) Is(target error) bool { return target == ErrFull }

// The quotas, as FullError.Flag names them: the server's flags.
const (
	FlagMaxRequests   = "--buffer-max-requests"
	FlagMaxBytes      = "--buffer-max-bytes"
	FlagMaxTotalBytes = "--buffer-max-total-bytes"
)

// NotDueError is the error of Lease.Next when the oldest queued request
// waits for its retry. It matches ErrNotDue.
type NotDueError struct {
	ID string
	At time.Time
}

func (e *NotDueError) Error() string {
	return fmt.Sprintf("buffered request %s is due at %s", e.ID, e.At.Format(time.RFC3339Nano))
}

// Is makes a NotDueError match ErrNotDue.
func (e *NotDueError) Is(target error) bool { return target == ErrNotDue }

// backend is a store of buffered requests: bbolt or Redis. Buffer checks
// what callers give and counts; a backend stores. Its methods are safe for
// concurrent use.
type backend interface {
	// append stores a request of size bytes unless a quota would be
	// passed (*FullError), and returns its ID once durable.
	append(ctx context.Context, tunnel string, m meta, payload []byte, q quotas) (string, error)
	list(ctx context.Context, tunnel string) ([]Entry, error)
	stats(ctx context.Context, tunnel string) (Stats, error)
	all(ctx context.Context) (map[string]Stats, error)
	requeue(ctx context.Context, tunnel, id string, now time.Time) error
	drop(ctx context.Context, tunnel, id string) error
	dropAll(ctx context.Context, tunnel string) (int, error)
	// expire drops the requests accepted before cutoff.
	expire(ctx context.Context, cutoff time.Time) (int, error)

	// acquire takes the tunnel's lease for ttl, or fails with ErrLeased.
	acquire(ctx context.Context, tunnel string, ttl time.Duration) (holder, error)
	renew(ctx context.Context, h holder, ttl time.Duration) error
	release(ctx context.Context, h holder) error
	// next returns the oldest queued request, its payload only when due
	// at now.
	next(ctx context.Context, tunnel string, now time.Time) (id string, m meta, payload []byte, err error)
	ack(ctx context.Context, h holder, id string) error
	retry(ctx context.Context, h holder, id string, f Failure) error
	reject(ctx context.Context, h holder, id, reason string) error

	close() error
}

// quotas are the limits an append checks.
type quotas struct {
	requests     int
	bytes, total int64
}

// holder identifies a lease: its tunnel and fencing number, and for Redis
// the value of the lease key.
type holder struct {
	tunnel string
	fence  uint64
	value  string
}

// Buffer is the store of buffered webhooks; the package doc tells what it
// does. Its methods are safe for concurrent use.
type Buffer struct {
	cfg     Config
	backend backend
	kind    string
	log     *zap.Logger

	accepted, full, delivered, rejected, expired, dropped atomic.Uint64

	closeOnce sync.Once
	closeErr  error
}

// Open returns the buffer kept as b says: ErrDisabled for memory. It
// validates cfg, and starts no goroutine: Run expires.
func Open(cfg Config, b registry.Backing, log *zap.Logger) (*Buffer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	buf := &Buffer{cfg: cfg, kind: b.Kind(), log: log.Named("buffer")}
	switch b.Kind() {
	case registry.KindRedis:
		if b.Store != nil {
			return nil, errors.New("the buffer is kept in Redis or in --data-dir, not both: leave --data-dir out with a Redis --registry")
		}
		buf.backend = newRedisBackend(b.Redis)
	case registry.KindDataDir:
		be, err := newBoltBackend(b.Store.DB())
		if err != nil {
			return nil, fmt.Errorf("open the buffer in %s: %w", b.Store.Path(), err)
		}
		buf.backend = be
	default:
		return nil, ErrDisabled
	}
	return buf, nil
}

// Kind says where requests are stored: registry.KindRedis or
// registry.KindDataDir.
func (b *Buffer) Kind() string { return b.kind }

// Config is the buffer's configuration, with its defaults.
func (b *Buffer) Config() Config { return b.cfg }

// Append stores r for r.Tunnel and returns its entry once the store has
// written it durably. Past a quota it fails with a *FullError (ErrFull).
func (b *Buffer) Append(ctx context.Context, r *Request) (Entry, error) {
	if err := checkRequest(r); err != nil {
		return Entry{}, err
	}
	size := requestSize(r)
	path, _, _ := strings.Cut(r.URI, "?")
	m := meta{Method: r.Method, Path: path, Size: size}
	id, err := b.backend.append(ctx, r.Tunnel, m, encodePayload(r.URI, r.Header, r.Body),
		quotas{b.cfg.MaxRequests, b.cfg.MaxBytes, b.cfg.MaxTotalBytes})
	if err != nil {
		if errors.Is(err, ErrFull) {
			b.full.Add(1)
			return Entry{}, err
		}
		return Entry{}, fmt.Errorf("buffer a request for tunnel %s: %w", r.Tunnel, err)
	}
	b.accepted.Add(1)
	return m.entry(r.Tunnel, id, Queued)
}

// List returns the tunnel's stored requests, queued and rejected, by ID:
// metadata only.
func (b *Buffer) List(ctx context.Context, tunnel string) ([]Entry, error) {
	list, err := b.backend.list(ctx, tunnel)
	if err != nil {
		return nil, fmt.Errorf("list the buffer of tunnel %s: %w", tunnel, err)
	}
	return list, nil
}

// Stats returns the state of the tunnel's buffer.
func (b *Buffer) Stats(ctx context.Context, tunnel string) (Stats, error) {
	s, err := b.backend.stats(ctx, tunnel)
	if err != nil {
		return Stats{}, fmt.Errorf("read the buffer of tunnel %s: %w", tunnel, err)
	}
	return s, nil
}

// All returns the state of every tunnel that has stored requests.
func (b *Buffer) All(ctx context.Context) (map[string]Stats, error) {
	all, err := b.backend.all(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the buffers: %w", err)
	}
	return all, nil
}

// Requeue puts the rejected request id back in the tunnel's queue, due now,
// at its place by ID. ErrNotFound if id is not a rejected request of the
// tunnel.
func (b *Buffer) Requeue(ctx context.Context, tunnel, id string) error {
	if err := b.backend.requeue(ctx, tunnel, id, time.Now()); err != nil {
		return fmt.Errorf("requeue buffered request %s of tunnel %s: %w", id, tunnel, err)
	}
	return nil
}

// Drop deletes the stored request id of the tunnel, queued or rejected.
func (b *Buffer) Drop(ctx context.Context, tunnel, id string) error {
	if err := b.backend.drop(ctx, tunnel, id); err != nil {
		return fmt.Errorf("drop buffered request %s of tunnel %s: %w", id, tunnel, err)
	}
	b.dropped.Add(1)
	return nil
}

// DropAll deletes every stored request of the tunnel and returns how many
// there were.
func (b *Buffer) DropAll(ctx context.Context, tunnel string) (int, error) {
	n, err := b.backend.dropAll(ctx, tunnel)
	b.dropped.Add(uint64(n)) //nolint:gosec // a count, never negative
	if err != nil {
		return n, fmt.Errorf("drop the buffer of tunnel %s: %w", tunnel, err)
	}
	return n, nil
}

// Expire drops the requests accepted more than the retention ago, and
// returns how many it dropped. Run calls it at intervals.
func (b *Buffer) Expire(ctx context.Context) (int, error) {
	n, err := b.backend.expire(ctx, time.Now().Add(-b.cfg.Retention))
	b.expired.Add(uint64(n)) //nolint:gosec // a count, never negative
	if err != nil {
		return n, fmt.Errorf("expire buffered requests: %w", err)
	}
	return n, nil
}

// Counts returns what this Buffer did since it was made.
func (b *Buffer) Counts() Counts {
	return Counts{
		Accepted: b.accepted.Load(), Full: b.full.Load(), Delivered: b.delivered.Load(),
		Rejected: b.rejected.Load(), Expired: b.expired.Load(), Dropped: b.dropped.Load(),
	}
}

// expireEvery is how often Run expires: often enough that a request is
// dropped soon after its retention ends.
func (b *Buffer) expireEvery() time.Duration {
	return min(max(b.cfg.Retention/100, 100*time.Millisecond), time.Minute)
}

// Run drops the requests that outlived the retention, at intervals, until
// ctx ends. Call it once.
func (b *Buffer) Run(ctx context.Context) error {
	t := time.NewTicker(b.expireEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := b.Expire(ctx)
		if n > 0 {
			b.log.Info("dropped buffered requests older than the retention", zap.Int("requests", n), zap.Duration("retention", b.cfg.Retention))
		}
		if err != nil && ctx.Err() == nil {
			b.log.Warn("could not expire buffered requests; retrying", zap.Error(err))
		}
	}
}

// Close releases the connection to Redis, if any; the data directory's
// store is the server's to close. It is idempotent; call it after Run
// returned and the deliverers stopped.
func (b *Buffer) Close() error {
	b.closeOnce.Do(func() { b.closeErr = b.backend.close() })
	return b.closeErr
}

// Acquire takes the tunnel's delivery lease, or fails with ErrLeased while
// another deliverer (here or on another replica) holds it. The holder
// renews it (Keep or Renew) more often than Config.LeaseTTL, and releases
// it when done.
func (b *Buffer) Acquire(ctx context.Context, tunnel string) (*Lease, error) {
	h, err := b.backend.acquire(ctx, tunnel, b.cfg.LeaseTTL)
	if err != nil {
		return nil, fmt.Errorf("acquire the delivery lease of tunnel %s: %w", tunnel, err)
	}
	return &Lease{b: b, h: h}, nil
}

// Lease is one deliverer's exclusive right to deliver a tunnel's queue. Its
// changes fail with ErrLeaseLost once it expired or was taken over. Its
// methods may be called from several goroutines (a renewal beside a
// delivery).
type Lease struct {
	b *Buffer
	h holder
}

// Tunnel is the tunnel whose queue the lease is for.
func (l *Lease) Tunnel() string { return l.h.tunnel }

// Fence is the lease's fencing number: larger for each lease of the store.
func (l *Lease) Fence() uint64 { return l.h.fence }

// Next returns the oldest queued request of the tunnel, body included:
// ErrEmpty when there is none, a *NotDueError (ErrNotDue) when it waits
// for a retry.
func (l *Lease) Next(ctx context.Context) (*Request, error) {
	id, m, payload, err := l.b.backend.next(ctx, l.h.tunnel, time.Now())
	if err != nil {
		return nil, err
	}
	e, err := m.entry(l.h.tunnel, id, Queued)
	if err != nil {
		return nil, err
	}
	if payload == nil {
		return nil, &NotDueError{ID: id, At: e.NextAttemptAt}
	}
	r := &Request{Entry: e}
	if r.URI, r.Header, r.Body, err = decodePayload(payload); err != nil {
		return nil, fmt.Errorf("buffered request %s of tunnel %s: %w", id, l.h.tunnel, err)
	}
	return r, nil
}

// Ack removes the delivered request id.
func (l *Lease) Ack(ctx context.Context, id string) error {
	if err := l.b.backend.ack(ctx, l.h, id); err != nil {
		return fmt.Errorf("ack buffered request %s of tunnel %s: %w", id, l.h.tunnel, err)
	}
	l.b.delivered.Add(1)
	return nil
}

// Retry records a failed attempt at the queued request id, which stays at
// the head of the queue until f.NextAttemptAt.
func (l *Lease) Retry(ctx context.Context, id string, f Failure) error {
	if err := l.b.backend.retry(ctx, l.h, id, f); err != nil {
		return fmt.Errorf("retry buffered request %s of tunnel %s: %w", id, l.h.tunnel, err)
	}
	return nil
}

// Reject moves the queued request id, refused by its upstream, to the
// tunnel's rejected list, counting the attempt and keeping reason.
func (l *Lease) Reject(ctx context.Context, id, reason string) error {
	if err := l.b.backend.reject(ctx, l.h, id, reason); err != nil {
		return fmt.Errorf("reject buffered request %s of tunnel %s: %w", id, l.h.tunnel, err)
	}
	l.b.rejected.Add(1)
	return nil
}

// Renew extends the lease by Config.LeaseTTL, or fails with ErrLeaseLost.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.b.backend.renew(ctx, l.h, l.b.cfg.LeaseTTL); err != nil {
		return fmt.Errorf("renew the delivery lease of tunnel %s: %w", l.h.tunnel, err)
	}
	return nil
}

// Keep renews the lease every third of its TTL until ctx ends (nil) or
// the lease is lost (ErrLeaseLost). A renewal that fails otherwise (Redis
// away) is retried until the lease would have expired.
func (l *Lease) Keep(ctx context.Context) error {
	ttl := l.b.cfg.LeaseTTL
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		err := l.Renew(ctx)
		switch {
		case err == nil:
			renewed = time.Now()
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrLeaseLost), time.Since(renewed) >= ttl:
			return fmt.Errorf("%w: %w", ErrLeaseLost, err)
		}
	}
}

// Release gives the lease up, if it still holds it.
func (l *Lease) Release(ctx context.Context) error {
	if err := l.b.backend.release(ctx, l.h); err != nil {
		return fmt.Errorf("release the delivery lease of tunnel %s: %w", l.h.tunnel, err)
	}
	return nil
}

// maxTunnelLength bounds a tunnel name; the server accepts only DNS labels
// (auth.ValidTunnelName) before it gets here.
const maxTunnelLength = 253

// checkRequest reports what makes r unfit to store.
func checkRequest(r *Request) error {
	var errs []error
	if r.Tunnel == "" || len(r.Tunnel) > maxTunnelLength || strings.ContainsFunc(r.Tunnel, func(c rune) bool { return c <= ' ' || c >= 0x7f }) {
		errs = append(errs, fmt.Errorf("tunnel name %q: want 1 to %d characters of printable ASCII without spaces", r.Tunnel, maxTunnelLength))
	}
	if r.Method == "" || strings.ContainsFunc(r.Method, func(c rune) bool { return c <= ' ' || c >= 0x7f }) {
		errs = append(errs, fmt.Errorf("method %q: want an HTTP method", r.Method))
	}
	if !strings.HasPrefix(r.URI, "/") {
		errs = append(errs, errors.New("request URI: want a path starting with '/'"))
	}
	return errors.Join(errs...)
}

// requestSize is what r counts against the quotas.
func requestSize(r *Request) int64 {
	n := len(r.Method) + len(r.URI) + len(r.Body)
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v)
		}
	}
	return int64(n)
}
