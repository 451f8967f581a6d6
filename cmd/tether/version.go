package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/internal/version"
)

// NewCmdVersion builds `tether version`.
func NewCmdVersion(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the tether version and the frp engine version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(f.Out, version.String())
			return nil
		},
	}
}
