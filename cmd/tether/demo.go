package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"gopkg.in/yaml.v3"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/standin"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/client"
	"github.com/tether-dev/tether/tunnel/server"
)

// DemoOptions are the flags of `tether demo`.
type DemoOptions struct {
	HTTPAddr string
	Tunnel   string
}

// demoDomain makes tunnel N reachable as N.localhost, which browsers and
// curl resolve to loopback.
const demoDomain = "localhost"

// NewCmdDemo builds `tether demo`. runF replaces running it (tests); nil runs it.
func NewCmdDemo(f *Factory, runF func(*DemoOptions) error) *cobra.Command {
	opts := &DemoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a server, a client and stand-in backends on loopback, and print what to try",
		Long: `Run everything on loopback: a fresh signing key and token, a tunnel server, a
tunnel client logged in as tunnel "demo", and small stand-ins for app-proxy and
the Argo components (JSON, server-sent events, a websocket echo, a webhook
receiver). First it shows a webhook outliving an outage of the tunnel: it stops
the client, POSTs a webhook, which the server stores (202 Accepted), and starts
the client again, through which the server delivers it to the stand-in. Then
it prints the URLs and ready-to-paste curl commands, and runs until Ctrl-C.
Components log at warn unless --log-level says otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			log := f.Logger()
			if !cmd.Flags().Changed("log-level") {
				log = log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))
			}
			return runDemo(cmd.Context(), f.Out, log, opts)
		},
	}
	cmd.Flags().StringVar(&opts.HTTPAddr, "http-addr", "127.0.0.1:0", "public HTTP entry of the demo server (port 0 picks a free one)")
	cmd.Flags().StringVar(&opts.Tunnel, "tunnel", "demo", "tunnel name; it is served at <tunnel>.localhost")
	return cmd
}

func runDemo(ctx context.Context, out io.Writer, log *zap.Logger, opts *DemoOptions) error {
	if err := auth.ValidTunnelName(opts.Tunnel); err != nil {
		return invalid(fmt.Errorf("--tunnel: %w", err))
	}
	dir, err := os.MkdirTemp("", "tether-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tokenFile, pubKey, err := demoCredentials(dir, opts.Tunnel)
	if err != nil {
		return err
	}

	backends, err := standin.Start()
	if err != nil {
		return err
	}
	defer backends.Close()
	receiver, err := startWebhookReceiver()
	if err != nil {
		return err
	}
	defer receiver.Close()
	upstreams := maps.Clone(backends.URLs)
	upstreams[standin.ArgoEvents] = receiver.URL // the same stand-in, watched for deliveries

	keys, err := auth.NewFileKeySource(pubKey)
	if err != nil {
		return err
	}
	verifier, err := auth.NewVerifier(auth.VerifierConfig{Keys: keys})
	if err != nil {
		return err
	}
	ls, health, err := demoListeners(opts.HTTPAddr)
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{
		TunnelAddr: ls.Tunnel.Addr().String(), HTTPAddr: ls.HTTP.Addr().String(), AdminAddr: ls.Admin.Addr().String(),
		Domain:  demoDomain,
		DataDir: filepath.Join(dir, "data"), // where webhooks wait while the client is away
	}, verifier, log.Named("server"))
	if err != nil {
		return err
	}
	routes, err := demoRoutes(upstreams)
	if err != nil {
		return err
	}
	newClient := func() (*client.Client, error) {
		return client.New(client.Config{
			Server:         ls.Tunnel.Addr().String(),
			TokenFile:      tokenFile,
			Routes:         routes,
			TLSFingerprint: srv.Fingerprint(), // the demo server's self-signed certificate
			Proxy:          "direct",
		}, log.Named("client"))
	}
	first, err := newClient() // stopped to show a webhook outliving the outage
	if err != nil {
		return err
	}
	c, err := newClient()
	if err != nil {
		return err
	}

	clientConfig, err := writeDemoClientConfig(dir, ls.Tunnel.Addr().String(), tokenFile, srv.Fingerprint(), routes, health.Addr().String())
	if err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(gctx, ls) })
	g.Go(func() error {
		entry := "http://" + ls.HTTP.Addr().String()
		id, err := webhookDuringOutage(gctx, out, first, entry, opts.Tunnel)
		if err != nil {
			return err
		}
		g.Go(func() error { return c.Serve(gctx, health) })
		healthURL := "http://" + health.Addr().String()
		if err := waitTunnelReady(gctx, healthURL); err != nil {
			return err
		}
		d, err := receiver.wait(gctx, id, readyTimeout)
		if err != nil {
			return fmt.Errorf("%w (run with --log-level info to see why)", err)
		}
		printDelivered(out, d)
		printGuide(out, opts.Tunnel, ls, healthURL, clientConfig, os.Args[0])
		return nil
	})
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// demoCredentials writes a fresh key pair and a 24h token for tunnel into dir.
func demoCredentials(dir, tunnel string) (tokenFile, pubKey string, err error) {
	key, pub := filepath.Join(dir, "jwt.key.pem"), filepath.Join(dir, "jwt.pub.pem")
	if err := auth.GenerateKeyPair(auth.EdDSA, key, pub); err != nil {
		return "", "", err
	}
	signer, err := auth.LoadSigner(key)
	if err != nil {
		return "", "", err
	}
	token, err := signer.Issue(auth.IssueRequest{Tunnel: tunnel, Account: "demo", Runtime: "local", TTL: 24 * time.Hour}, time.Now())
	if err != nil {
		return "", "", err
	}
	tokenFile = filepath.Join(dir, "token")
	return tokenFile, pub, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
}

func demoListeners(httpAddr string) (server.Listeners, net.Listener, error) {
	var ls server.Listeners
	var health net.Listener
	var err error
	listen := func(addr string) net.Listener {
		if err != nil {
			return nil
		}
		var ln net.Listener
		var lc net.ListenConfig
		if ln, err = lc.Listen(context.Background(), "tcp", addr); err != nil {
			err = fmt.Errorf("listen on %s: %w; pick a free port, or 127.0.0.1:0 for any", addr, err)
		}
		return ln
	}
	ls.HTTP = listen(httpAddr)
	ls.Tunnel = listen("127.0.0.1:0")
	ls.Admin = listen("127.0.0.1:0")
	health = listen("127.0.0.1:0")
	if err != nil {
		for _, ln := range []net.Listener{ls.HTTP, ls.Tunnel, ls.Admin, health} {
			if ln != nil {
				_ = ln.Close()
			}
		}
		if httpAddr != "127.0.0.1:0" {
			err = invalid(fmt.Errorf("--http-addr: %w", err))
		}
	}
	return ls, health, err
}

// demoRoutes are the default adapters' routes pointed at the stand-ins,
// keeping each adapter's path handling.
func demoRoutes(urls map[string]string) ([]proxy.Route, error) {
	routes := proxy.DefaultRoutes()
	for i, r := range routes {
		u, err := url.Parse(urls[r.Adapter])
		if err != nil || urls[r.Adapter] == "" {
			return nil, fmt.Errorf("no stand-in for adapter %q", r.Adapter)
		}
		u.Path = r.Upstream.Path
		routes[i].Upstream = u
		routes[i].InsecureSkipVerify = false
	}
	return routes, nil
}

// readyTimeout bounds each wait of the demo: for its tunnel to be ready,
// for a webhook to be delivered.
const readyTimeout = 20 * time.Second

// waitTunnelReady waits for the client whose health endpoints are at
// healthURL to serve the tunnel.
func waitTunnelReady(ctx context.Context, healthURL string) error {
	if err := waitReady(ctx, healthURL+"/readyz", readyTimeout); err != nil {
		return fmt.Errorf("the demo tunnel did not become ready: %w (run with --log-level info to see why)", err)
	}
	return nil
}

// waitReady polls a readiness URL until it answers 200.
func waitReady(ctx context.Context, readyURL string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, readyURL, nil)
		resp, err := hc.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = string(b)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeDemoClientConfig writes the demo client's settings as a --config
// file, so that `tether diagnose --config FILE` sees what the client runs with.
func writeDemoClientConfig(dir, server, tokenFile, fingerprint string, routes []proxy.Route, healthAddr string) (string, error) {
	specs := make([]string, len(routes))
	for i, r := range routes {
		specs[i] = r.String()
	}
	b, err := yaml.Marshal(map[string]any{
		"server": server, "token-file": tokenFile, "tls-fingerprint": fingerprint,
		"route": specs, "health-addr": healthAddr, "proxy": "direct",
	})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "client.yaml")
	return path, os.WriteFile(path, b, 0o600)
}

// printGuide prints what to try; self is how this binary was invoked (e.g.
// bin/tether under make run), so the tether lines can be pasted as they are.
func printGuide(out io.Writer, tunnel string, ls server.Listeners, healthURL, clientConfig, self string) {
	entry := "http://" + ls.HTTP.Addr().String()
	admin := "http://" + ls.Admin.Addr().String()
	host := tunnel + "." + demoDomain
	_, port, _ := net.SplitHostPort(ls.HTTP.Addr().String())
	fmt.Fprintf(out, `tether demo is running; Ctrl-C stops it.

  public HTTP entry  %[1]s   (tunnel %[2]q is served at host %[3]s)
  tunnel listener    %[4]s   (TLS, self-signed)
  server admin       %[5]s   (/api/tunnels, /metrics, /readyz)
  client health      %[6]s   (/readyz, /status, /metrics)

Through the tunnel, to the stand-ins:
  curl -H 'Host: %[3]s' %[1]s/                                         # app-proxy
  curl -H 'Host: %[3]s' %[1]s/argo-cd/api/version                      # Argo CD
  curl -N -H 'Host: %[3]s' %[1]s/workflows/api/v1/workflow-events/argo # Argo Workflows, server-sent events
  curl -H 'Host: %[3]s' -H 'X-GitHub-Event: push' -d '{"ref":"refs/heads/main"}' %[1]s/webhooks/push   # Argo Events webhook
  curl -H 'Host: %[3]s' %[1]s/rollouts/                                # Argo Rollouts
  curl -i -N -H 'Host: %[3]s' -H 'Connection: Upgrade' -H 'Upgrade: websocket' -H 'Sec-WebSocket-Version: 13' -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' %[1]s/ws/echo   # websocket upgrade (101)
  open http://%[3]s:%[7]s/ in a browser (*.localhost resolves to this machine)

What tether knows:
`, entry, tunnel, host, ls.Tunnel.Addr(), admin, healthURL, port)
	printAligned(out, [][2]string{
		{"curl " + admin + "/api/tunnels", ""},
		{"curl " + healthURL + "/status", ""},
		{self + " status --admin " + admin, "the server's tunnels, as a table"},
		{self + " status --health-addr " + strings.TrimPrefix(healthURL, "http://"), "the client's connection"},
		{"curl -H 'Host: nobody." + demoDomain + "' " + entry + "/", "503: tunnel not connected"},
		{self + " diagnose --config " + clientConfig, "the client's path, step by step"},
	})
}

// printAligned prints indented commands with their comments in one column.
func printAligned(out io.Writer, lines [][2]string) {
	width := 0
	for _, l := range lines {
		width = max(width, len(l[0]))
	}
	for _, l := range lines {
		if l[1] == "" {
			fmt.Fprintf(out, "  %s\n", l[0])
			continue
		}
		fmt.Fprintf(out, "  %-*s   # %s\n", width, l[0], l[1])
	}
}
