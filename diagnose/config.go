package diagnose

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/tether-dev/tether/tunnel/client"
)

// checkConfig validates the configuration as the client would and shows the
// effective settings with their sources; a problem names its setting and
// where that came from.
func (r *run) checkConfig(context.Context) Check {
	problems := append([]error(nil), r.o.Problems...)
	prober, err := client.NewProber(r.o.Client)
	if err != nil {
		problems = append(problems, err)
	} else {
		r.prober = prober
		r.cfg = prober.Config()
		r.host, r.port, _ = net.SplitHostPort(r.cfg.Server)
	}
	problems = splitErrors(problems)
	lines := []string{"the settings are valid"}
	if len(problems) > 0 {
		lines = []string{fmt.Sprintf("%d problem(s):", len(problems))}
	}
	for _, p := range problems {
		lines = append(lines, "problem: "+r.withSource(p.Error()))
	}
	var defaults []string
	for _, s := range r.o.Settings {
		if s.Source == "default" {
			defaults = append(defaults, s.Key+"="+s.Value)
			continue
		}
		lines = append(lines, fmt.Sprintf("%s = %s (%s)", s.Key, s.Value, s.Source))
	}
	if len(defaults) > 0 {
		lines = append(lines, "defaults: "+strings.Join(defaults, " "))
	}
	detail := strings.Join(lines, "\n")
	switch {
	case len(problems) > 0:
		if r.prober != nil {
			// The connection steps can still run; what failed is named.
			return fail(detail, "fix the settings named above; flags win over TETHER_* environment variables, which win over the --config file")
		}
		return fail(detail, "fix the settings named above (flags win over TETHER_* environment variables, which win over the --config file); the connection checks need a valid --server and --token-file")
	case r.cfg.TLSInsecureSkipVerify:
		return warn(detail, "--tls-insecure-skip-verify trusts any server, including one in the middle: use --tls-ca, or --tls-fingerprint for a self-signed server")
	}
	return pass(detail)
}

// flagName finds the flags an error message names.
var flagName = regexp.MustCompile(`--([a-z0-9-]+)`)

// withSource appends where each flag a problem names was set.
func (r *run) withSource(msg string) string {
	var sources []string
	for _, m := range flagName.FindAllStringSubmatch(msg, -1) {
		for _, s := range r.o.Settings {
			if s.Key == m[1] {
				sources = append(sources, fmt.Sprintf("%s from %s", s.Key, s.Source))
			}
		}
	}
	if len(sources) == 0 {
		return msg
	}
	return msg + " [" + strings.Join(sources, "; ") + "]"
}

// splitErrors flattens errors.Join trees into their parts.
func splitErrors(errs []error) []error {
	var out []error
	for _, err := range errs {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			out = append(out, splitErrors(j.Unwrap())...)
			continue
		}
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// unusable is the skip of a connection step without a usable configuration.
func unusable() Check {
	return Check{Status: Skip, Detail: "skipped: the configuration has no usable --server (see config)"}
}
