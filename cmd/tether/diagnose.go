package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tether-dev/tether/diagnose"
	"github.com/tether-dev/tether/internal/config"
	"github.com/tether-dev/tether/internal/version"
	"github.com/tether-dev/tether/tunnel/client"
)

// DiagnoseOptions are the flags of `tether diagnose`: the client's, and how
// to diagnose.
type DiagnoseOptions struct {
	Client   ClientOptions
	Output   string
	URL      string
	Timeout  time.Duration
	Requests int
	Bundle   string
}

// NewCmdDiagnose builds `tether diagnose`.
func NewCmdDiagnose(f *Factory) *cobra.Command {
	opts := &DiagnoseOptions{}
	cmd := &cobra.Command{
		Use:   "diagnose",
		Short: "Walk the tunnel client's path to the server step by step and say where it breaks",
		Long: `Check, in order, everything a tunnel client needs, and say where it breaks and
what to do about it:

  config      effective settings and where each came from (secrets redacted)
  proxy       which egress proxy applies (HTTPS_PROXY, ALL_PROXY, NO_PROXY) and whether it answers
  dns         the server name's addresses
  tcp         a connection to each address (or through the proxy)
  tls         version, cipher, certificate chain, names, expiry, verification
  clock       this clock against the server's (tokens are judged by the server's)
  token       the token file and its claims (the token is never printed)
  login       a login probe: the server's verdict on the token, in its words;
              it registers nothing, so a running client is not disturbed
  upstream    each route's upstream (health path where the adapter has one)
  end-to-end  requests through the public URL, the tunnel and back (--url, or
              the URL the server tells the login probe)

A check fails only for what stops or breaks this tunnel. What diagnose cannot
see from where it runs is a warning (the public URL from a laptop or a cluster
without the platform's DNS), and the public path is skipped while no client
serves the tunnel, so it also works as a pre-flight check.

It takes the same flags, config file and environment as 'tether client', so in
the client's container it needs no arguments (the charts name that container
tether-client). Exit status 0 when no check failed (warn and skip do not), 1
when one did.

--bundle FILE also writes a support bundle (.tar.gz, secrets removed); with
--bundle - the archive goes to stdout and the report to stderr, so that
'kubectl exec ... > bundle.tar.gz' needs no writable directory in the pod.`,
		Example: `  kubectl exec deploy/my-runtime -c tether-client -- tether diagnose
  kubectl exec deploy/my-runtime -c tether-client -- tether diagnose --bundle - > tether-support.tar.gz
  tether diagnose --server tunnels.example.com:443 --token-file token.jwt --url https://acme.tunnels.example.com/
  tether diagnose --output json | jq '.checks[] | select(.status != "pass")'
  tether diagnose --bundle /tmp/tether-support.tar.gz`,
		Args:        cobra.NoArgs,
		Annotations: map[string]string{reportsConfigErrors: "true"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDiagnose(cmd, f, opts)
		},
	}
	fl := cmd.Flags()
	opts.Client.addFlags(fl)
	fl.StringVarP(&opts.Output, "output", "o", "text", "text, or json (one object, nothing else on stdout)")
	fl.StringVar(&opts.URL, "url", "", "the tunnel's public URL for the end-to-end check, e.g. https://acme.tunnels.example.com/ (default: what the server says)")
	fl.DurationVar(&opts.Timeout, "timeout", 10*time.Second, "bound on each network step")
	fl.IntVar(&opts.Requests, "requests", 10, "requests the end-to-end check makes")
	fl.StringVar(&opts.Bundle, "bundle", "", "also write a redacted support bundle (.tar.gz) to this file; - writes it to stdout (the report then goes to stderr)")
	return cmd
}

func runDiagnose(cmd *cobra.Command, f *Factory, opts *DiagnoseOptions) error {
	if opts.Output != "text" && opts.Output != "json" {
		return invalid(fmt.Errorf("--output %q: want text or json", opts.Output))
	}
	if opts.Requests < 1 {
		return invalid(fmt.Errorf("--requests %d: want at least 1", opts.Requests))
	}
	cfg, err := opts.Client.config(f)
	_, limitErr := resolveMemoryLimit(f, opts.Client.MemoryLimit)
	problems := []error{f.configErr, err, limitErr}
	settings := diagnoseSettings(cmd.Flags(), f.sources)
	o := diagnose.Options{
		Client:   cfg,
		Problems: problems,
		Settings: settings,
		URL:      opts.URL,
		Timeout:  opts.Timeout,
		Requests: opts.Requests,
	}
	// With --bundle -, stdout carries the archive alone.
	out := f.Out
	if opts.Bundle == "-" {
		out = f.ErrOut
	}
	var text *diagnose.Text
	if opts.Output == "text" {
		fmt.Fprintf(out, "tether diagnose (%s): tunnel client → %s\n\n", version.String(), orNone(cfg.Server))
		text = diagnose.NewText(out)
		o.Progress = text
	}
	report := diagnose.Run(cmd.Context(), o)
	if text != nil {
		text.Close()
		diagnose.WriteSummary(out, report)
	} else if err := diagnose.WriteJSON(out, report); err != nil {
		return err
	}
	if opts.Bundle != "" {
		if err := writeBundle(cmd, f, opts, cfg, report, settings); err != nil {
			return err
		}
		if opts.Bundle != "-" {
			fmt.Fprintf(f.ErrOut, "support bundle written to %s\n", opts.Bundle)
		}
	}
	if !report.OK {
		return errors.New("diagnosis found failures: see the checks' hints")
	}
	return nil
}

// writeBundle writes the support bundle to the file --bundle names, or to
// stdout for "-".
func writeBundle(cmd *cobra.Command, f *Factory, opts *DiagnoseOptions, cfg client.Config, report diagnose.Report, settings []diagnose.Setting) error {
	var out io.WriteCloser = nopCloser{f.Out}
	if opts.Bundle != "-" {
		file, err := os.OpenFile(opts.Bundle, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return fmt.Errorf("--bundle: %w (in a container with a read-only root, write it to stdout: --bundle - > bundle.tar.gz)", err)
		}
		out = file
	}
	var secrets []string
	for _, path := range []string{opts.Client.TokenFile, opts.Client.RenewedTokenFile} {
		if b, err := os.ReadFile(path); err == nil && path != "" {
			secrets = append(secrets, strings.TrimSpace(string(b)))
		}
	}
	secrets = append(secrets, client.ProxySecrets(cfg)...)
	werr := diagnose.WriteBundle(cmd.Context(), out, report, diagnose.BundleOptions{
		Version:    version.String(),
		Settings:   settings,
		HealthAddr: opts.Client.HealthAddr,
		Secrets:    secrets,
	})
	if err := errors.Join(werr, out.Close()); err != nil {
		return fmt.Errorf("--bundle %s: %w", opts.Bundle, err)
	}
	return nil
}

// diagnoseSettings lists the client's effective settings with their
// sources, secrets and proxy passwords redacted.
func diagnoseSettings(fs *pflag.FlagSet, sources *config.Sources) []diagnose.Setting {
	var out []diagnose.Setting
	fs.VisitAll(func(fl *pflag.Flag) {
		switch fl.Name {
		case "help", "output", "url", "timeout", "requests", "bundle", "config", "log-level", "log-format":
			return
		}
		value := fl.Value.String()
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			value = strings.Join(sv.GetSlice(), " ")
		}
		switch {
		case config.IsSecret(fl.Name) && value != "":
			value = "[redacted]"
		case fl.Name == "proxy":
			value = client.RedactProxy(value)
		}
		if value == "" {
			value = `""`
		}
		source := "default"
		if sources != nil {
			source = sources.Of(fl)
		}
		out = append(out, diagnose.Setting{Key: fl.Name, Value: value, Source: source})
	})
	return out
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

func orNone(s string) string {
	if s == "" {
		return "(no --server)"
	}
	return s
}
