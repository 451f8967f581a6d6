package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/internal/config"
	"github.com/tether-dev/tether/internal/logging"
	"github.com/tether-dev/tether/internal/memlimit"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// Factory carries what commands take from the process: streams, the
// environment, and the logger built from the common flags.
type Factory struct {
	Out, ErrOut io.Writer
	// LookupEnv reads the environment (os.LookupEnv in production).
	LookupEnv func(string) (string, bool)

	logOpts logging.Options
	log     *zap.Logger
	// sources says where each flag's value came from.
	sources *config.Sources
	// configErr holds the configuration problems of a command that reports
	// them itself (see reportsConfigErrors) instead of exiting with them.
	configErr error
}

// Logger is the process logger, built after flags, environment and config
// file are applied.
func (f *Factory) Logger() *zap.Logger {
	if f.log == nil {
		return zap.NewNop()
	}
	return f.log
}

// Getenv reads one environment variable ("" when unset).
func (f *Factory) Getenv(name string) string {
	v, _ := f.LookupEnv(name)
	return v
}

// Close flushes the logger.
func (f *Factory) Close() {
	if f.log != nil {
		_ = f.log.Sync()
	}
}

// runners replace what the long-running commands do, so that tests can see
// the options they were given; nil runs the command.
type runners struct {
	server func(*ServerOptions) error
	client func(*ClientOptions) error
}

// newCmdRoot builds the tether command tree.
func newCmdRoot(f *Factory, run runners) *cobra.Command {
	root := &cobra.Command{
		Use:   "tether",
		Short: "Reverse tunnels from customer clusters to the platform, with no ingress on the customer's side",
		Long: `tether lets a SaaS platform reach services inside its customers' Kubernetes clusters.
The client runs in the customer's cluster, dials out and keeps one encrypted,
multiplexed connection to the platform's tunnel server; the platform's requests
arrive at the server under <tunnel>.<domain> and are carried back to the client,
which forwards them to the configured in-cluster services.

Every flag can also be set in the YAML file named by --config (same key names)
or as an environment variable TETHER_<FLAG_IN_UPPER_SNAKE_CASE>; flags win over
the environment, the environment over the file.

` + exitCodesHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			path := config.Path(cmd.Flags(), "config", f.LookupEnv)
			f.sources = config.NewSources(cmd.Flags(), path, f.LookupEnv)
			if err := config.Apply(cmd.Flags(), path, f.LookupEnv, "config", "help"); err != nil {
				if cmd.Annotations[reportsConfigErrors] == "" {
					return &usageError{err: err}
				}
				f.configErr = err
			}
			log, err := logging.New(f.ErrOut, f.logOpts)
			if err != nil {
				return &usageError{err: err}
			}
			f.log = log
			tunnel.BridgeFRPLog(log)
			registry.BridgeRedisLog(log)
			return nil
		},
	}
	root.PersistentFlags().String("config", "", "YAML file of flag values (keys are flag names); env TETHER_CONFIG")
	f.logOpts.AddFlags(root.PersistentFlags())
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{err: err, hint: fmt.Sprintf("Run '%s --help' for usage.", cmd.CommandPath())}
	})
	groupCommands(root)
	root.AddCommand(
		NewCmdServer(f, run.server),
		NewCmdClient(f, run.client),
		NewCmdToken(f),
		NewCmdTunnel(f),
		NewCmdDiagnose(f),
		NewCmdStatus(f),
		NewCmdDemo(f, nil),
		NewCmdVersion(f),
	)
	return root
}

// groupCommands makes cmd, a command that only groups subcommands, answer an
// argument that names none of them with an invalid invocation (exit 2), and
// no argument with its help. Cobra's own answer is exit 1 at the root and
// the help with exit 0 below it.
func groupCommands(cmd *cobra.Command) {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		hint := fmt.Sprintf("Run '%s --help' for the commands.", cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			hint = fmt.Sprintf("Did you mean '%s %s'? %s", cmd.CommandPath(), s[0], hint)
		}
		return &usageError{err: fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath()), hint: hint}
	}
}

// reportsConfigErrors annotates a command that reports configuration
// problems itself (tether diagnose) rather than exiting with them.
const reportsConfigErrors = "reports-config-errors"

// invalid marks err as a configuration mistake (exit 2).
func invalid(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{err: err}
}

// memoryLimitHelp describes --memory-limit, a flag of the client and the
// server.
const memoryLimitHelp = "soft memory limit of the Go runtime, e.g. 64MiB or 1GiB, or none; the collector works harder near it. " +
	"Default: GOMEMLIMIT when set, else 90% of the container's memory limit (cgroup), else none"

// resolveMemoryLimit reads --memory-limit, or the default from the
// environment and the container's cgroup.
func resolveMemoryLimit(f *Factory, value string) (memlimit.Limit, error) {
	return memlimit.Resolve(value, f.Getenv, os.DirFS("/"))
}

// applyMemoryLimit sets the process's memory limit and logs it.
func applyMemoryLimit(f *Factory, limit memlimit.Limit) {
	memlimit.Apply(limit)
	f.Logger().Info("memory limit", zap.Stringer("limit", limit))
}
