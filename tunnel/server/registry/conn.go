package registry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisConn is how to reach the Redis of a Redis registry: its address,
// credentials, TLS, key prefix and operation timeout. The registry and every
// other kind of state the replicas share there (revocations, remembered
// routes, the webhook buffer) make their own clients with it, so that a slow
// or large operation of one never waits in another's connection pool.
type RedisConn struct {
	cfg    Config // with defaults
	tgt    target
	target string // the URL without password, for logs and errors
	// timeout bounds each small operation (a GET, a short script), so that
	// a Redis that stopped answering is noticed.
	timeout time.Duration
}

// NewRedisConn validates cfg (as NewRedis does) and returns how to reach its
// Redis. password is used when not empty (the URL then must not hold one).
// It does not connect.
func NewRedisConn(cfg Config, password string) (*RedisConn, error) {
	cfg = cfg.withDefaults()
	tgt, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	if password != "" {
		if tgt.password != "" {
			return nil, errPasswordTwice
		}
		tgt.password = password
	}
	return &RedisConn{
		cfg:     cfg,
		tgt:     tgt,
		target:  tgt.String(),
		timeout: min(max(cfg.Refresh, time.Second), 3*time.Second),
	}, nil
}

// Target is the Redis URL without its password, for logs and status.
func (c *RedisConn) Target() string { return c.target }

// Prefix starts every key and channel of this deployment (Config.Prefix).
func (c *RedisConn) Prefix() string { return c.cfg.Prefix }

// Replica is this replica's ID (Config.Replica).
func (c *RedisConn) Replica() string { return c.cfg.Replica }

// Timeout bounds one small Redis operation of this deployment.
func (c *RedisConn) Timeout() time.Duration { return c.timeout }

// Client returns a new client of the Redis, with at most poolSize
// connections, named "tether-REPLICA" or, with a purpose,
// "tether-REPLICA-PURPOSE" in CLIENT LIST. Reads and writes time out after
// Timeout; a caller that moves large values sets deadlines of its own. The
// caller closes it.
func (c *RedisConn) Client(purpose string, poolSize int) *redis.Client {
	name := "tether-" + c.cfg.Replica
	if purpose != "" {
		name += "-" + purpose
	}
	opts := &redis.Options{
		Addr:     c.tgt.addr,
		Username: c.tgt.username,
		Password: c.tgt.password,
		DB:       c.tgt.db,
		// Operators find each replica's connections by name in CLIENT LIST;
		// CLIENT SETINFO would be one more command to allow under ACLs.
		ClientName:      name,
		DisableIdentity: true,
		// The loops retry with their own backoff, and report each failure.
		DialerRetries:         1,
		DialTimeout:           c.timeout,
		ReadTimeout:           c.timeout,
		WriteTimeout:          c.timeout,
		ContextTimeoutEnabled: true,
		PoolSize:              poolSize,
		// Maintenance notifications (endpoint handoffs of managed Redis
		// offerings) would start goroutines per client and try a command
		// that open-source Redis refuses on every connection; the loops
		// already ride out a reconnect.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if c.tgt.tls {
		opts.TLSConfig = tlsConfig(c.cfg.TLS, c.tgt.addr)
	}
	return redis.NewClient(opts)
}

func tlsConfig(base *tls.Config, addr string) *tls.Config {
	cfg := &tls.Config{}
	if base != nil {
		cfg = base.Clone()
	}
	if cfg.MinVersion == 0 {
		cfg.MinVersion = tls.VersionTLS12
	}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	return cfg
}

// Explain adds what to do to the Redis errors that need the operator: a
// refused login, a Redis that does not answer.
func (c *RedisConn) Explain(err error) error {
	switch {
	case err == nil:
		return nil
	case redis.IsAuthError(err):
		return fmt.Errorf("redis at %s refused the login; check the password (--registry-password-file) and the user in --registry: %w", c.target, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("redis at %s did not answer within %v: %w", c.target, c.timeout, err)
	}
	return err
}

// subscribe subscribes client to channel and waits for Redis to confirm:
// every message published from then on reaches ps. done closes ps; ctx
// ending closes it too, which is what interrupts a receive.
func (c *RedisConn) subscribe(ctx context.Context, client *redis.Client, channel string) (*redis.PubSub, func(), error) {
	ps := client.Subscribe(ctx, channel)
	closePS := func() { _ = ps.Close() } // its error says only that the connection was gone already
	stop := context.AfterFunc(ctx, closePS)
	done := func() {
		stop()
		closePS()
	}
	msg, err := ps.ReceiveTimeout(ctx, c.timeout)
	if err != nil {
		done()
		return nil, nil, c.Explain(fmt.Errorf("subscribe to %s: %w", channel, err))
	}
	if _, ok := msg.(*redis.Subscription); !ok {
		done()
		return nil, nil, fmt.Errorf("subscribe to %s: got %T, want the confirmation", channel, msg)
	}
	return ps, done, nil
}
