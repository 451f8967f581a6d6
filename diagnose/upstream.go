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
	"os"
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
		detail := fmt.Sprintf("GET %s: %v (%s)", target, unwrapURLError(err), ms(took))
		if de, ok := errors.AsType[*net.DNSError](err); ok && de.IsNotFound && !r.inCluster() {
			// Service names resolve only inside the cluster: from a laptop
			// this says nothing about the tunnel.
			return warn(detail, fmt.Sprintf("%s does not resolve here, and diagnose is not running in a Kubernetes pod (no KUBERNETES_SERVICE_HOST): cluster service names resolve only inside the cluster; run diagnose in the client's pod (kubectl exec <pod> -c tether-client -- tether diagnose) to check --route %s", rt.Upstream.Hostname(), rt.Prefix))
		}
		return fail(detail, upstreamHint(rt, err))
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

// inCluster reports whether diagnose runs in a Kubernetes pod, where the
// routes' service names must resolve.
func (r *run) inCluster() bool {
	getenv := r.o.Client.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	return getenv("KUBERNETES_SERVICE_HOST") != ""
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
