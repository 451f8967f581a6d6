package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/status"
)

// StatusOptions are the flags of `tether status`.
type StatusOptions struct {
	Admin          string
	AdminTokenFile string
	Fleet          bool
	HealthAddr     string
	Output         string
	Timeout        time.Duration
}

// NewCmdStatus builds `tether status`.
func NewCmdStatus(f *Factory) *cobra.Command {
	opts := &StatusOptions{}
	cmd := &cobra.Command{
		Use:   "status [TUNNEL|GLOB...]",
		Short: "Show a server's connected tunnels, its fleet, or a client's connection",
		Long: `Show what tether reports about its tunnels.

With --admin, ask a tether server's admin API (/api/tunnels, its --admin-addr)
and print its connected tunnels sorted by name, a row per session (a tunnel may
have several); names or shell-style globs (acme-*) keep only the matching ones,
and a name that matches no tunnel makes the command fail. --admin-token-file
is the file of the server's own --admin-token-file, when it has one.

With --admin and --fleet, print every replica's tunnels as that server's
registry sees them (/api/fleet): a line on the replica asked and its registry
(backend, up or down and since when, last error), then each tunnel with the
replicas that hold it. Names and globs filter as above.

Without --admin, ask the tether client at --health-addr (/status) and print its
state: server, transport, login, last error, reconnects, routes and sessions.
It is the client's own flag, so in a client container configured with
TETHER_HEALTH_ADDR=0.0.0.0:8081 (the charts name it tether-client),
"kubectl exec POD -c tether-client -- tether status" needs no flags (a
wildcard host is dialled on loopback).

-o wide adds TRANSPORT, ROUTE, TOKEN-EXPIRES, REQUESTS, SESSION (its first 8
characters) and REPLICA to the server's table, the holders' PEER-ADDRESSES to
the fleet's, and SESSION and LAST ERROR to the client's sessions; -o json prints
the endpoint's JSON and nothing else.`,
		Example: `  tether status --admin http://127.0.0.1:7700
  tether status --admin https://tether-admin.internal --admin-token-file admin-token -o wide 'acme-*'
  tether status --admin https://tether-admin.internal --admin-token-file admin-token --fleet
  tether status --health-addr 127.0.0.1:8081 -o json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := status.ParseFormat(opts.Output)
			if err != nil {
				return invalid(err)
			}
			p := status.Printer{Out: f.Out, Format: format, Now: time.Now}
			if opts.Fleet && opts.Admin == "" {
				return invalid(errors.New("--fleet reads a server's registry: pass --admin URL (a server's admin address) too"))
			}
			switch {
			case opts.Admin != "":
				filter, err := status.NewFilter(args)
				if err != nil {
					return invalid(err)
				}
				admin, err := status.NewAdmin(opts.Admin, opts.AdminTokenFile)
				if err != nil {
					return invalid(err)
				}
				admin.Timeout = opts.Timeout
				if opts.Fleet {
					fleet, err := admin.Fleet(cmd.Context())
					if err != nil {
						return err
					}
					return p.FilteredFleet(fleet, filter)
				}
				list, err := admin.Tunnels(cmd.Context())
				if err != nil {
					return err
				}
				return p.FilteredTunnels(list, filter)
			case opts.HealthAddr != "":
				if len(args) > 0 {
					return invalid(errors.New("tunnel names filter a server's list (--admin URL); the client at --health-addr serves one tunnel"))
				}
				health, err := status.NewHealth(opts.HealthAddr)
				if err != nil {
					return invalid(err)
				}
				health.Timeout = opts.Timeout
				snap, err := health.Snapshot(cmd.Context())
				if err != nil {
					return err
				}
				return p.Client(snap)
			}
			return invalid(errors.New("whose status? pass --admin URL (a server's admin address) or --health-addr HOST:PORT (a client's health address)"))
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.Admin, "admin", "", "server admin URL (the server's --admin-addr), e.g. http://127.0.0.1:7700")
	fl.StringVar(&opts.AdminTokenFile, "admin-token-file", "", "file holding the server's admin bearer token (the server's --admin-token-file)")
	fl.BoolVar(&opts.Fleet, "fleet", false, "with --admin: every replica's tunnels, as that server's registry sees them (/api/fleet)")
	fl.StringVar(&opts.HealthAddr, "health-addr", "", "client health HOST:PORT (the client's --health-addr), used when --admin is not given")
	fl.StringVarP(&opts.Output, "output", "o", "", "json or wide; default a table")
	fl.DurationVar(&opts.Timeout, "timeout", status.DefaultTimeout, "bound on the request")
	return cmd
}
