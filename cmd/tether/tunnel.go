package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/auth"
)

// NewCmdTunnel builds `tether tunnel`: what an operator does to a tunnel
// through a server's admin API. tether token revoke keeps a tunnel out;
// this only acts on its sessions.
func NewCmdTunnel(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tunnel",
		Short: "Act on a tunnel's sessions through a server's admin API",
	}
	groupCommands(cmd)
	cmd.AddCommand(NewCmdTunnelDisconnect(f, nil))
	return cmd
}

// DisconnectOptions are the flags and the argument of `tether tunnel
// disconnect`.
type DisconnectOptions struct {
	AdminOptions
	Tunnel string
}

// NewCmdTunnelDisconnect builds `tether tunnel disconnect`. runF replaces
// the call to the server (tests assert on the parsed options); nil makes it.
func NewCmdTunnelDisconnect(f *Factory, runF func(*DisconnectOptions) error) *cobra.Command {
	opts := &DisconnectOptions{}
	cmd := &cobra.Command{
		Use:   "disconnect NAME",
		Short: "Close a tunnel's sessions on every replica; its clients may log in again",
		Long: `Close every session of tunnel NAME, on every replica that holds one (POST
/api/tunnels/{name}/disconnect), and print how many were closed where. Its
clients reconnect and log in again at once, as after a network failure: to
keep a tunnel out, revoke it (tether token revoke --tunnel NAME).`,
		Example: `  tether tunnel disconnect --admin https://tether-admin.internal --admin-token-file admin-token acme-prod`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return invalid(fmt.Errorf("want one tunnel name, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Tunnel = args[0]
			if runF != nil {
				return runF(opts)
			}
			admin, p, err := opts.client(f)
			if nerr := auth.ValidTunnelName(opts.Tunnel); nerr != nil {
				err = errors.Join(fmt.Errorf("tunnel name: %w", nerr), err)
			}
			if err != nil {
				return invalid(err)
			}
			d, err := admin.Disconnect(cmd.Context(), opts.Tunnel)
			if err != nil {
				return err
			}
			return p.Disconnected(d)
		},
	}
	opts.addFlags(cmd.Flags())
	return cmd
}
