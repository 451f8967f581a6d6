// Package client is tether's tunnel client: it runs in the customer's
// cluster, dials out to the tunnel server, keeps Config.Connections
// multiplexed TLS sessions up, and connects the server to its routes'
// upstreams. It runs no HTTP router: the server routes each request, by the
// routes this client advertised at login (see package proxy), and the client
// only checks the address it is asked to dial and copies bytes.
//
//	c, err := client.New(client.Config{
//		Server:    "tunnels.example.com:443",
//		TokenFile: "/var/run/tether/token",
//		Routes:    proxy.DefaultRoutes(),
//	}, log)
//	err = c.Run(ctx) // reconnects by itself until ctx ends
//
// The engine is frp's client control (client.NewControl): it registers the
// tunnel's route. The connection (egress proxy, TLS, wss), its yamux
// session, the login and the reconnect loop are tether's: the token file is
// re-read at every login. The client advertises its routes at login; the
// server routes each request by them and asks the client, on a stream of the
// session, to connect to the chosen route's upstream. The client does so
// only when the address is the proxy.Route.DialAddr of one of its own
// routes (the upstream allow-list), then copies bytes both ways.
//
// Each session belongs to a slot (slot.go), which reconnects it on its own;
// the tunnel is ready while any slot's session is logged in with its route.
// A slot logs in as run ID "<instance>-<k>" with route
// "<tunnel>.<instance>-<k>", with a random instance ID per process, or as
// "<instance>-<k>b" once it has moved off a shared replica (see below). The
// server also opens streams to send notices (tunnel.Notice): the replica a
// session landed on, after which a slot that shares its replica with
// another slot reconnects to reach a different one (three times at once,
// then in rounds, with a session opened beside the one that serves, for as
// long as it shares and the server has other replicas), and that the
// replica drains, after which the slot opens a replacement session while
// the old one serves on until the server closes it; and the renewal of the
// client's token (tokens.go), with which every later login of the process
// goes, unless the token file holds a newer token. A renewal is kept in
// Config.RenewedTokenFile, when set, for a restart in the same pod. Without
// renewals, the client warns 7 days and 1 day before its token expires.
//
// It never dials anything but the tunnel server and the routes' upstreams.
package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	frpauth "github.com/fatedier/frp/pkg/auth"
	v1 "github.com/fatedier/frp/pkg/config/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/tether-dev/tether/internal/version"
	"github.com/tether-dev/tether/proxy"
)

// Config configures a Client. Zero durations take the documented defaults.
type Config struct {
	// Server is the tunnel server, HOST:PORT.
	Server string
	// TokenFile holds the JWT; it is re-read at every connect, so a rotated
	// Kubernetes Secret takes effect without a restart.
	TokenFile string
	// RenewedTokenFile, when set, is where the client keeps the newest
	// renewed token the server sent (mode 0600, replaced atomically), and
	// where it looks for one at start: so that a restart of the client in
	// the same pod (the file in an emptyDir) logs in with the renewal after
	// TokenFile's token has expired. Its directory must exist. "" keeps
	// renewals in memory only.
	RenewedTokenFile string
	// Routes are advertised to the server at login, which routes requests
	// by them; the client dials their upstreams (proxy.Route.DialAddr) and
	// nothing else. Empty: proxy.DefaultRoutes().
	Routes []proxy.Route
	// HealthAddr serves /healthz, /readyz, /status and /metrics. "" = none.
	HealthAddr string
	// Transport is "tcp" (TLS over TCP, the default) or "wss" (TLS websocket,
	// for networks that let only HTTPS out).
	Transport string
	// Proxy is the egress proxy URL (http://, https://, socks5://, socks5h://;
	// user:password@ for authentication). "" takes HTTPS_PROXY / ALL_PROXY
	// with NO_PROXY from the environment; "direct" ignores the environment.
	Proxy string
	// TLSCAFile adds CA certificates to the system pool for verifying the
	// server, e.g. the CA of a TLS-inspecting proxy.
	TLSCAFile string
	// TLSServerName overrides the name verified in the server's certificate.
	TLSServerName string
	// TLSFingerprint pins the server's certificate by its SHA-256 (hex, colons
	// optional) instead of verifying a chain: for self-signed servers.
	TLSFingerprint string
	// TLSInsecureSkipVerify disables server certificate verification.
	TLSInsecureSkipVerify bool
	// HeartbeatTimeout is how fast a dead connection is noticed. Default 15s.
	HeartbeatTimeout time.Duration
	// DialTimeout bounds one connection attempt (TCP, proxy, TLS). Default 10s.
	DialTimeout time.Duration
	// MaxReconnectDelay caps the exponential backoff between connection
	// attempts. Default 30s.
	MaxReconnectDelay time.Duration
	// Connections is how many sessions to the server the client keeps, each
	// with its own reconnect loop, 1 to MaxConnections. Default 2: requests
	// keep flowing while one session reconnects, and behind a load balancer
	// the sessions spread over the server's replicas.
	Connections int
	// Getenv reads the environment (egress proxy variables); nil = os.Getenv.
	Getenv func(string) string
}

func (c *Config) setDefaults() {
	if c.Transport == "" {
		c.Transport = "tcp"
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 15 * time.Second
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.MaxReconnectDelay == 0 {
		c.MaxReconnectDelay = 30 * time.Second
	}
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	if c.Connections == 0 {
		c.Connections = DefaultConnections
	}
	if len(c.Routes) == 0 {
		c.Routes = proxy.DefaultRoutes()
	}
}

// Validate reports every problem of the configuration, each naming its flag.
func (c *Config) Validate() error {
	var errs []error
	if _, port, err := net.SplitHostPort(c.Server); err != nil || port == "" {
		errs = append(errs, fmt.Errorf("--server %q: want HOST:PORT of the tunnel server, e.g. tunnels.example.com:443", c.Server))
	}
	if c.TokenFile == "" {
		errs = append(errs, errors.New("--token-file is required: the file holding this tunnel's JWT (a mounted Secret)"))
	}
	if c.RenewedTokenFile != "" && filepath.Clean(c.RenewedTokenFile) == filepath.Clean(c.TokenFile) {
		errs = append(errs, fmt.Errorf("--renewed-token-file %s is the --token-file: the client writes renewals there; name a file in a writable volume (an emptyDir)", c.RenewedTokenFile))
	}
	if c.Transport != "tcp" && c.Transport != "wss" {
		errs = append(errs, fmt.Errorf("--transport %q: want tcp or wss", c.Transport))
	}
	if c.TLSInsecureSkipVerify && (c.TLSCAFile != "" || c.TLSFingerprint != "") {
		errs = append(errs, errors.New("--tls-insecure-skip-verify cannot be combined with --tls-ca or --tls-fingerprint: choose one way to trust the server"))
	}
	if c.TLSFingerprint != "" && c.TLSCAFile != "" {
		errs = append(errs, errors.New("--tls-fingerprint and --tls-ca exclude each other: pin the certificate or verify its chain"))
	}
	if c.TLSFingerprint != "" {
		if _, err := parseFingerprint(c.TLSFingerprint); err != nil {
			errs = append(errs, fmt.Errorf("--tls-fingerprint: %w", err))
		}
	}
	if _, err := parseProxyFlag(c.Proxy); err != nil {
		errs = append(errs, err)
	}
	if c.HeartbeatTimeout < 3*time.Second {
		errs = append(errs, fmt.Errorf("--heartbeat-timeout %v: want at least 3s", c.HeartbeatTimeout))
	}
	if err := ValidConnections(c.Connections); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// DefaultConnections and MaxConnections bound Config.Connections.
const (
	DefaultConnections = 2
	MaxConnections     = 16
)

// ValidConnections checks a --connections value.
func ValidConnections(n int) error {
	if n < 1 || n > MaxConnections {
		return fmt.Errorf("--connections %d: want 1 to %d sessions to the server (default %d)", n, MaxConnections, DefaultConnections)
	}
	return nil
}

// Client keeps a tunnel connected and serves its requests.
type Client struct {
	cfg       Config
	log       *zap.Logger
	tunnel    string // from the token's sub, fixed for the process
	routes    []proxy.Route
	upstreams *upstreams
	// advertisedRoutes is the routes as the login advertises them: a JSON
	// list of route specs.
	advertisedRoutes string
	dialer           *dialer
	status           *status
	tokens           *tokens
	logs             *recentLogs
	metrics          *prometheus.Registry

	// instance tells this process's sessions from those of other processes
	// serving the tunnel: 8 random hex digits, the prefix of its slots' run
	// IDs.
	instance string
	slots    []*slot
	// dial makes one connection to the server; via names the path taken.
	dial func(ctx context.Context) (conn net.Conn, via string, err error)

	frpConfig *v1.ClientCommonConfig
	frpAuth   *frpauth.ClientAuth
}

// New validates cfg and its routes and reads the token once to learn the
// tunnel's name. It does not connect.
func New(cfg Config, log *zap.Logger) (*Client, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	token, err := readTokenFile(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	name := token.Claims.Tunnel
	dialer, err := newDialer(cfg)
	if err != nil {
		return nil, err
	}
	routes, err := proxy.ValidateRoutes(cfg.Routes)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	logs := newRecentLogs()
	c := &Client{
		cfg:              cfg,
		log:              logs.tee(log).With(zap.String("tunnel", name)),
		logs:             logs,
		tunnel:           name,
		routes:           routes,
		upstreams:        newUpstreams(routes, reg),
		advertisedRoutes: advertise(routes),
		dialer:           dialer,
		metrics:          reg,
		instance:         newInstanceID(),
		dial:             dialer.dial,
	}
	if c.frpConfig, c.frpAuth, err = frpClientConfig(cfg.Server); err != nil {
		return nil, err
	}
	if c.tokens, err = newTokens(cfg, token, c.log); err != nil {
		return nil, err
	}
	for i := range cfg.Connections {
		c.slots = append(c.slots, newSlot(c, i))
	}
	c.status = newStatus(name, cfg.Server, cfg.Transport, routes, cfg.Connections, time.Now())
	reg.MustRegister(c.status.collectors()...)
	reg.MustRegister(c.tokens.collectors()...)
	reg.MustRegister(version.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return c, nil
}

// newInstanceID returns 32 random bits as hex.
func newInstanceID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Tunnel is the name of the tunnel this client serves (the token's sub).
func (c *Client) Tunnel() string { return c.tunnel }

// Run connects and serves until ctx ends, reconnecting by itself. It listens
// on HealthAddr when set.
func (c *Client) Run(ctx context.Context) error {
	var health net.Listener
	if c.cfg.HealthAddr != "" {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", c.cfg.HealthAddr)
		if err != nil {
			return fmt.Errorf("listen on --health-addr %s: %w; pick a free port or stop the process using it", c.cfg.HealthAddr, err)
		}
		health = ln
	}
	return c.Serve(ctx, health)
}

// Serve is Run with the health listener given (nil for none); it closes it.
func (c *Client) Serve(ctx context.Context, health net.Listener) error {
	healthSrv := &http.Server{Handler: c.healthHandler(), ReadHeaderTimeout: 10 * time.Second}
	g, gctx := errgroup.WithContext(ctx)
	if health != nil {
		g.Go(func() error {
			if err := healthSrv.Serve(health); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			return healthSrv.Close()
		})
	}
	for _, s := range c.slots {
		g.Go(func() error { s.run(gctx); return nil })
	}
	g.Go(func() error { c.tokens.warnLoop(gctx); return nil })
	c.log.Info("tether client started", zap.String("server", c.cfg.Server), zap.String("transport", c.cfg.Transport),
		zap.String("health_addr", addrString(health)), zap.Strings("routes", routeStrings(c.routes)),
		zap.Int("connections", len(c.slots)), zap.String("instance", c.instance))
	err := g.Wait()
	c.log.Info("tether client stopped")
	return err
}

func advertise(routes []proxy.Route) string {
	b, _ := json.Marshal(routeStrings(routes)) // a []string always marshals
	return string(b)
}

func routeStrings(routes []proxy.Route) []string {
	out := make([]string, len(routes))
	for i, r := range routes {
		out[i] = r.String()
	}
	return out
}

func addrString(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}
