package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/internal/version"
)

// VersionOptions are the flags of `tether version`.
type VersionOptions struct {
	Output string
}

// NewCmdVersion builds `tether version`.
func NewCmdVersion(f *Factory) *cobra.Command {
	opts := &VersionOptions{}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the tether version and the frp engine version",
		Long: `Print the tether release, the frp engine and the Go toolchain this binary was built with.

With -o json, one object with the stable keys version, frp_version, go_version
and platform, and, when the binary was built from a git checkout, revision,
modified and build_time.`,
		Example: `  tether version
  tether version -o json | jq -r .version`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			switch opts.Output {
			case "text":
				fmt.Fprintln(f.Out, version.String())
				return nil
			case "json":
				enc := json.NewEncoder(f.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(version.Get())
			}
			return invalid(fmt.Errorf("--output %q: want text or json", opts.Output))
		},
	}
	cmd.Flags().StringVarP(&opts.Output, "output", "o", "text", "text, or json (one object)")
	return cmd
}
