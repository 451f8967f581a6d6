package registry

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// outage tracks whether one loop of shared state reaches Redis, and logs an
// outage once: Warn when it starts, Info when it ends.
type outage struct {
	log    *zap.Logger
	what   string // "revocations", "remembered routes"
	target string

	mu      sync.Mutex
	down    bool
	since   time.Time // when down last changed
	lastErr string
}

func newOutage(log *zap.Logger, what, target string) *outage {
	return &outage{log: log, what: what, target: target, since: time.Now()}
}

// fail records that Redis failed with err.
func (o *outage) fail(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lastErr = err.Error()
	if o.down {
		o.log.Debug("redis still unreachable", zap.String("state", o.what), zap.Error(err))
		return
	}
	o.down, o.since = true, time.Now()
	o.log.Warn("redis unreachable; keeping the last known state and retrying",
		zap.String("state", o.what), zap.String("registry", o.target), zap.Error(err))
}

// ok records that Redis answered.
func (o *outage) ok() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.down {
		return
	}
	o.log.Info("redis reachable again", zap.String("state", o.what), zap.String("registry", o.target),
		zap.Duration("duration", time.Since(o.since)))
	o.down, o.since = false, time.Now()
}

func (o *outage) lastError() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lastErr
}
