package main

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel/server"
	"github.com/tether-dev/tether/tunnel/server/buffer"
	"github.com/tether-dev/tether/tunnel/server/registry"
	"github.com/tether-dev/tether/tunnel/server/webhook"
)

// ServerOptions are the flags of `tether server`.
type ServerOptions struct {
	TunnelAddr        string
	HTTPAddr          string
	AdminAddr         string
	Domain            string
	PublicURL         string
	JWTPublicKey      string
	JWTHMACSecretFile string
	JWTIssuer         string
	JWTAudience       string
	TLSCert           string
	TLSKey            string
	AdminTokenFile    string
	TrustedProxies    []string
	HeartbeatTimeout  time.Duration
	ShutdownTimeout   time.Duration
	MaxAnonymousPerIP int
	// Several replicas (see "Running more than one replica" in the README).
	Registry             string
	RegistryPasswordFile string
	ReplicaID            string
	PeerAddr             string
	PeerAdvertiseAddr    string
	PeerSecretFile       string
	PeerTLSCert          string
	PeerTLSKey           string
	PeerTLSCA            string
	MaxSessionsPerTunnel int
	MaxRequestsPerTunnel int
	MaxHTTPConnections   int
	MemoryLimit          string
	// Fair shares of the public entry's connections and of a tunnel's
	// requests (see "Limits of the public entry" in the README).
	MaxHTTPConnectionsPerIP int
	MaxRequestsPerCaller    int
	BodyIdleTimeout         time.Duration
	// What outlives the process, and the tokens' lifecycle.
	DataDir         string
	TokenRenewalKey string
	// One JSON line per public request (see "Access log" in
	// docs/operations.md).
	AccessLog bool
	// The webhook buffer: the requests of routes with the buffer option
	// stored while their tunnel is down (docs/operations.md).
	BufferRetention     time.Duration
	BufferMaxBody       int64
	BufferMaxRequests   int
	BufferMaxBytes      int64
	BufferMaxTotalBytes int64
}

// NewCmdServer builds `tether server`. runF replaces running the server
// (tests assert on the parsed options); nil runs it.
func NewCmdServer(f *Factory, runF func(*ServerOptions) error) *cobra.Command {
	opts := &ServerOptions{}
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the tunnel server: accept tunnel clients and serve <tunnel>.<domain>",
		Long: `Run the tunnel server.

Tunnel clients connect to --tunnel-addr (TLS, or wss) and log in with a JWT
verified against --jwt-public-key. The tunnel named N is served at N.<domain>
on --http-addr, and only there. --admin-addr serves /healthz, /readyz,
/metrics, /api/tunnels (this replica's sessions) and /api/fleet (every
replica's tunnels, from the registry).

Without --tls-cert/--tls-key the tunnel listener uses a self-signed
certificate and logs its SHA-256 fingerprint (pin it on clients with
--tls-fingerprint).

A tunnel may have several sessions: several client processes, each with
--connections sessions; requests are spread over them. Several replicas can
serve one domain behind an L4 load balancer: they share --registry (Redis),
and each forwards a request for a tunnel it does not hold to a replica that
does, over --peer-addr: TLS with mutual authentication, by certificates
made from --peer-secret-file (or read from --peer-tls-cert, --peer-tls-key
and --peer-tls-ca).

On SIGTERM the server drains: readiness fails, no new clients are accepted,
tether clients move to other replicas before their sessions here close, and
in-flight requests finish, all within --shutdown-timeout; then it exits 0.

A connection must log in promptly, and may send little before it has;
connections not yet logged in are capped (1024 in all, --max-anonymous-per-ip
from one address, four times that from one /24 or IPv6 /48) and closed before
TLS over the cap; at the cap of 1024 the one that kept the server waiting
longest makes room, and a quarter of them is kept for addresses whose clients
were logged in within the hour.

The public entry shares fairly too: --max-http-connections-per-ip from one
address, and at either cap the connection idle longest makes room; one caller
holds at most --max-requests-per-caller of a tunnel's requests in flight, and
websockets and event streams at most half of them; a request body that sends
nothing for --body-idle-timeout is answered 408.

With --data-dir (one replica) or a Redis --registry (several), a POST, PUT or
PATCH to a route its client advertised with the buffer option (the default
/webhooks route has it) that cannot reach the tunnel (no session, or its
upstream refused the connection) is stored and answered 202 Accepted with
X-Tether-Buffered, then delivered in order once the tunnel is back, for
--buffer-retention after the tunnel was last seen. Without either, buffering
is off and such requests are answered as any other.`,
		Example: `  tether server --domain tunnels.example.com --jwt-public-key /etc/tether/jwt.pub.pem \
    --tls-cert /etc/tether/tls.crt --tls-key /etc/tether/tls.key

  # one of several replicas
  tether server --domain tunnels.example.com --jwt-public-key /etc/tether/jwt.pub.pem \
    --registry redis://redis.tether.svc:6379/0 --registry-password-file /etc/tether/redis-password \
    --replica-id "$POD_NAME" --peer-addr 0.0.0.0:7443 --peer-advertise-addr "$POD_IP:7443" \
    --peer-secret-file /etc/tether/peer-secret`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			return runServer(cmd, f, opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.TunnelAddr, "tunnel-addr", "0.0.0.0:7000", "address tunnel clients connect to (TLS or wss)")
	fl.StringVar(&opts.HTTPAddr, "http-addr", "0.0.0.0:8080", "public HTTP entry: requests for <tunnel>.<domain>")
	fl.StringVar(&opts.AdminAddr, "admin-addr", "127.0.0.1:7700", "admin endpoints: /healthz /readyz /metrics /api/tunnels /api/fleet (a non-loopback address needs --admin-token-file)")
	fl.StringVar(&opts.Domain, "domain", "", "domain under which tunnel N is served as N.<domain> (required)")
	fl.StringVar(&opts.PublicURL, "public-url", "", "where the platform reaches tunnels, '*' for the tunnel name, e.g. https://*.tunnels.example.com (default http://*.<domain>:<http port>); tether diagnose tests it")
	fl.StringVar(&opts.JWTPublicKey, "jwt-public-key", "", "file of trusted token keys: PEM public keys (Ed25519, ES256, RS256) or a JWKS; re-read when it changes")
	fl.StringVar(&opts.JWTHMACSecretFile, "jwt-hmac-secret-file", "", "file holding an HS256 secret; only when tokens are HMAC-signed")
	fl.StringVar(&opts.JWTIssuer, "jwt-issuer", "", "require this iss claim")
	fl.StringVar(&opts.JWTAudience, "jwt-audience", "", "require this aud claim")
	fl.StringVar(&opts.TLSCert, "tls-cert", "", "tunnel listener certificate (PEM); re-read when it changes")
	fl.StringVar(&opts.TLSKey, "tls-key", "", "tunnel listener private key (PEM)")
	fl.StringVar(&opts.AdminTokenFile, "admin-token-file", "", "file holding the bearer token that /api/ and /metrics require (/healthz and /readyz stay open)")
	fl.StringSliceVar(&opts.TrustedProxies, "trusted-proxies", nil, "CIDRs (or IPs) of proxies in front of --http-addr whose X-Forwarded-* headers are kept")
	fl.DurationVar(&opts.HeartbeatTimeout, "heartbeat-timeout", 60*time.Second, "drop a client connection that stays silent this long (a client that returns takes its route over at once anyway)")
	fl.DurationVar(&opts.ShutdownTimeout, "shutdown-timeout", 25*time.Second, "on SIGTERM, how long clients may take to move to other replicas and in-flight requests to finish before tunnels close")
	fl.IntVar(&opts.MaxAnonymousPerIP, "max-anonymous-per-ip", 64, "tunnel connections not yet logged in allowed from one client address (an IPv6 /64), and four times that from one /24 (IPv6 /48); more are closed before TLS. Raise it when a load balancer in front hides client addresses (externalTrafficPolicy: Cluster)")
	fl.IntVar(&opts.MaxSessionsPerTunnel, "max-sessions-per-tunnel", 16, "sessions one tunnel may have on this replica (its clients' --connections, summed); more logins are refused")
	fl.IntVar(&opts.MaxHTTPConnections, "max-http-connections", 8192, "connections the public entry (--http-addr) holds at once, websockets included, and the peer port the same; at the cap the connection idle longest is closed to make room, and with none idle a new one is closed at accept")
	fl.IntVar(&opts.MaxHTTPConnectionsPerIP, "max-http-connections-per-ip", 1024, "public entry connections from one caller address (an IPv6 /64), --trusted-proxies not counted; at the cap that address's connection idle longest is closed to make room, and with none idle a new one is closed at accept")
	fl.IntVar(&opts.MaxRequestsPerTunnel, "max-requests-per-tunnel", 1024, "requests one tunnel may have in flight on this replica (long polls and event streams included; websockets and event streams at most half); more are answered 503 tunnel_busy")
	fl.IntVar(&opts.MaxRequestsPerCaller, "max-requests-per-caller", 0, "requests one caller (its address, or the client address --trusted-proxies give) may have in flight to one tunnel on this replica, and as many websockets and event streams; more are answered 429 caller_busy (default a quarter of --max-requests-per-tunnel)")
	fl.DurationVar(&opts.BodyIdleTimeout, "body-idle-timeout", 30*time.Second, "a public request whose body sends nothing this long is answered 408 and its connection closed")
	fl.StringVar(&opts.Registry, "registry", "memory", "where replicas share which of them serve which tunnel: memory (one replica), or redis://HOST:PORT[/DB] / rediss://... for several")
	fl.StringVar(&opts.RegistryPasswordFile, "registry-password-file", "", "file holding the Redis password (instead of putting it in --registry)")
	fl.StringVar(&opts.ReplicaID, "replica-id", "", "this replica's name among the others, e.g. the pod name (default: the hostname)")
	fl.StringVar(&opts.PeerAddr, "peer-addr", "", "listener for requests other replicas forward here, e.g. 0.0.0.0:7443 (required with a Redis --registry)")
	fl.StringVar(&opts.PeerAdvertiseAddr, "peer-advertise-addr", "", "HOST:PORT the other replicas dial to reach --peer-addr, e.g. $(POD_IP):7443, an IPv6 address with or without brackets (default --peer-addr; required when that is a wildcard)")
	fl.StringVar(&opts.PeerSecretFile, "peer-secret-file", "", "file holding the secret all replicas share (at least 16 random bytes; one a line while rotating: the first signs, all are trusted); the peer port's TLS certificates are made from it, so only replicas that hold it forward to each other (required with a Redis --registry, unless --peer-tls-* are given); re-read when it changes")
	fl.StringVar(&opts.PeerTLSCert, "peer-tls-cert", "", "this replica's peer certificate (PEM, for server and client authentication), instead of one made from --peer-secret-file, e.g. from cert-manager; re-read when it changes")
	fl.StringVar(&opts.PeerTLSKey, "peer-tls-key", "", "the private key of --peer-tls-cert (PEM)")
	fl.StringVar(&opts.PeerTLSCA, "peer-tls-ca", "", "the CA (PEM) that signs every replica's --peer-tls-cert, and nothing else: the peer port admits a replica whose certificate chains to it")
	fl.StringVar(&opts.DataDir, "data-dir", "", "directory (on a persistent volume) where a single replica keeps what must outlive a restart: the revocations and the buffered webhooks, in DIR/tether.db; with a Redis --registry the replicas keep it in Redis (leave this out); without either it is kept in memory")
	fl.StringVar(&opts.TokenRenewalKey, "token-renewal-key", "", "private key (PEM: Ed25519, ES256 or RS256) to renew tether clients' tokens with, a third of their lifetime before they expire, so that tunnels outlive their first token; its public key must be in --jwt-public-key")
	fl.DurationVar(&opts.BufferRetention, "buffer-retention", registry.DefaultRetention, "how long a buffered webhook is kept for delivery, and how long after a tunnel was last seen its buffered routes still buffer")
	fl.Int64Var(&opts.BufferMaxBody, "buffer-max-body", webhook.DefaultMaxBody, "largest body of a request that is buffered, in bytes; a larger one is answered as unbuffered")
	fl.IntVar(&opts.BufferMaxRequests, "buffer-max-requests", buffer.DefaultMaxRequests, "requests one tunnel may have buffered; more are answered 503 buffer_full")
	fl.Int64Var(&opts.BufferMaxBytes, "buffer-max-bytes", buffer.DefaultMaxBytes, "bytes one tunnel may have buffered; more are answered 503 buffer_full")
	fl.Int64Var(&opts.BufferMaxTotalBytes, "buffer-max-total-bytes", buffer.DefaultMaxTotalBytes, "bytes buffered for all tunnels (with Redis: by all replicas, in Redis's memory); more are answered 503 buffer_full")
	fl.StringVar(&opts.MemoryLimit, "memory-limit", "", memoryLimitHelp)
	fl.BoolVar(&opts.AccessLog, "access-log", false, "log one line per public request (logger \"access\", at info): tunnel, route, method, path without query, status, X-Tether-Error, duration, bytes, request ID, replica, forwarded; never a query, header, body or token")
	return cmd
}

func runServer(cmd *cobra.Command, f *Factory, opts *ServerOptions) error {
	log := f.Logger()
	limit, err := resolveMemoryLimit(f, opts.MemoryLimit)
	if err != nil {
		return invalid(err)
	}
	verifier, err := newVerifier(opts, log)
	if err != nil {
		return invalid(err)
	}
	trusted, err := parsePrefixes(opts.TrustedProxies)
	if err != nil {
		return invalid(err)
	}
	srv, err := server.New(server.Config{
		TunnelAddr:        opts.TunnelAddr,
		HTTPAddr:          opts.HTTPAddr,
		AdminAddr:         opts.AdminAddr,
		Domain:            opts.Domain,
		PublicURL:         opts.PublicURL,
		TLSCertFile:       opts.TLSCert,
		TLSKeyFile:        opts.TLSKey,
		AdminTokenFile:    opts.AdminTokenFile,
		TrustedProxies:    trusted,
		HeartbeatTimeout:  opts.HeartbeatTimeout,
		ShutdownTimeout:   opts.ShutdownTimeout,
		MaxAnonymousPerIP: opts.MaxAnonymousPerIP,

		MaxSessionsPerTunnel: opts.MaxSessionsPerTunnel,
		MaxRequestsPerTunnel: opts.MaxRequestsPerTunnel,
		MaxRequestsPerCaller: opts.MaxRequestsPerCaller,
		MaxHTTPConnections:   opts.MaxHTTPConnections,
		BodyIdleTimeout:      opts.BodyIdleTimeout,
		AccessLog:            opts.AccessLog,

		MaxHTTPConnectionsPerIP: opts.MaxHTTPConnectionsPerIP,

		Registry:             opts.Registry,
		RegistryPasswordFile: opts.RegistryPasswordFile,
		ReplicaID:            opts.ReplicaID,
		PeerAddr:             opts.PeerAddr,
		PeerAdvertiseAddr:    opts.PeerAdvertiseAddr,
		PeerSecretFile:       opts.PeerSecretFile,
		PeerTLSCertFile:      opts.PeerTLSCert,
		PeerTLSKeyFile:       opts.PeerTLSKey,
		PeerTLSCAFile:        opts.PeerTLSCA,
		DataDir:              opts.DataDir,
		TokenRenewalKeyFile:  opts.TokenRenewalKey,

		BufferRetention:     opts.BufferRetention,
		BufferMaxBody:       opts.BufferMaxBody,
		BufferMaxRequests:   opts.BufferMaxRequests,
		BufferMaxBytes:      opts.BufferMaxBytes,
		BufferMaxTotalBytes: opts.BufferMaxTotalBytes,
	}, verifier, log)
	if err != nil {
		return invalid(err)
	}
	applyMemoryLimit(f, limit)
	return srv.Run(cmd.Context())
}

// newVerifier builds the token verifier from the key flags.
func newVerifier(opts *ServerOptions, log *zap.Logger) (*auth.Verifier, error) {
	var keys auth.KeySource
	var err error
	switch {
	case opts.JWTPublicKey != "" && opts.JWTHMACSecretFile != "":
		return nil, errors.New("--jwt-public-key and --jwt-hmac-secret-file exclude each other: choose how tokens are signed")
	case opts.JWTPublicKey != "":
		if keys, err = auth.NewFileKeySource(opts.JWTPublicKey); err != nil {
			return nil, fmt.Errorf("--jwt-public-key: %w", err)
		}
	case opts.JWTHMACSecretFile != "":
		if keys, err = auth.NewHMACKeySource(opts.JWTHMACSecretFile); err != nil {
			return nil, fmt.Errorf("--jwt-hmac-secret-file: %w", err)
		}
	default:
		return nil, errors.New("--jwt-public-key is required: the public key tokens are signed with (make a pair with `tether token keygen`)")
	}
	return auth.NewVerifier(auth.VerifierConfig{
		Keys:     keys,
		Issuer:   opts.JWTIssuer,
		Audience: opts.JWTAudience,
		OnKeyError: func(err error) {
			log.Error("reload token keys failed; the previous keys stay in force", zap.Error(err))
		},
	})
}

// parsePrefixes reads --trusted-proxies: CIDRs or single addresses.
func parsePrefixes(values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, v := range values {
		v = strings.TrimSpace(v)
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, p.Masked())
			continue
		}
		if a, err := netip.ParseAddr(v); err == nil {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		errs = append(errs, fmt.Errorf("--trusted-proxies %q: want a CIDR like 10.0.0.0/8 or an IP address", v))
	}
	return out, errors.Join(errs...)
}
