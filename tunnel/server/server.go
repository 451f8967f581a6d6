package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server/gate"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// Config configures a Server. Zero durations take the documented defaults.
type Config struct {
	// TunnelAddr is where tunnel clients connect (TLS, or wss), e.g. ":7000".
	TunnelAddr string
	// HTTPAddr is the public HTTP entry, e.g. ":8080"; put TLS in front of it.
	HTTPAddr string
	// AdminAddr serves /healthz, /readyz, /metrics and /api/tunnels.
	AdminAddr string
	// Domain: tunnel N is served at N.<Domain>, and only there.
	Domain string
	// PublicURL is where the platform reaches tunnels, with "*" standing
	// for the tunnel name: e.g. https://*.tunnels.example.com when TLS is
	// terminated in front of HTTPAddr. Told to `tether diagnose`, which
	// tests the public path with it. Default: http://*.<Domain>, with
	// HTTPAddr's port unless it is 80.
	PublicURL string
	// TLSCertFile and TLSKeyFile are the tunnel listener's key pair, re-read
	// when they change. Both empty: a self-signed certificate is made at
	// start and its SHA-256 fingerprint logged.
	TLSCertFile, TLSKeyFile string
	// AdminTokenFile holds the bearer token that /api/, /metrics and
	// /debug/pprof/ require (/healthz and /readyz stay open). Required when
	// AdminAddr is not a loopback address.
	AdminTokenFile string
	// TrustedProxies are the networks whose X-Forwarded-* headers the HTTP
	// entry keeps (a load balancer or ingress in front). Empty: none.
	TrustedProxies []netip.Prefix
	// HeartbeatTimeout is how long a silent client connection lives before
	// the server drops it. Default 60s; a client that comes back on a new
	// connection takes its route over at once regardless.
	HeartbeatTimeout time.Duration
	// LoginTimeout is how long a new connection has to log in. Default 30s.
	LoginTimeout time.Duration
	// MaxAnonymous caps the tunnel connections that have not logged in,
	// counted from TCP accept. At the cap the one that has kept the server
	// waiting longest is closed to make room, or with none the new one is
	// closed at once, before TLS; a quarter is kept for addresses whose
	// clients were logged in lately (gate/anonymous.go). Default 1024,
	// which bounds their memory to at most 160 MiB (see gate/limits.go and
	// docs/limits.md).
	MaxAnonymous int
	// MaxAnonymousPerIP caps the connections that have not logged in from
	// one source address (an IPv6 /64), and four times it those from one
	// /24 (IPv6 /48). Default 64. Raise it when a load balancer in front
	// hides the clients' addresses.
	MaxAnonymousPerIP int
	// ShutdownTimeout bounds the drain on shutdown: clients get this long to
	// move to other replicas and in-flight requests to finish before the
	// tunnels close. Default 25s.
	ShutdownTimeout time.Duration
	// MaxSessionsPerTunnel caps the sessions one tunnel may have on this
	// replica, whatever the clients' number. Default 16.
	MaxSessionsPerTunnel int
	// MaxHTTPConnections caps the public entry's connections, and the peer
	// port's. At the cap the connection that has waited longest for a
	// request is closed to make room; with none waiting, a new one is
	// closed at once. Default 8192, which bounds their memory to at most
	// 768 MiB (see entrylimits.go and docs/limits.md).
	MaxHTTPConnections int
	// MaxHTTPConnectionsPerIP caps the public entry's connections from one
	// address (an IPv6 /64), TrustedProxies not counted, the same way.
	// Default 1024.
	MaxHTTPConnectionsPerIP int
	// MaxRequestsPerTunnel caps the requests one tunnel may have in flight
	// on this replica, served here or forwarded; more are answered 503
	// tunnel_busy at once. Websockets and event streams may take half of
	// them (see requestSlots). Default 1024.
	MaxRequestsPerTunnel int
	// MaxRequestsPerCaller caps the requests one caller (its address, or
	// the client address a trusted proxy gives) may have in flight to one
	// tunnel on this replica, and as many websockets and event streams;
	// more are answered 429 caller_busy at once. Default a quarter of
	// MaxRequestsPerTunnel.
	MaxRequestsPerCaller int
	// BodyIdleTimeout is how long a request body may send nothing while
	// the server waits for it before the request is answered 408 and its
	// connection closed. Default 30s.
	BodyIdleTimeout time.Duration
	// AccessLog logs one line per public request, at info, as logger
	// "access" (accesslog.go). Default off.
	AccessLog bool

	// Registry is where replicas share which of them serve which tunnel:
	// "memory" (the default, one replica) or redis://HOST:PORT[/DB] or
	// rediss://... (several replicas).
	Registry string
	// RegistryPasswordFile holds the Redis password, if it is not in the URL.
	RegistryPasswordFile string
	// ReplicaID names this replica among the others. Default: the hostname.
	ReplicaID string
	// PeerAddr is the listener for requests other replicas forward here,
	// HOST:PORT; required with a Redis registry.
	PeerAddr string
	// PeerAdvertiseAddr is the HOST:PORT other replicas dial to reach
	// PeerAddr. Default PeerAddr; required when that has no host.
	PeerAdvertiseAddr string
	// PeerSecretFile holds the secret replicas share, one a line (the
	// first signs, all are trusted: see peertls.go): the peer channel's TLS
	// certificates are made from it, so that only replicas that hold it
	// forward requests to each other. Required with a Redis registry,
	// unless the PeerTLS files are given instead.
	PeerSecretFile string
	// PeerTLSCertFile, PeerTLSKeyFile and PeerTLSCAFile are this replica's
	// peer certificate (for server and client authentication), its key,
	// and the CA that signs every replica's peer certificate, instead of
	// certificates made from PeerSecretFile: e.g. issued by cert-manager.
	// All three or none; re-read when they change.
	PeerTLSCertFile, PeerTLSKeyFile, PeerTLSCAFile string

	// DataDir is where a single replica keeps what must outlive it (the
	// revocations and the webhook buffer; the file is DIR/tether.db). With a Redis registry the
	// replicas keep it in Redis instead, and DataDir must be empty; with
	// neither it is kept in memory, and the server says so at start.
	DataDir string
	// TokenRenewalKeyFile is the private key (PEM: Ed25519, ES256 or
	// RS256) the server renews tether clients' tokens with, a third of
	// their lifetime before they expire (tokens.go). Its public key must be
	// among the trusted keys. Empty: tokens are not renewed.
	TokenRenewalKeyFile string

	// Buffer* configure the webhook buffer (webhooks.go), kept where the
	// revocations are: off with neither DataDir nor a Redis registry.
	// Zero values take the defaults of packages webhook and buffer.
	BufferRetention                                    time.Duration
	BufferMaxBody, BufferMaxBytes, BufferMaxTotalBytes int64
	BufferMaxRequests                                  int
}

// peerCredentials reports whether the configuration names credentials for
// the peer channel.
func (c *Config) peerCredentials() bool { return c.PeerSecretFile != "" || c.PeerTLSCertFile != "" }

// shared reports whether the registry is shared by several replicas.
func (c *Config) shared() bool { return c.Registry != "" && c.Registry != "memory" }

func (c *Config) setDefaults() {
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 60 * time.Second
	}
	if c.LoginTimeout == 0 {
		c.LoginTimeout = 30 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 25 * time.Second
	}
	if c.MaxAnonymous == 0 {
		c.MaxAnonymous = gate.DefaultMaxAnonymous
	}
	if c.MaxAnonymousPerIP == 0 {
		c.MaxAnonymousPerIP = gate.DefaultMaxAnonymousPerIP
	}
	if c.MaxSessionsPerTunnel == 0 {
		c.MaxSessionsPerTunnel = defaultMaxSessionsPerTunnel
	}
	if c.MaxRequestsPerTunnel == 0 {
		c.MaxRequestsPerTunnel = defaultMaxRequestsPerTunnel
	}
	if c.MaxHTTPConnections == 0 {
		c.MaxHTTPConnections = defaultMaxHTTPConnections
	}
	if c.MaxHTTPConnectionsPerIP == 0 {
		c.MaxHTTPConnectionsPerIP = defaultMaxHTTPConnectionsPerIP
	}
	if c.MaxRequestsPerCaller == 0 {
		c.MaxRequestsPerCaller = max(c.MaxRequestsPerTunnel/callerShareDivisor, 1)
	}
	if c.BodyIdleTimeout == 0 {
		c.BodyIdleTimeout = defaultBodyIdleTimeout
	}
	if c.ReplicaID == "" {
		c.ReplicaID, _ = os.Hostname()
	}
	if c.PeerAdvertiseAddr == "" {
		c.PeerAdvertiseAddr = c.PeerAddr
	}
	c.PeerAdvertiseAddr = bracketIPv6(c.PeerAdvertiseAddr)
	c.Domain = strings.Trim(strings.ToLower(c.Domain), ".")
}

// defaultPublicURL is http://*.<domain> at the HTTP entry's port.
func defaultPublicURL(domain string, entry net.Addr) string {
	u := "http://*." + domain
	if _, port, err := net.SplitHostPort(entry.String()); err == nil && port != "80" {
		u += ":" + port
	}
	return u
}

// validPublicURL checks --public-url: http(s), a host that starts with "*.".
func validPublicURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.HasPrefix(u.Host, "*.") {
		return errors.New("want an http or https URL whose host starts with '*.' (the tunnel name), e.g. https://*.tunnels.example.com")
	}
	return nil
}

// Validate reports every problem of the configuration, each naming its flag.
func (c *Config) Validate() error {
	var errs []error
	for _, a := range []struct{ flag, addr string }{
		{"--tunnel-addr", c.TunnelAddr}, {"--http-addr", c.HTTPAddr}, {"--admin-addr", c.AdminAddr},
	} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want HOST:PORT, e.g. 0.0.0.0:7000: %w", a.flag, a.addr, err))
		}
	}
	if err := validDomain(c.Domain); err != nil {
		errs = append(errs, fmt.Errorf("--domain %q: %w", c.Domain, err))
	}
	if c.PublicURL != "" {
		if err := validPublicURL(c.PublicURL); err != nil {
			errs = append(errs, fmt.Errorf("--public-url %q: %w", c.PublicURL, err))
		}
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together: give both files, or neither for a self-signed certificate"))
	}
	if c.AdminTokenFile == "" && !isLoopback(c.AdminAddr) {
		errs = append(errs, fmt.Errorf("--admin-addr %q is not a loopback address: set --admin-token-file to protect /api/ and /metrics, or listen on 127.0.0.1", c.AdminAddr))
	}
	if c.MaxAnonymous < 0 {
		errs = append(errs, fmt.Errorf("MaxAnonymous %d: want a positive number of connections, or 0 for the default %d", c.MaxAnonymous, gate.DefaultMaxAnonymous))
	}
	if c.MaxAnonymousPerIP < 0 {
		errs = append(errs, fmt.Errorf("--max-anonymous-per-ip %d: want a positive number of connections, or 0 for the default %d", c.MaxAnonymousPerIP, gate.DefaultMaxAnonymousPerIP))
	}
	if c.HeartbeatTimeout < 3*time.Second {
		errs = append(errs, fmt.Errorf("--heartbeat-timeout %v: want at least 3s", c.HeartbeatTimeout))
	}
	if c.MaxSessionsPerTunnel < 0 {
		errs = append(errs, fmt.Errorf("--max-sessions-per-tunnel %d: want a positive number, or 0 for the default %d", c.MaxSessionsPerTunnel, defaultMaxSessionsPerTunnel))
	}
	if c.MaxHTTPConnections < 0 {
		errs = append(errs, fmt.Errorf("--max-http-connections %d: want a positive number of connections, or 0 for the default %d", c.MaxHTTPConnections, defaultMaxHTTPConnections))
	}
	if c.MaxHTTPConnectionsPerIP < 0 {
		errs = append(errs, fmt.Errorf("--max-http-connections-per-ip %d: want a positive number of connections, or 0 for the default %d", c.MaxHTTPConnectionsPerIP, defaultMaxHTTPConnectionsPerIP))
	}
	if c.MaxRequestsPerTunnel < 0 {
		errs = append(errs, fmt.Errorf("--max-requests-per-tunnel %d: want a positive number, or 0 for the default %d", c.MaxRequestsPerTunnel, defaultMaxRequestsPerTunnel))
	}
	switch {
	case c.MaxRequestsPerCaller < 0:
		errs = append(errs, fmt.Errorf("--max-requests-per-caller %d: want a positive number, or 0 for a quarter of --max-requests-per-tunnel", c.MaxRequestsPerCaller))
	case c.MaxRequestsPerTunnel > 0 && c.MaxRequestsPerCaller > c.MaxRequestsPerTunnel:
		errs = append(errs, fmt.Errorf("--max-requests-per-caller %d is more than --max-requests-per-tunnel %d: a caller's share is part of a tunnel's requests; lower it, or raise --max-requests-per-tunnel", c.MaxRequestsPerCaller, c.MaxRequestsPerTunnel))
	}
	if c.BodyIdleTimeout < 0 || c.BodyIdleTimeout > 0 && c.BodyIdleTimeout < time.Second {
		errs = append(errs, fmt.Errorf("--body-idle-timeout %v: want at least 1s, or 0 for the default %v", c.BodyIdleTimeout, defaultBodyIdleTimeout))
	}
	return errors.Join(append(errs, c.validateReplicas()...)...)
}

// defaultMaxSessionsPerTunnel is room for a few client pods with a few
// connections each, and the moment a client reconnects while its old
// session has not ended yet.
const defaultMaxSessionsPerTunnel = 16

// defaultMaxRequestsPerTunnel is far more than a runtime's platform traffic
// needs at once (long polls and event streams included), and keeps one
// tunnel's flood from taking a replica's memory: each request in flight
// holds a goroutine, a stream and its buffers.
const defaultMaxRequestsPerTunnel = 1024

// bracketIPv6 reads an IPv6 address and a port without brackets, which is
// what $(POD_IP):7443 gives on an IPv6 pod, as [address]:port; anything
// else it returns as it is.
func bracketIPv6(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 || strings.HasPrefix(addr, "[") {
		return addr
	}
	if ip, err := netip.ParseAddr(addr[:i]); err != nil || !ip.Is6() {
		return addr
	}
	return net.JoinHostPort(addr[:i], addr[i+1:])
}

// validateReplicas checks the settings of a replica among several.
func (c *Config) validateReplicas() []error {
	var errs []error
	if c.PeerAddr != "" {
		if _, _, err := net.SplitHostPort(c.PeerAddr); err != nil {
			errs = append(errs, fmt.Errorf("--peer-addr %q: want HOST:PORT, e.g. 0.0.0.0:7443: %w", c.PeerAddr, err))
		}
	}
	if c.PeerAdvertiseAddr != "" {
		host, port, err := net.SplitHostPort(c.PeerAdvertiseAddr)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--peer-advertise-addr %q: want HOST:PORT that the other replicas can dial: %w", c.PeerAdvertiseAddr, err))
		case host == "" || host == "0.0.0.0" || host == "::" || port == "0":
			errs = append(errs, fmt.Errorf("--peer-advertise-addr %q: the other replicas cannot dial a wildcard address or port 0; set --peer-advertise-addr to this replica's address, e.g. $(POD_IP):7443", c.PeerAdvertiseAddr))
		}
	}
	if (c.PeerTLSCertFile == "") != (c.PeerTLSKeyFile == "") || (c.PeerTLSCertFile == "") != (c.PeerTLSCAFile == "") {
		errs = append(errs, errors.New("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together: give all three files, or none to make the peer certificates from --peer-secret-file"))
	}
	if c.PeerSecretFile != "" && c.PeerTLSCertFile != "" {
		errs = append(errs, errors.New("--peer-secret-file and --peer-tls-cert exclude each other: the peer channel's certificates come either from the shared secret or from files"))
	}
	if c.PeerAddr != "" && !c.peerCredentials() {
		errs = append(errs, errors.New("--peer-addr needs --peer-secret-file (or --peer-tls-cert, --peer-tls-key and --peer-tls-ca): the peer port speaks TLS and admits only replicas with certificates from them"))
	}
	if !c.shared() {
		return errs
	}
	if c.PeerAddr == "" {
		errs = append(errs, fmt.Errorf("--peer-addr is required with --registry %s: the replicas forward requests to each other there, e.g. --peer-addr 0.0.0.0:7443", registryName(c.Registry)))
	}
	if !c.peerCredentials() {
		errs = append(errs, fmt.Errorf("--peer-secret-file is required with --registry %s: the file of the secret the replicas share, from which they make the certificates that let only them forward requests to each other (or give --peer-tls-cert, --peer-tls-key and --peer-tls-ca)", registryName(c.Registry)))
	}
	if c.ReplicaID == "" {
		errs = append(errs, errors.New("--replica-id is required: the hostname is unknown; name this replica (e.g. the pod name)"))
	}
	return errs
}

// registryName is a registry URL fit for an error: without user info.
func registryName(u string) string {
	if pu, err := url.Parse(u); err == nil {
		return pu.Redacted()
	}
	return "(a URL that does not parse)"
}

func validDomain(d string) error {
	if d == "" {
		return errors.New("required: tunnels are served at <name>.<domain>")
	}
	for label := range strings.SplitSeq(d, ".") {
		if label == "" || len(label) > 63 || strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-") ||
			strings.Trim(label, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return fmt.Errorf("label %q is not a DNS label (a-z, 0-9, '-')", label)
		}
	}
	return nil
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// Server accepts tunnel clients and exposes their routes. It is the
// configuration and the wiring, static after New; what exists while it
// serves is a replica, which Serve builds.
type Server struct {
	// Static after New: the configuration, and what New made of it.
	cfg        Config
	verifier   *auth.Verifier
	registry   registry.Registry
	adminToken string
	peerTLS    *peerTLS // the peer channel's credentials; nil without a peer port or replicas
	certs      *certificates
	tlsConfig  *tls.Config
	// What outlives the process: the revocations and the webhook buffer,
	// kept in the registry's Redis, in store (DataDir), or in memory
	// (store nil), as backing says.
	store       *registry.Store
	backing     registry.Backing
	revocations *registry.Revocations
	webhooks    *webhooks
	renewer     *auth.Signer // TokenRenewalKeyFile; nil without one

	// Static after New: the loggers.
	log *zap.Logger
	// floodLog is log, sampled: for what a client can make the server log
	// as often as it likes (refused connections and streams, limits).
	floodLog *zap.Logger
	// refusalLog logs the entry's refusals of CONNECT and absolute-form
	// targets, sampled: anyone on the internet can send those.
	refusalLog *zap.Logger
	// proxyErrorLog takes net/http's reverse proxy complaints (a body copy
	// cut short by a client that left), which are debug noise.
	proxyErrorLog *stdlog.Logger
}

// replica is what exists while a Server serves: Serve builds it, run
// serves with it, and it is gone when Serve returns.
type replica struct {
	// Static after start: the wiring, and the parts built from it.
	srv       *Server
	publicURL string // Config.PublicURL, or the default at the entry's port
	frp       *embeddedFRP
	gate      *gate.Gate // the tunnel port
	members   *members   // which sessions serve which tunnel
	tokens    *tokenKeeper
	metrics   *metrics
	peers     *peerProxy // forwards to other replicas
	// peerControl asks other replicas to act (revokeapi.go), over the peer
	// channel.
	peerControl *http.Client

	// Caps, each guarded by its own lock: the public entry's connections
	// and the peer port's (nil: no peer port), side by side; and the
	// requests in flight per tunnel and caller.
	entryConns *connSlots
	peerConns  *connSlots
	inflight   *requestSlots

	// Owned by run: what it serves on.
	ls                                     Listeners
	pluginLn                               net.Listener
	pluginSrv, entrySrv, peerSrv, adminSrv *http.Server

	// Set by run (ready) and drain (draining), read by /readyz.
	ready    atomic.Bool
	draining atomic.Bool
}

// Option customises a Server.
type Option func(*Server)

// WithRegistry sets the registry instead of Config.Registry.
func WithRegistry(r registry.Registry) Option { return func(s *Server) { s.registry = r } }

// New validates cfg and wires the server. It does not listen.
func New(cfg Config, verifier *auth.Verifier, log *zap.Logger, opts ...Option) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if verifier == nil {
		return nil, errors.New("server needs a token verifier: give --jwt-public-key")
	}
	s := &Server{cfg: cfg, verifier: verifier, log: log}
	s.proxyErrorLog, _ = zap.NewStdLogAt(log.Named("entry"), zapcore.DebugLevel)
	s.refusalLog = log.Named("entry").WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, 10*time.Second, 1, 0)
	}))
	for _, o := range opts {
		o(s)
	}
	var err error
	if cfg.AdminTokenFile != "" {
		if s.adminToken, err = readSecret(cfg.AdminTokenFile, "--admin-token-file"); err != nil {
			return nil, err
		}
	}
	if s.peerTLS, err = newPeerTLS(cfg, log.Named("peer")); err != nil {
		return nil, err
	}
	if s.registry == nil {
		if s.registry, err = openRegistry(cfg, log); err != nil {
			return nil, err
		}
	}
	if err := s.openState(); err != nil {
		return nil, err
	}
	if cfg.TokenRenewalKeyFile != "" {
		if s.renewer, err = auth.LoadSigner(cfg.TokenRenewalKeyFile); err != nil {
			return nil, fmt.Errorf("--token-renewal-key: %w", err)
		}
		if err := auth.CheckRenewalKey(s.renewer, verifier); err != nil {
			return nil, fmt.Errorf("--token-renewal-key %s: %w", cfg.TokenRenewalKeyFile, err)
		}
	}
	host, _, _ := net.SplitHostPort(cfg.TunnelAddr)
	certs, err := newCertificates(cfg.TLSCertFile, cfg.TLSKeyFile, []string{host})
	if err != nil {
		return nil, err
	}
	s.certs = certs
	s.tlsConfig = &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12}
	s.floodLog = log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		// Per message: the first 5 every 10s, then none until the next 10s.
		return zapcore.NewSamplerWithOptions(c, 10*time.Second, 5, 0)
	}))
	return s, nil
}

// openState opens where the revocations are kept: the registry's Redis,
// or DataDir's store, or memory.
func (s *Server) openState() error {
	var err error
	if s.cfg.DataDir != "" {
		if s.store, err = registry.OpenStore(s.cfg.DataDir); err != nil {
			return err
		}
	}
	s.backing, err = registry.BackingFor(s.registry, s.store)
	if err == nil {
		s.revocations, err = registry.NewRevocations(s.backing, s.log)
	}
	if err == nil {
		s.webhooks, err = openWebhooks(s.cfg, s.backing, s.log)
	}
	if err != nil {
		s.closeState()
		return err
	}
	return nil
}

// closeState closes what openState opened.
func (s *Server) closeState() {
	if s.webhooks != nil {
		s.webhooks.close()
	}
	if s.revocations != nil {
		_ = s.revocations.Close()
	}
	if s.store != nil {
		_ = s.store.Close()
	}
}

// readSecret reads a secret from the file flag names.
func readSecret(path, flag string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", flag, err)
	}
	secret := strings.TrimSpace(string(b))
	if secret == "" {
		return "", fmt.Errorf("%s %s is empty: put a random secret in it (e.g. openssl rand -hex 32)", flag, path)
	}
	return secret, nil
}

// openRegistry opens the registry Config names; its password comes from
// RegistryPasswordFile.
func openRegistry(cfg Config, log *zap.Logger) (registry.Registry, error) {
	password := ""
	if cfg.RegistryPasswordFile != "" {
		p, err := registry.ReadPassword(cfg.RegistryPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("--registry-password-file: %w", err)
		}
		password = p
	}
	reg, err := registry.Open(registry.Config{URL: cfg.Registry, Replica: cfg.ReplicaID, Addr: cfg.PeerAdvertiseAddr}, password, log.Named("registry"))
	if err != nil {
		return nil, fmt.Errorf("--registry: %w", err)
	}
	return reg, nil
}

// Listeners are the server's listening sockets; Serve closes them. Peer is
// the listener for requests other replicas forward (nil: none).
type Listeners struct {
	Tunnel, HTTP, Admin, Peer net.Listener
}

// Run listens on the configured addresses and serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	var ls Listeners
	var err error
	var lc net.ListenConfig
	listen := func(flag, addr string) net.Listener {
		if err != nil {
			return nil
		}
		var ln net.Listener
		if ln, err = lc.Listen(ctx, "tcp", addr); err != nil {
			err = fmt.Errorf("listen on %s %s: %w; pick a free port or stop the process using it", flag, addr, err)
		}
		return ln
	}
	ls.Tunnel = listen("--tunnel-addr", s.cfg.TunnelAddr)
	ls.HTTP = listen("--http-addr", s.cfg.HTTPAddr)
	ls.Admin = listen("--admin-addr", s.cfg.AdminAddr)
	if s.cfg.PeerAddr != "" {
		ls.Peer = listen("--peer-addr", s.cfg.PeerAddr)
	}
	if err != nil {
		closeAll(ls)
		return err
	}
	return s.Serve(ctx, ls)
}

// Serve serves on ls until ctx ends, then drains (drain.go). It returns
// after every goroutine it started has ended.
func (s *Server) Serve(ctx context.Context, ls Listeners) error {
	sv, err := s.start(ctx, ls)
	if err != nil {
		return err
	}
	return sv.run(ctx)
}

// start builds what serving needs and starts frp; run serves.
func (s *Server) start(ctx context.Context, ls Listeners) (*replica, error) {
	if ls.Peer != nil && s.peerTLS == nil {
		closeAll(ls)
		return nil, errors.New("a peer listener needs the peer channel's credentials: set --peer-secret-file (Config.PeerSecretFile)")
	}
	sv := &replica{srv: s, ls: ls, publicURL: s.cfg.PublicURL,
		entryConns: newConnSlots(s.cfg.MaxHTTPConnections, s.cfg.MaxHTTPConnectionsPerIP, s.trustsAddr),
		inflight:   newRequestSlots(s.cfg.MaxRequestsPerTunnel, s.cfg.MaxRequestsPerCaller),
	}
	if sv.publicURL == "" {
		sv.publicURL = defaultPublicURL(s.cfg.Domain, ls.HTTP.Addr())
	}
	// The metrics read the members and the gate's anonymous connections
	// when scraped, by then made.
	sv.metrics = newMetrics(func() []*member { return sv.members.list() }, func() int { return sv.gate.Anonymous() }, sv.entryConns, s.registry)
	var err error
	sv.gate, err = gate.New(gate.Config{
		TLS: s.tlsConfig, HeartbeatTimeout: s.cfg.HeartbeatTimeout, LoginTimeout: s.cfg.LoginTimeout,
		MaxAnonymous: s.cfg.MaxAnonymous, MaxAnonymousPerIP: s.cfg.MaxAnonymousPerIP,
		Log: s.log, FloodLog: s.floodLog,
	}, sv, sv.metrics)
	if err != nil {
		closeAll(ls)
		return nil, err
	}
	sv.tokens = newTokenKeeper(s.verifier, s.renewer, s.revocations, s.log)
	sv.members = newMembers(sv.gate, s.registry, sv.tokens, sv.metrics, sv.newHandler, s.cfg.MaxSessionsPerTunnel, s.cfg.ReplicaID)
	s.webhooks.bind(sv)
	plugin := auth.NewPlugin(s.verifier, sv.members, s.floodLog.Named("auth"), sv.metrics)
	var lc net.ListenConfig
	if sv.pluginLn, err = lc.Listen(ctx, "tcp", "127.0.0.1:0"); err != nil {
		closeAll(ls)
		return nil, fmt.Errorf("listen for the in-process auth plugin: %w", err)
	}
	pluginPath := randomPath()
	pluginMux := http.NewServeMux()
	pluginMux.Handle(pluginPath, plugin)
	sv.pluginSrv = &http.Server{Handler: pluginMux, ReadHeaderTimeout: 10 * time.Second}

	if sv.frp, err = startFRP(s.cfg.Domain, sv.pluginLn.Addr().String(), pluginPath, plugin.Ops(), tunnel.NewConnListener(ls.Tunnel.Addr())); err != nil {
		_ = sv.pluginLn.Close()
		closeAll(ls)
		return nil, err
	}
	sv.peers = sv.newPeerProxy()
	sv.peerControl = &http.Client{Transport: &http.Transport{DialTLSContext: sv.peerDialer(), MaxResponseHeaderBytes: 16 << 10}}

	sv.entrySrv = &http.Server{
		Handler:           newAccessLog(&s.cfg, s.log).wrap(sv.serveEntry),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          zap.NewStdLog(s.log.Named("entry")),
		MaxHeaderBytes:    maxEntryHeaderBytes,
		ConnState:         trackConns,
	}
	if ls.Peer != nil {
		sv.peerSrv = &http.Server{
			Handler:           http.HandlerFunc(sv.servePeer),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       120 * time.Second,
			ErrorLog:          zap.NewStdLog(s.log.Named("peer")),
			MaxHeaderBytes:    maxPeerHeaderBytes,
			ConnState:         trackConns,
		}
		sv.peerConns = newConnSlots(s.cfg.MaxHTTPConnections, 0, nil)
	}
	sv.adminSrv = &http.Server{Handler: sv.adminHandler(), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: maxAdminHeaderBytes}
	return sv, nil
}

// run serves until ctx ends, then drains.
func (sv *replica) run(ctx context.Context) error {
	s, ls := sv.srv, sv.ls
	// The registry outlives the drain: it tells where the clients moved,
	// and removes this replica's entries last.
	regCtx, stopRegistry := context.WithCancel(context.WithoutCancel(ctx))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.registry.Run(regCtx) })
	g.Go(func() error { return s.revocations.Run(regCtx) })
	stopWebhooks := s.webhooks.run(ctx, g)
	g.Go(func() error {
		sv.tokens.enforce(gctx, sv.members.sessions)
		return nil
	})
	g.Go(func() error { return serveHTTP(sv.pluginSrv, sv.pluginLn) })
	entryLn := &cappedListener{Listener: ls.HTTP, slots: sv.entryConns, maxLines: maxEntryHeadLines,
		report: sv.capReporter("public entry", entryCapLabels)}
	g.Go(func() error { return serveHTTP(sv.entrySrv, entryLn) })
	if sv.peerSrv != nil {
		peerLn := &cappedListener{Listener: sv.peerListener(ls.Peer), slots: sv.peerConns, maxLines: maxPeerHeadLines,
			report: sv.capReporter("peer port", peerCapLabels)}
		g.Go(func() error { return serveHTTP(sv.peerSrv, peerLn) })
	}
	g.Go(func() error { return serveHTTP(sv.adminSrv, ls.Admin) })
	gateServed := make(chan struct{}) // closed when the gate accepts no more
	g.Go(func() error {
		defer close(gateServed)
		return sv.gate.Serve(gctx, ls.Tunnel)
	})
	g.Go(func() error {
		<-gctx.Done()
		sv.drain(sv.entrySrv, sv.peerSrv, gateServed)
		stopWebhooks()
		_ = sv.adminSrv.Close()
		_ = sv.pluginSrv.Close()
		sv.frp.Close()
		stopRegistry()
		return nil
	})

	fields := []zap.Field{zap.String("tunnel_addr", ls.Tunnel.Addr().String()), zap.String("http_addr", ls.HTTP.Addr().String()),
		zap.String("admin_addr", ls.Admin.Addr().String()), zap.String("domain", s.cfg.Domain),
		zap.String("replica", s.cfg.ReplicaID), zap.String("registry", s.registry.Status().Backend)}
	if ls.Peer != nil {
		fields = append(fields, zap.String("peer_addr", ls.Peer.Addr().String()), zap.String("peer_advertise_addr", s.cfg.PeerAdvertiseAddr))
	}
	if s.peerTLS != nil {
		fields = append(fields, s.peerTLS.describe()...)
	}
	fields = append(fields, zap.String("revocations", s.revocations.Kind()), zap.Bool("token_renewal", s.renewer != nil))
	s.log.Info("tether server started", fields...)
	if s.revocations.Kind() == registry.KindMemory {
		s.log.Warn("revocations are kept in memory only: a restart forgets them; give --data-dir (one replica) or a Redis --registry (several) to keep them")
	}
	if s.certs.selfSignedOnly() {
		s.log.Info("tunnel listener uses a self-signed certificate; pin it on clients with --tls-fingerprint",
			zap.String("sha256_fingerprint", s.certs.Fingerprint()))
	}
	sv.ready.Store(true)
	err := g.Wait()
	s.closeState()
	if ctx.Err() != nil && err == nil {
		s.log.Info("tether server stopped")
	}
	return err
}

// serveHTTP runs srv on ln; a closed server is a normal end.
func serveHTTP(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func closeAll(ls Listeners) {
	for _, ln := range []net.Listener{ls.Tunnel, ls.HTTP, ls.Admin, ls.Peer} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// Fingerprint is the SHA-256 fingerprint of the tunnel listener's current
// certificate.
func (s *Server) Fingerprint() string { return s.certs.Fingerprint() }
