package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/client"
)

// ClientOptions are the flags of `tether client`.
type ClientOptions struct {
	Server                string
	TokenFile             string
	RenewedTokenFile      string
	Routes                []string
	HealthAddr            string
	Transport             string
	Proxy                 string
	TLSCA                 string
	TLSServerName         string
	TLSFingerprint        string
	TLSInsecureSkipVerify bool
	HeartbeatTimeout      time.Duration
	DialTimeout           time.Duration
	MaxReconnectDelay     time.Duration
	Connections           int
	MemoryLimit           string
}

// NewCmdClient builds `tether client`. runF replaces running the client
// (tests assert on the parsed options); nil runs it.
func NewCmdClient(f *Factory, runF func(*ClientOptions) error) *cobra.Command {
	opts := &ClientOptions{}
	cmd := &cobra.Command{
		Use:   "client",
		Short: "Run the tunnel client: connect out to the server and serve the tunnel's routes",
		Long: `Run the tunnel client.

The client dials out to --server (TLS over TCP, or wss), logs in with the JWT in
--token-file (re-read at every connect, so a rotated Secret takes effect without
a restart), and advertises its --route table. The server routes the tunnel's
requests by path prefix and the client connects each one to the upstream of
its --route, and to nothing else.

A server with --token-renewal-key sends the client a renewed token when a third
of its token's lifetime is left; every later login of the process uses the
newest token it has (a newer token written into --token-file still wins), so
the tunnel outlives its first token. --renewed-token-file keeps the renewal
across a restart of the client in the same pod. Without renewals the client
warns 7 days and 1 day before its token expires (log, /status, metrics).

Without --route it serves the default adapters:
  /            app-proxy        http://app-proxy:8080
  /argo-cd     Argo CD          http://argocd-server:80
  /workflows   Argo Workflows   https://argo-server:2746/
  /webhooks    Argo Events      http://webhook-eventsource-svc:12000/
  /rollouts    Argo Rollouts    http://argo-rollouts-dashboard:3100

A route is PREFIX=URL[;timeout=DURATION][;insecure-skip-verify]. When URL has a
path (even "/"), the prefix is replaced by it; otherwise the path is kept.

The client keeps --connections sessions to the server (2 by default), each
with its own reconnect loop: the tunnel is ready (/readyz 200) while one of them
serves, so requests keep flowing while another reconnects. Behind a load
balancer the sessions spread over the server's replicas, and when a replica
drains, its sessions move to another before they close.

The egress proxy comes from --proxy or HTTPS_PROXY/ALL_PROXY (NO_PROXY honoured):
http://, https:// (CONNECT, user:password@ for basic auth), socks5:// or socks5h://.`,
		Example: `  tether client --server tunnels.example.com:443 --token-file /var/run/tether/token \
    --route /=http://app-proxy:8080 --route '/workflows=https://argo-server:2746/;insecure-skip-verify' \
    --health-addr 0.0.0.0:8081`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			cfg, err := opts.config(f)
			limit, lerr := resolveMemoryLimit(f, opts.MemoryLimit)
			if err := errors.Join(err, lerr); err != nil {
				return invalid(err)
			}
			c, err := client.New(cfg, f.Logger())
			if err != nil {
				return invalid(err)
			}
			applyMemoryLimit(f, limit)
			return c.Run(cmd.Context())
		},
	}
	opts.addFlags(cmd.Flags())
	return cmd
}

// addFlags defines the client's flags; `tether diagnose` takes them too.
func (o *ClientOptions) addFlags(fl *pflag.FlagSet) {
	fl.StringVar(&o.Server, "server", "", "tunnel server HOST:PORT (required)")
	fl.StringVar(&o.TokenFile, "token-file", "", "file holding the tunnel's JWT (required); re-read at every connect")
	fl.StringVar(&o.RenewedTokenFile, "renewed-token-file", "",
		"file where the client keeps the newest token the server renewed (0600), and reads it at start when newer than --token-file's, "+
			"e.g. in an emptyDir: a restart in the same pod logs in with it")
	fl.StringSliceVar(&o.Routes, "route", nil, "PREFIX=URL[;timeout=D][;insecure-skip-verify] (repeat); default: the built-in adapters")
	fl.StringVar(&o.HealthAddr, "health-addr", "", "serve /healthz, /readyz, /status, /metrics and /debug/logs here, e.g. 0.0.0.0:8081")
	fl.StringVar(&o.Transport, "transport", "tcp", "tcp (TLS over TCP) or wss (TLS websocket, when only HTTPS may leave the network)")
	fl.StringVar(&o.Proxy, "proxy", "", "egress proxy URL; default from HTTPS_PROXY/ALL_PROXY and NO_PROXY; \"direct\" ignores them")
	fl.StringVar(&o.TLSCA, "tls-ca", "", "extra CA certificates (PEM) to trust for the server, e.g. a TLS-inspecting proxy's CA")
	fl.StringVar(&o.TLSServerName, "tls-server-name", "", "name to verify in the server's certificate (default: the --server host)")
	fl.StringVar(&o.TLSFingerprint, "tls-fingerprint", "", "pin the server certificate's SHA-256 instead of verifying its chain (self-signed servers)")
	fl.BoolVar(&o.TLSInsecureSkipVerify, "tls-insecure-skip-verify", false, "do not verify the server's certificate (testing only)")
	fl.DurationVar(&o.HeartbeatTimeout, "heartbeat-timeout", 15*time.Second, "notice a dead connection within this long")
	fl.DurationVar(&o.DialTimeout, "dial-timeout", 10*time.Second, "bound on one connection attempt (TCP, proxy, TLS)")
	fl.DurationVar(&o.MaxReconnectDelay, "max-reconnect-delay", 30*time.Second, "cap of the exponential backoff between connection attempts")
	fl.IntVar(&o.Connections, "connections", client.DefaultConnections,
		fmt.Sprintf("sessions to the server (1 to %d), each reconnecting on its own; the tunnel is ready while one serves", client.MaxConnections))
	fl.StringVar(&o.MemoryLimit, "memory-limit", "", memoryLimitHelp)
}

// config turns the flags into the client's configuration. Routes that do not
// parse are left out and reported in the error.
func (o *ClientOptions) config(f *Factory) (client.Config, error) {
	var routes []proxy.Route
	var errs []error
	for _, spec := range o.Routes {
		r, err := proxy.ParseRoute(spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("--route: %w", err))
			continue
		}
		routes = append(routes, r)
	}
	// The client checks the range, but takes 0 for its default: given as a
	// flag, 0 is out of range.
	if o.Connections == 0 {
		errs = append(errs, client.ValidConnections(o.Connections))
	}
	return client.Config{
		Server:                o.Server,
		TokenFile:             o.TokenFile,
		RenewedTokenFile:      o.RenewedTokenFile,
		Routes:                routes,
		HealthAddr:            o.HealthAddr,
		Transport:             o.Transport,
		Proxy:                 o.Proxy,
		TLSCAFile:             o.TLSCA,
		TLSServerName:         o.TLSServerName,
		TLSFingerprint:        o.TLSFingerprint,
		TLSInsecureSkipVerify: o.TLSInsecureSkipVerify,
		HeartbeatTimeout:      o.HeartbeatTimeout,
		DialTimeout:           o.DialTimeout,
		MaxReconnectDelay:     o.MaxReconnectDelay,
		Connections:           o.Connections,
		Getenv:                f.Getenv,
	}, errors.Join(errs...)
}
