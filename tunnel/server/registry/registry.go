package registry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Registry says which replicas hold sessions of each tunnel.
//
// Implementations are safe for concurrent use. Only Run and Wait block:
// Hold and Release change local state, and Holders, Snapshot and Status read
// it, without any I/O. Hold and Release may be called before Run; Run
// writes what they did.
type Registry interface {
	// Hold records that this replica holds at least one session of tunnel.
	// It is idempotent: a tunnel already held keeps its epoch. Call it when
	// the tunnel's first session here starts.
	Hold(tunnel string)
	// Release records that this replica holds no session of tunnel any more.
	// Call it when the tunnel's last session here ends.
	Release(tunnel string)
	// Holders returns the other replicas holding tunnel, sorted by replica
	// ID, or nil. The slice is shared: the caller must not modify it.
	Holders(tunnel string) []Holder
	// Wait returns nil once some replica, this one included, holds tunnel:
	// at once if one does. Otherwise it waits for a hold (a client
	// reconnecting) until ctx ends, and returns ctx's error.
	Wait(ctx context.Context, tunnel string) error
	// Snapshot returns every tunnel known to be held, with its holders
	// (this replica included), each list sorted by replica ID.
	Snapshot() map[string][]Holder
	// Status reports the registry's connection, for readiness and logs.
	Status() Status
	// Run keeps the registry current until ctx ends, then releases what this
	// replica holds (best effort, bounded by a few seconds) and returns.
	// Call it once.
	Run(ctx context.Context) error
}

// Holder is one replica holding sessions of a tunnel.
type Holder struct {
	// Replica is the holder's replica ID (--replica-id).
	Replica string `json:"replica"`
	// Addr is the holder's peer address, HOST:PORT, to which other replicas
	// forward the tunnel's requests (--peer-advertise-addr).
	Addr string `json:"addr"`
	// Epoch names this hold: a fresh random value, never 0, each time the
	// replica starts holding the tunnel. It is below 2^53, so it survives a
	// JSON number in any language.
	Epoch uint64 `json:"epoch"`
}

// Status is what a registry reports of its connection.
type Status struct {
	// Backend is "memory" or "redis".
	Backend string `json:"backend"`
	// Target is the Redis URL without its password; empty for memory.
	Target string `json:"target,omitempty"`
	// Up is true while the registry reads and writes Redis (always for
	// memory). While it is false, this replica serves what it holds and
	// keeps its last view of the others.
	Up bool `json:"up"`
	// Since is when Up last changed (or the registry was made).
	Since time.Time `json:"since"`
	// LastError is the last Redis error; empty if there was none.
	LastError string `json:"last_error,omitempty"`
	// Errors counts failed Redis operations since the registry was made.
	Errors uint64 `json:"errors"`
	// Held is the number of tunnels this replica holds.
	Held int `json:"held"`
	// Remote is the number of tunnels other replicas hold, per the cache.
	Remote int `json:"remote"`
}

// Defaults of Config.
const (
	DefaultPrefix = "tether:"
	DefaultTTL    = 15 * time.Second
)

// Config configures a registry. Zero values take the documented defaults.
type Config struct {
	// URL picks the registry (--registry): "memory" or empty for the
	// in-memory one, redis://HOST[:PORT][/DB] or rediss://… (TLS) for Redis.
	// The port defaults to 6379 and the database to 0. A password may be in
	// the URL (redis://:PASSWORD@HOST), but better comes from a file: see
	// Open.
	URL string
	// Replica is this replica's ID (--replica-id; the server defaults it to
	// the hostname). Required: letters, digits, '.', '-' and '_', unique
	// among the replicas.
	Replica string
	// Addr is this replica's peer address, HOST:PORT, which the other
	// replicas dial to forward requests (--peer-advertise-addr). Required
	// for Redis.
	Addr string
	// Prefix starts every Redis key and the channel, so that deployments
	// with different prefixes can share one Redis. Default "tether:".
	Prefix string
	// TTL is how long an entry outlives its holder's last refresh, and so
	// how long other replicas may still see a replica that died. Default
	// 15s; at least 1s.
	TTL time.Duration
	// Refresh is how often a holder refreshes its entries and publishes its
	// liveness beat. Default TTL/3; at most TTL/2.
	Refresh time.Duration
	// TLS is the client TLS configuration for rediss:// URLs, e.g. with the
	// Redis server's CA in RootCAs. Nil means the system's roots. The
	// server name defaults to the URL's host.
	TLS *tls.Config
}

// Memory reports whether cfg names the in-memory registry.
func (c Config) Memory() bool { return c.URL == "" || c.URL == "memory" }

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Refresh == 0 {
		c.Refresh = c.TTL / 3
	}
	return c
}

// validate checks every field a Redis registry needs, collecting all the
// problems; cfg has its defaults.
func (c Config) validate() (target, error) {
	var errs []error
	tgt, err := parseURL(c.URL)
	if err != nil {
		errs = append(errs, err)
	}
	if err := validReplica(c.Replica); err != nil {
		errs = append(errs, err)
	}
	if err := validAddr(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("--peer-advertise-addr %q: %w", c.Addr, err))
	}
	if strings.ContainsAny(c.Prefix, " \t\r\n") {
		errs = append(errs, fmt.Errorf("registry key prefix %q contains white space; use e.g. %q", c.Prefix, DefaultPrefix))
	}
	if c.TTL < time.Second {
		errs = append(errs, fmt.Errorf("registry TTL %v: want at least 1s", c.TTL))
	}
	if c.Refresh <= 0 || c.Refresh > c.TTL/2 {
		errs = append(errs, fmt.Errorf("registry refresh %v: want more than 0 and at most half the TTL (%v)", c.Refresh, c.TTL/2))
	}
	return tgt, errors.Join(errs...)
}

func validReplica(id string) error {
	if id == "" {
		return errors.New("--replica-id is empty: give each replica a unique ID (the server defaults it to the hostname)")
	}
	if len(id) > 253 {
		return fmt.Errorf("--replica-id is %d characters long; want at most 253", len(id))
	}
	for _, c := range id {
		if !replicaRune(c) {
			return fmt.Errorf("--replica-id %q contains %q; want letters, digits, '.', '-' and '_' (a pod name is fine)", id, c)
		}
	}
	return nil
}

// replicaRune reports whether c may be in a replica ID: not ':', which
// separates the tunnel from the replica in a key, nor anything a log line or
// a Redis client name would garble.
func replicaRune(c rune) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return c == '.' || c == '-' || c == '_'
}

func validAddr(addr string) error {
	if addr == "" {
		return errors.New("required with a Redis registry: the HOST:PORT where the other replicas reach this one's peer listener")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want HOST:PORT: %w", err)
	}
	if host == "" {
		return errors.New("want HOST:PORT with a host the other replicas can dial, not just a port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1-65535", port)
	}
	return nil
}

// Open returns the registry that cfg.URL names: Memory for "memory" or
// empty, Redis for redis:// and rediss:// URLs. password is the Redis
// password kept apart from the URL (from --registry-password-file; see
// ReadPassword), or "" for none or the URL's own. It does not connect: Run
// does, and retries until Redis answers.
func Open(cfg Config, password string, log *zap.Logger) (Registry, error) {
	if cfg.Memory() {
		if password != "" {
			return nil, errors.New("--registry-password-file is only for a redis:// or rediss:// --registry")
		}
		if err := validReplica(cfg.Replica); err != nil {
			return nil, err
		}
		return NewMemory(cfg.Replica, cfg.Addr), nil
	}
	return NewRedis(cfg, password, log)
}

// maxPasswordFile bounds what ReadPassword reads: a password, not a file
// named by mistake.
const maxPasswordFile = 4096

// ReadPassword reads a Redis password from a file (--registry-password-file),
// without its trailing newline. Its errors name the file, never its content.
func ReadPassword(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read --registry-password-file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPasswordFile+1))
	if err != nil {
		return "", fmt.Errorf("read --registry-password-file %s: %w", path, err)
	}
	if len(data) > maxPasswordFile {
		return "", fmt.Errorf("--registry-password-file %s is over %d bytes: it should hold only the Redis password", path, maxPasswordFile)
	}
	password := strings.TrimRight(string(data), "\r\n")
	if password == "" {
		return "", fmt.Errorf("--registry-password-file %s is empty: put the Redis password in it", path)
	}
	return password, nil
}
