// Package diagnose walks a tunnel client's path to the tunnel server step by
// step, and says where it breaks and what to do about it: configuration,
// egress proxy, DNS, TCP, TLS, clock, token, login, the routes' upstreams
// and the public path through the tunnel and back.
//
//	report := diagnose.Run(ctx, diagnose.Options{Client: cfg, Progress: diagnose.NewText(os.Stdout)})
//	if !report.OK { os.Exit(1) }
//
// Each check ends as pass, warn, fail or skip (a check that could not run
// because an earlier one failed, or that does not apply yet). Every warn and
// fail carries a hint a person can act on. A check fails only for what stops
// or breaks this client's tunnel; what diagnose cannot see from where it runs
// (the public URL from a laptop, say) is a warning, and a run before the
// client serves (a pre-flight check) skips the public path. Report.OK, and
// so the exit status of `tether diagnose`, is false only when a check
// failed. Nothing here changes the tunnel: the login step is a probe that
// the server answers without registering anything, so a running client
// keeps serving.
package diagnose

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/client"
)

// Status is the outcome of one check.
type Status string

// The outcomes of a check.
const (
	Pass Status = "pass"
	Warn Status = "warn"
	Fail Status = "fail"
	Skip Status = "skip"
)

// Check is one step's result.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	// Hint says what to do; set for every warn and fail, and for a skip
	// that a later run can lift.
	Hint string `json:"hint"`
}

// Report is the result of a run: OK unless a check failed.
type Report struct {
	OK     bool    `json:"ok"`
	Checks []Check `json:"checks"`
}

// Setting is one effective configuration value and where it came from.
type Setting struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

// Progress hears of each check as it starts and as it ends, in order.
type Progress interface {
	Started(name string)
	Finished(c Check)
}

// Options configure a run.
type Options struct {
	// Client is the configuration the tunnel client runs with.
	Client client.Config
	// Problems are configuration problems found while reading flags, the
	// environment and the config file (a route that does not parse, say).
	Problems []error
	// Settings are the effective settings, secrets already redacted, shown by
	// the configuration check. Their sources name where a problem comes from.
	Settings []Setting
	// URL is the tunnel's public URL for the end-to-end check; "" takes the
	// one the server tells the login probe.
	URL string
	// Timeout bounds each network step. Default 10s.
	Timeout time.Duration
	// Requests is how many requests the end-to-end check makes. Default 10.
	Requests int
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Resolver looks up the server's name (net.DefaultResolver when nil).
	Resolver *net.Resolver
	// EndToEndProxy picks the egress proxy of the end-to-end requests, as
	// http.Transport.Proxy does (http.ProxyFromEnvironment when nil).
	EndToEndProxy func(*http.Request) (*url.URL, error)
	// Progress, when set, hears of each check as it runs.
	Progress Progress
}

func (o *Options) setDefaults() {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Requests <= 0 {
		o.Requests = 10
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if o.EndToEndProxy == nil {
		o.EndToEndProxy = http.ProxyFromEnvironment
	}
}

// step is one check: its name and what it does.
type step struct {
	name string
	do   func(context.Context) Check
}

// steps lists the checks in the order a connection takes them.
func (r *run) steps() []step {
	steps := []step{
		{"config", r.checkConfig},
		{"proxy", r.checkProxy},
		{"dns", r.checkDNS},
		{"tcp", r.checkTCP},
		{"tls", r.checkTLS},
		{"clock", r.checkClock},
		{"token", r.checkToken},
		{"login", r.checkLogin},
	}
	steps = append(steps, r.upstreamSteps()...)
	return append(steps, step{"end-to-end", r.checkEndToEnd})
}

// run is the state one diagnosis carries from step to step.
type run struct {
	o      Options
	prober *client.Prober // nil when the configuration is not usable
	cfg    client.Config  // with defaults, when prober is set
	host   string         // the server's host
	port   string

	proxy     *url.URL           // the egress proxy, nil for direct
	addrs     []string           // the server's addresses (direct only)
	conn      net.Conn           // a TCP connection to the server, for TLS
	tlsConn   *tls.Conn          // the TLS connection, for the clock
	skew      *time.Duration     // server clock minus ours, once known
	token     string             // the token, once read
	probe     *tunnel.ProbeReply // the login probe's answer
	reachable bool               // TCP reached the server
	trusted   bool               // the server's certificate passed the client's trust settings
}

// Run performs every check, in order, and returns the report. It returns
// when all checks have ended; each network step is bounded by
// Options.Timeout, and ctx ends the run early (the remaining checks are
// reported as skipped).
func Run(ctx context.Context, o Options) Report {
	o.setDefaults()
	r := &run{o: o}
	defer r.closeConns()
	var report Report
	for _, s := range r.steps() {
		if o.Progress != nil {
			o.Progress.Started(s.name)
		}
		c := skipped(s.name, "the diagnosis was interrupted")
		if ctx.Err() == nil {
			c = s.do(ctx)
		}
		c.Name = s.name
		report.Checks = append(report.Checks, c)
		if o.Progress != nil {
			o.Progress.Finished(c)
		}
	}
	report.OK = true
	for _, c := range report.Checks {
		if c.Status == Fail {
			report.OK = false
		}
	}
	return report
}

func (r *run) closeConns() {
	if r.tlsConn != nil {
		_ = r.tlsConn.Close()
	} else if r.conn != nil {
		_ = r.conn.Close()
	}
}

// bounded bounds one network step by the timeout.
func (r *run) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.o.Timeout)
}

func pass(detail string) Check { return Check{Status: Pass, Detail: detail} }

func warn(detail, hint string) Check { return Check{Status: Warn, Detail: detail, Hint: hint} }

func fail(detail, hint string) Check { return Check{Status: Fail, Detail: detail, Hint: hint} }

func skipped(name, why string) Check { return Check{Name: name, Status: Skip, Detail: why} }

// ms renders a duration for people: 3ms, 1.2s.
func ms(d time.Duration) string {
	switch {
	case d < 10*time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(10 * time.Millisecond).String()
	}
}
