package diagnose

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tether-dev/tether/proxy"
)

// upstreamSteps checks every route's upstream, as the client reaches it:
// directly, never through the egress proxy.
func (r *run) upstreamSteps() []step {
	routes := r.o.Client.Routes
	if len(routes) == 0 {
		routes = proxy.DefaultRoutes()
	}
	steps := make([]step, len(routes))
	for i, rt := range routes {
		steps[i] = step{"upstream " + rt.Prefix, func(ctx context.Context) Check { return r.checkUpstream(ctx, rt) }}
	}
	return steps
}

// checkUpstream asks a route's upstream for its health path (or its root):
// the check that catches NetworkPolicies and wrong service names.
func (r *run) checkUpstream(ctx context.Context, rt proxy.Route) Check {
	target := rt.Upstream.String()
	if u := rt.HealthURL(); u != nil {
		target = u.String()
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	hc := &http.Client{
		Transport: &http.Transport{
			Proxy:           nil,                                                    // the client dials its upstreams directly
			TLSClientConfig: &tls.Config{InsecureSkipVerify: rt.InsecureSkipVerify}, //nolint:gosec // as the route says
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fail(fmt.Sprintf("route %s: %v", rt, err), "fix the route's URL")
	}
	start := time.Now()
	resp, err := hc.Do(req)
	took := time.Since(start)
	if err != nil {
		return fail(fmt.Sprintf("GET %s: %v (%s)", target, unwrapURLError(err), ms(took)), upstreamHint(rt, err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	detail := fmt.Sprintf("GET %s → %s (%s)", target, resp.Status, ms(took))
	switch {
	case resp.StatusCode >= 500:
		return fail(detail, "the service answers but is failing: check its pods and logs")
	case resp.StatusCode >= 400 && rt.HealthPath != "":
		return warn(detail, fmt.Sprintf("the service answers, but not as %s does on %s: check that the route points at the right service and port", rt.Adapter, rt.HealthPath))
	}
	return pass(detail)
}

func unwrapURLError(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}

func upstreamHint(rt proxy.Route, err error) string {
	host := rt.Upstream.Hostname()
	var de *net.DNSError
	switch {
	case errors.As(err, &de) && de.IsNotFound:
		return fmt.Sprintf("%s does not resolve: check the service name (and namespace: <service>.<namespace>) in --route %s; cluster names resolve only inside the cluster, so run diagnose in the client's pod", host, rt.Prefix)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("nothing listens on %s: check that the service has ready endpoints (kubectl get endpoints <service>) and that the port in --route %s is the service's port", rt.Upstream.Host, rt.Prefix)
	case isTimeout(err):
		return fmt.Sprintf("no answer from %s within the timeout: a NetworkPolicy may drop traffic from the client's pod to it; allow it, and check the service's pods are ready", host)
	case strings.Contains(err.Error(), "certificate"):
		return fmt.Sprintf("the upstream's certificate does not verify: add ;insecure-skip-verify to --route %s for an in-cluster self-signed service", rt.Prefix)
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Sprintf("the upstream speaks plain HTTP: use http:// in --route %s", rt.Prefix)
	}
	return fmt.Sprintf("check the upstream of --route %s", rt.Prefix)
}

// checkEndToEnd sends requests to the tunnel's public URL: through the
// server's HTTP entry, the tunnel and the client to the upstream, and back.
func (r *run) checkEndToEnd(ctx context.Context) Check {
	target := r.o.URL
	if target == "" && r.probe != nil {
		target = r.probe.PublicURL
	}
	if target == "" {
		return Check{Status: Skip, Detail: "skipped: pass --url https://<tunnel>.<domain>/ to test the public path (the login probe tells it when the server knows it)"}
	}
	hc := &http.Client{
		Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, DialContext: dialLocalhost},
		// A redirect (say, to a login page) is an answer: the tunnel works.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer hc.CloseIdleConnections()
	var took []time.Duration
	var last *http.Response
	for range r.o.Requests {
		sctx, cancel := r.bounded(ctx)
		req, err := http.NewRequestWithContext(sctx, http.MethodGet, target, nil)
		if err != nil {
			cancel()
			return fail(fmt.Sprintf("--url %q: %v", target, err), "pass the tunnel's public URL, e.g. https://<tunnel>.<domain>/")
		}
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			cancel()
			return fail(fmt.Sprintf("GET %s: %v", target, unwrapURLError(err)), publicHint(target, err))
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		cancel()
		took = append(took, time.Since(start))
		last = resp
		if reason := resp.Header.Get(proxy.ErrorHeader); reason != "" {
			return fail(fmt.Sprintf("GET %s → %s, %s: %s", target, resp.Status, proxy.ErrorHeader, reason), tunnelErrorHint(reason))
		}
	}
	slices.Sort(took)
	detail := fmt.Sprintf("%d requests to %s → %s; p50 %s, p95 %s", len(took), target, last.Status,
		ms(took[len(took)/2]), ms(took[(len(took)*95-1)/100]))
	if last.StatusCode >= 500 {
		return warn(detail, "the tunnel carries requests, but the service behind it answers with an error: check the app behind the route")
	}
	return pass(detail)
}

// dialLocalhost dials <name>.localhost on loopback, as browsers and curl do
// (RFC 6761), so that `tether demo`'s URLs work here too.
func dialLocalhost(ctx context.Context, network, addr string) (net.Conn, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(host, ".localhost") {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func publicHint(target string, err error) string {
	u, _ := url.Parse(target)
	var de *net.DNSError
	switch {
	case errors.As(err, &de) && de.IsNotFound:
		return fmt.Sprintf("%s does not resolve: the platform's DNS needs a wildcard record for *.<domain> pointing at the server's HTTP entry", u.Hostname())
	case errors.Is(err, syscall.ECONNREFUSED):
		return "nothing listens at the public URL: check the server's HTTP entry (--http-addr) and the ingress or load balancer in front of it"
	}
	return "check the platform's path to the server's HTTP entry (DNS, ingress, load balancer)"
}

// tunnelErrorHint explains the reasons the server and router put in
// X-Tether-Error.
func tunnelErrorHint(reason string) string {
	switch {
	case strings.HasPrefix(reason, "unknown_host"):
		return "the server serves no tunnel at that host: the URL's host must be <tunnel>.<domain>, with the server's --domain"
	case strings.HasPrefix(reason, "tunnel_down"), strings.HasPrefix(reason, "tunnel_disconnected"):
		return "no client serves this tunnel at the server: start `tether client`, or read its log and `tether status` where it runs"
	case strings.HasPrefix(reason, proxy.CodeNoRoute):
		return "no --route of the client matches this path: add one, or request a path under a configured prefix"
	}
	return "the tunnel works up to the client, which could not reach the upstream: see the upstream checks above"
}
