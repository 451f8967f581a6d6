package registry

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// path is one of the two ways a Redis registry uses Redis; it is up when
// both work.
type path int

const (
	pathWrite     path = iota // the loop that writes this replica's holds
	pathSubscribe             // the subscription and scans that fill the cache
)

// health tracks whether Redis works, and logs an outage once: Warn when it
// starts, Info when it ends.
type health struct {
	log    *zap.Logger
	target string

	mu      sync.Mutex
	ok      [2]bool // by path
	up      bool
	warned  bool // the current outage has been logged
	since   time.Time
	lastErr string
	errors  uint64
}

func newHealth(log *zap.Logger, target string) *health {
	return &health{log: log, target: target, since: time.Now()}
}

// fail records that p failed with err.
func (h *health) fail(p path, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ok[p] = false
	h.errors++
	h.lastErr = err.Error()
	if h.warned {
		h.log.Debug("redis registry still unreachable", zap.Error(err))
		return
	}
	h.warned = true
	if h.up {
		h.up = false
		h.since = time.Now()
	}
	h.log.Warn("redis registry unreachable; serving the tunnels held here and the last known view of the other replicas until it is back",
		zap.String("registry", h.target), zap.Error(err))
}

// succeed records that p works.
func (h *health) succeed(p path) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ok[p] = true
	if h.up || !h.ok[pathWrite] || !h.ok[pathSubscribe] {
		return
	}
	down := time.Since(h.since)
	h.up = true
	h.since = time.Now()
	if h.warned {
		h.log.Info("redis registry reachable again", zap.String("registry", h.target), zap.Duration("duration", down))
	} else {
		h.log.Info("redis registry connected", zap.String("registry", h.target))
	}
	h.warned = false
}

// status fills the connection fields of s.
func (h *health) status(s *Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.Up, s.Since, s.LastError, s.Errors = h.up, h.since, h.lastErr, h.errors
}
