package registry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

// openStore opens the embedded database in dir, closed when the test ends.
func openStore(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// redisConn is how replica id reaches the Redis at url.
func redisConn(t testing.TB, url, id string) *RedisConn {
	t.Helper()
	c, err := NewRedisConn(Config{URL: url, Replica: id, Addr: id + ".peers.test:7443"}, "")
	if err != nil {
		t.Fatalf("redis conn %s: %v", id, err)
	}
	return c
}

// logged is a logger for the test that also records what it logs.
func logged(t testing.TB) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core)), logs
}

// runner runs something with a Run(ctx) until the test ends or stop.
type runner struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// run starts f(ctx) in a goroutine; stop (also a cleanup) cancels it and
// waits for it.
func run(t testing.TB, f func(context.Context) error) *runner {
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if err := f(ctx); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	t.Cleanup(r.stop)
	return r
}

func (r *runner) stop() {
	r.cancel()
	<-r.done
}

// liveRevocations are revocations whose Run goes on until the test ends.
type liveRevocations struct {
	*Revocations
	logs   *observer.ObservedLogs
	runner *runner
}

// startRevocations makes revocations kept as b, and runs them.
func startRevocations(t testing.TB, b Backing) *liveRevocations {
	t.Helper()
	log, logs := logged(t)
	r, err := NewRevocations(b, log)
	if err != nil {
		t.Fatalf("new revocations: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return &liveRevocations{Revocations: r, logs: logs, runner: run(t, r.Run)}
}

// stop ends Run and closes.
func (r *liveRevocations) stop() {
	r.runner.stop()
	r.Close()
}

// revokedIs reports whether r's check of (tunnel, jti, original) is want.
func revokedIs(r *Revocations, want bool, tunnel, jti, original string) func() error {
	return func() error {
		if _, got := r.Revoked(tunnel, jti, original); got != want {
			return fmt.Errorf("Revoked(%q, %q, %q): got %v, want %v", tunnel, jti, original, got, want)
		}
		return nil
	}
}

// changedWithin fails the test unless ch is closed within d.
func changedWithin(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("Changed was not closed within %v of %s", d, what)
	}
}

var nopLog = zap.NewNop()
