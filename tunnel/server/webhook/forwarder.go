package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/tether-dev/tether/tunnel/server/buffer"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// Defaults of Config.
const (
	DefaultMaxBody         = 10 << 20
	DefaultBodyIdleTimeout = 30 * time.Second
	DefaultMaxPendingBytes = 64 << 20
	DefaultAttemptTimeout  = time.Minute
	DefaultRetryFirst      = time.Second
	DefaultRetryMax        = 5 * time.Minute
	DefaultMaxDeliveries   = 16
)

// Config configures a Forwarder. Zero values take the documented defaults.
type Config struct {
	// Buffer configures the store: retention, quotas and the delivery
	// lease (see buffer.Config).
	Buffer buffer.Config

	// MaxBody is the largest body stored, in bytes (--buffer-max-body);
	// a larger one is not buffered. Default 10 MiB.
	MaxBody int64
	// BodyIdleTimeout is how long a body being read for the buffer may
	// send nothing (--body-idle-timeout). Default 30s.
	BodyIdleTimeout time.Duration
	// MaxPendingBytes bounds the bodies this replica reads for the buffer
	// at once, in bytes; one tunnel may hold a quarter of it, or MaxBody
	// if that is more. Past it requests are answered buffer_full. Storing
	// a body briefly takes as much again. Default 64 MiB.
	MaxPendingBytes int64

	// AttemptTimeout bounds one delivery attempt, its answer's body
	// included. Default 1m.
	AttemptTimeout time.Duration
	// RetryFirst is the wait after a first failed attempt; each failure
	// doubles it up to RetryMax, with jitter (half to all of it).
	// Defaults 1s and 5m.
	RetryFirst, RetryMax time.Duration
	// MaxDeliveries is how many tunnels' queues this replica delivers at
	// once; more wait their turn. Default 16.
	MaxDeliveries int
	// SweepInterval is how often this replica looks for queues of the
	// tunnels it serves that it is not delivering: their deliverer died
	// (its lease expired), or another replica stored them. Default the
	// lease TTL.
	SweepInterval time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.BodyIdleTimeout == 0 {
		c.BodyIdleTimeout = DefaultBodyIdleTimeout
	}
	if c.MaxPendingBytes == 0 {
		c.MaxPendingBytes = max(DefaultMaxPendingBytes, 2*c.MaxBody)
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = DefaultAttemptTimeout
	}
	if c.RetryFirst == 0 {
		c.RetryFirst = DefaultRetryFirst
	}
	if c.RetryMax == 0 {
		c.RetryMax = max(DefaultRetryMax, c.RetryFirst)
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = DefaultMaxDeliveries
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = c.Buffer.LeaseTTL
		if c.SweepInterval == 0 {
			c.SweepInterval = buffer.DefaultLeaseTTL
		}
	}
	return c
}

// validate reports every problem of c, which has its defaults.
func (c Config) validate() error {
	var errs []error
	if c.MaxBody < 0 {
		errs = append(errs, fmt.Errorf("--buffer-max-body %d: want a positive number of bytes, e.g. %d", c.MaxBody, DefaultMaxBody))
	}
	if maxBytes := cmp.Or(c.Buffer.MaxBytes, buffer.DefaultMaxBytes); c.MaxBody > maxBytes {
		errs = append(errs, fmt.Errorf("--buffer-max-body %d is above --buffer-max-bytes %d: no such body would fit in a tunnel's buffer", c.MaxBody, maxBytes))
	}
	if c.BodyIdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("--body-idle-timeout %v: want a positive duration", c.BodyIdleTimeout))
	}
	if c.MaxPendingBytes <= c.MaxBody {
		errs = append(errs, fmt.Errorf("webhook pending bytes %d: want more than --buffer-max-body %d", c.MaxPendingBytes, c.MaxBody))
	}
	if c.AttemptTimeout < 0 {
		errs = append(errs, fmt.Errorf("delivery attempt timeout %v: want a positive duration", c.AttemptTimeout))
	}
	if c.RetryFirst < 0 || c.RetryMax < c.RetryFirst {
		errs = append(errs, fmt.Errorf("delivery retry backoff %v to %v: want 0 < min <= max", c.RetryFirst, c.RetryMax))
	}
	if c.MaxDeliveries < 0 {
		errs = append(errs, fmt.Errorf("concurrent deliveries %d: want a positive number", c.MaxDeliveries))
	}
	if c.SweepInterval < 0 {
		errs = append(errs, fmt.Errorf("delivery sweep interval %v: want a positive duration", c.SweepInterval))
	}
	return errors.Join(errs...)
}

// Sender carries deliveries through this replica's sessions; the server
// implements it. Its methods are safe for concurrent use.
type Sender interface {
	// Serves reports whether a session on this replica serves tunnel. It
	// must not block: the deliverer asks before it takes a tunnel's lease,
	// and the acceptor after each stored request.
	Serves(tunnel string) bool

	// Send sends req to tunnel through a session on this replica, as the
	// public entry sends a request it routes (the session's router picks
	// the route and sets X-Forwarded-Prefix), but without setting
	// X-Forwarded-For, -Host or -Proto: req carries those the entry set
	// when the request arrived. It returns once the answer has been read
	// to its end, or ctx ended; the body of the answer is discarded.
	//
	// The error is ErrNotServed when no session here took the request,
	// none of which received any of it (the tunnel is not served here any
	// more); any other error when the request could not be completed
	// otherwise. A context error counts as an attempt that reached the
	// upstream. Send does not close req.Body.
	Send(ctx context.Context, tunnel string, req *http.Request) (Answer, error)
}

// Answer is what a delivery attempt got back.
type Answer struct {
	// Status is the answer's status code.
	Status int
	// Code is the X-Tether-Error of an answer tether gave instead of the
	// upstream (proxy.ErrorHeader); empty when the upstream answered.
	Code string
}

// ErrNotServed is returned by Sender.Send when no session on this replica
// took the request: the deliverer stops, and a replica that serves the
// tunnel delivers.
var ErrNotServed = errors.New("the tunnel is not served on this replica")

// Routes tells which routes a tunnel advertised at its last login, if it
// was seen within the retention: *registry.Routes.
type Routes interface {
	Lookup(ctx context.Context, tunnel string) (registry.Remembered, bool, error)
}

// Forwarder stores the requests of buffered routes that cannot reach their
// tunnel and delivers them when it is back; the package doc tells how. Its
// methods are safe for concurrent use; Offer, Kick and Summaries may be
// called on a nil Forwarder (buffering off).
type Forwarder struct {
	// Static after New.
	cfg    Config
	buf    *buffer.Buffer
	routes Routes
	sender Sender
	log    *zap.Logger

	// Bodies being read (accept.go).
	pending *pending

	// Kicks for Run's delivery loop (deliver.go).
	kick chan struct{} // size 1
	mu   sync.Mutex
	// kicked are the tunnels whose queues to look at, until the delivery
	// loop gives each a worker.
	kicked map[string]struct{}

	// fullLogged is when a refusal for a full buffer was last logged, in
	// Unix nanoseconds: such refusals come in floods.
	fullLogged atomic.Int64
}

// New opens the buffer where backing says and returns a Forwarder on it.
// Without a data directory or Redis it fails with buffer.ErrDisabled:
// buffering is off, and the server says so at start. It starts no
// goroutine: Run does.
func New(cfg Config, backing registry.Backing, routes Routes, sender Sender, log *zap.Logger) (*Forwarder, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log = log.Named("webhook")
	buf, err := buffer.Open(cfg.Buffer, backing, log)
	if err != nil {
		return nil, err
	}
	cfg.Buffer = buf.Config()
	share := max(cfg.MaxPendingBytes/4, cfg.MaxBody+1)
	return &Forwarder{
		cfg:     cfg,
		buf:     buf,
		routes:  routes,
		sender:  sender,
		log:     log,
		pending: newPending(cfg.MaxPendingBytes, share),
		kick:    make(chan struct{}, 1),
		kicked:  map[string]struct{}{},
	}, nil
}

// Config is the Forwarder's configuration, with its defaults.
func (f *Forwarder) Config() Config { return f.cfg }

// Run delivers queues (those Kick names, and those the sweep finds) and
// drops the requests the retention ended, until ctx ends; it returns once
// every delivery stopped and gave its lease back. Call it once.
func (f *Forwarder) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return f.buf.Run(ctx) })
	g.Go(func() error { return f.deliverLoop(ctx) })
	g.Go(func() error { return f.sweep(ctx) })
	return g.Wait()
}

// Close releases the store's connection, if any. Call it after Run
// returned; it is idempotent.
func (f *Forwarder) Close() error { return f.buf.Close() }
