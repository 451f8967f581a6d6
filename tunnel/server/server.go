// Package server is tether's tunnel server: it accepts tunnel clients,
// verifies who they are, and serves each tunnel's HTTP route at
// <tunnel>.<domain>.
//
// The engine is an embedded frp server. In front of it sits tether's session
// layer (the gate: TLS, yamux, one identity per connection, and limits on
// what a connection may cost before it has logged in), behind it the auth
// plugin (JWT logins, route rules), and beside it the public HTTP entry and
// the admin endpoints.
//
//	srv, err := server.New(server.Config{
//		TunnelAddr: ":7000", HTTPAddr: ":8080", AdminAddr: "127.0.0.1:7700",
//		Domain: "tunnels.example.com",
//	}, verifier, log)
//	err = srv.Run(ctx) // until ctx ends; then drains
//
// It does not terminate TLS for the public HTTP entry (put an ingress or load
// balancer in front), and it keeps its registry of tunnels in memory.
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
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
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
	// counted from TCP accept; more are closed at once, before TLS.
	// Default 1024, which bounds their memory to at most 160 MiB (see
	// limits.go and README.md).
	MaxAnonymous int
	// MaxAnonymousPerIP caps the connections that have not logged in from
	// one source address (an IPv6 /64). Default 64. Raise it when a load
	// balancer in front hides the clients' addresses.
	MaxAnonymousPerIP int
	// ShutdownTimeout bounds the drain on shutdown: in-flight requests get
	// this long to finish before the tunnels close. Default 25s.
	ShutdownTimeout time.Duration
}

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
		c.MaxAnonymous = defaultMaxAnonymous
	}
	if c.MaxAnonymousPerIP == 0 {
		c.MaxAnonymousPerIP = defaultMaxAnonymousPerIP
	}
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
		errs = append(errs, fmt.Errorf("MaxAnonymous %d: want a positive number of connections, or 0 for the default %d", c.MaxAnonymous, defaultMaxAnonymous))
	}
	if c.MaxAnonymousPerIP < 0 {
		errs = append(errs, fmt.Errorf("--max-anonymous-per-ip %d: want a positive number of connections, or 0 for the default %d", c.MaxAnonymousPerIP, defaultMaxAnonymousPerIP))
	}
	if c.HeartbeatTimeout < 3*time.Second {
		errs = append(errs, fmt.Errorf("--heartbeat-timeout %v: want at least 3s", c.HeartbeatTimeout))
	}
	return errors.Join(errs...)
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

// Server accepts tunnel clients and exposes their routes.
type Server struct {
	cfg        Config
	verifier   *auth.Verifier
	log        *zap.Logger
	adminToken string
	certs      *certificates
	tlsConfig  *tls.Config
	registry   Registry
	metrics    *metrics
	tenancy    *tenancy
	anonymous  *anonymousSlots
	// floodLog is log, sampled: for what a client can make the server log
	// as often as it likes (refused connections and streams, limits).
	floodLog *zap.Logger

	frpConns     *tunnel.ConnListener // streams the gate admitted, for frp
	frpVhostAddr string               // frp's HTTP vhost, for stock frpc tunnels

	// refusalLog logs the entry's refusals of CONNECT and absolute-form
	// targets, sampled: anyone on the internet can send those.
	refusalLog *zap.Logger

	// proxyErrorLog takes net/http's reverse proxy complaints (a body copy
	// cut short by a client that left), which are debug noise.
	proxyErrorLog *stdlog.Logger

	conns    sync.WaitGroup // one per client connection
	ready    atomic.Bool
	draining atomic.Bool
}

// Option customises a Server.
type Option func(*Server)

// WithRegistry replaces the in-memory tunnel registry.
func WithRegistry(r Registry) Option { return func(s *Server) { s.registry = r } }

// New validates cfg and wires the server. It does not listen.
func New(cfg Config, verifier *auth.Verifier, log *zap.Logger, opts ...Option) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if verifier == nil {
		return nil, errors.New("server needs a token verifier: give --jwt-public-key")
	}
	s := &Server{cfg: cfg, verifier: verifier, log: log, registry: NewMemoryRegistry()}
	s.proxyErrorLog, _ = zap.NewStdLogAt(log.Named("entry"), zapcore.DebugLevel)
	s.refusalLog = log.Named("entry").WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, 10*time.Second, 1, 0)
	}))
	for _, o := range opts {
		o(s)
	}
	if cfg.AdminTokenFile != "" {
		b, err := os.ReadFile(cfg.AdminTokenFile)
		if err != nil {
			return nil, fmt.Errorf("read --admin-token-file: %w", err)
		}
		if s.adminToken = strings.TrimSpace(string(b)); s.adminToken == "" {
			return nil, fmt.Errorf("--admin-token-file %s is empty: put a random token in it", cfg.AdminTokenFile)
		}
	}
	host, _, _ := net.SplitHostPort(cfg.TunnelAddr)
	certs, err := newCertificates(cfg.TLSCertFile, cfg.TLSKeyFile, []string{host})
	if err != nil {
		return nil, err
	}
	s.certs = certs
	s.tlsConfig = &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12}
	s.anonymous = newAnonymousSlots(cfg.MaxAnonymous, cfg.MaxAnonymousPerIP)
	s.floodLog = log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		// Per message: the first 5 every 10s, then none until the next 10s.
		return zapcore.NewSamplerWithOptions(c, 10*time.Second, 5, 0)
	}))
	s.metrics = newMetrics(s.registry, s.anonymous)
	s.tenancy = newTenancy(verifier, s.registry, s.metrics, log.Named("tenancy"), s.forwarder)
	return s, nil
}

// Listeners are the server's three listening sockets; Serve closes them.
type Listeners struct {
	Tunnel, HTTP, Admin net.Listener
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
	if err != nil {
		closeAll(ls)
		return err
	}
	return s.Serve(ctx, ls)
}

// Serve serves on ls until ctx ends, then drains: it stops accepting, lets
// in-flight requests finish (bounded by ShutdownTimeout) and closes the
// tunnels. It returns after every goroutine it started has ended.
func (s *Server) Serve(ctx context.Context, ls Listeners) error {
	plugin := auth.NewPlugin(s.verifier, s.tenancy, s.log.Named("auth"), s.metrics)
	var lc net.ListenConfig
	pluginLn, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		closeAll(ls)
		return fmt.Errorf("listen for the in-process auth plugin: %w", err)
	}
	pluginPath := randomPath()
	pluginMux := http.NewServeMux()
	pluginMux.Handle(pluginPath, plugin)
	pluginSrv := &http.Server{Handler: pluginMux, ReadHeaderTimeout: 10 * time.Second}

	if s.cfg.PublicURL == "" {
		s.cfg.PublicURL = defaultPublicURL(s.cfg.Domain, ls.HTTP.Addr())
	}
	s.frpConns = tunnel.NewConnListener(ls.Tunnel.Addr())
	frp, err := startFRP(s.cfg.Domain, pluginLn.Addr().String(), pluginPath, plugin.Ops(), s.frpConns)
	if err != nil {
		_ = pluginLn.Close()
		closeAll(ls)
		return err
	}
	s.frpVhostAddr = frp.vhostAddr

	entrySrv := &http.Server{
		Handler:           http.HandlerFunc(s.serveEntry),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          zap.NewStdLog(s.log.Named("entry")),
	}
	adminSrv := &http.Server{Handler: s.adminHandler(), ReadHeaderTimeout: 10 * time.Second}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return serveHTTP(pluginSrv, pluginLn) })
	g.Go(func() error { return serveHTTP(entrySrv, ls.HTTP) })
	g.Go(func() error { return serveHTTP(adminSrv, ls.Admin) })
	g.Go(func() error { return s.serveTunnel(ls.Tunnel) })
	g.Go(func() error {
		<-gctx.Done()
		s.shutdown(ls.Tunnel, entrySrv)
		_ = adminSrv.Close()
		_ = pluginSrv.Close()
		frp.Close()
		return nil
	})

	s.log.Info("tether server started",
		zap.String("tunnel_addr", ls.Tunnel.Addr().String()), zap.String("http_addr", ls.HTTP.Addr().String()),
		zap.String("admin_addr", ls.Admin.Addr().String()), zap.String("domain", s.cfg.Domain))
	if s.certs.selfSignedOnly() {
		s.log.Info("tunnel listener uses a self-signed certificate; pin it on clients with --tls-fingerprint",
			zap.String("sha256_fingerprint", s.certs.Fingerprint()))
	}
	s.ready.Store(true)
	err = g.Wait()
	if ctx.Err() != nil && err == nil {
		s.log.Info("tether server stopped")
	}
	return err
}

// shutdown drains: readiness fails at once so load balancers stop sending,
// no new tunnel clients are accepted, in-flight requests get ShutdownTimeout
// to finish, then every session closes and its client reconnects elsewhere.
func (s *Server) shutdown(tunnelLn net.Listener, entrySrv *http.Server) {
	s.draining.Store(true)
	s.log.Info("draining", zap.Duration("timeout", s.cfg.ShutdownTimeout))
	_ = tunnelLn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := entrySrv.Shutdown(ctx); err != nil {
		s.log.Warn("in-flight requests did not finish in time; closing them", zap.Error(err))
		_ = entrySrv.Close()
	}
	for _, sess := range s.tenancy.all() {
		sess.Close("server shutting down")
	}
	s.conns.Wait()
}

// serveHTTP runs srv on ln; a closed server is a normal end.
func serveHTTP(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func closeAll(ls Listeners) {
	for _, ln := range []net.Listener{ls.Tunnel, ls.HTTP, ls.Admin} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// Fingerprint is the SHA-256 fingerprint of the tunnel listener's current
// certificate.
func (s *Server) Fingerprint() string { return s.certs.Fingerprint() }
