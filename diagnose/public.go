package diagnose

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"github.com/tether-dev/tether/tunnel/client"
)

// checkEndToEnd sends requests to the tunnel's public URL: through the
// server's HTTP entry, the tunnel and the client to the upstream, and back.
//
// The platform calls the public URL, not the client, and diagnose often runs
// where the platform's network is not (a laptop, a sandbox, the customer's
// cluster): so the check fails only when a request reaches the public entry
// and the answer says the tunnel is broken (X-Tether-Error) or is not HTTP
// at all. Not reaching the public URL from here is a warning, and with no
// client serving the tunnel there is nothing to test yet.
func (r *run) checkEndToEnd(ctx context.Context) Check {
	target := r.o.URL
	if target == "" && r.probe != nil {
		target = r.probe.PublicURL
	}
	if r.probe != nil && !r.probe.Connected {
		return Check{Status: Skip,
			Detail: "skipped: no client serves this tunnel yet (see login), so nothing answers at its public URL",
			Hint:   "run tether diagnose again once `tether client` serves the tunnel (its /readyz answers 200) to test the public path"}
	}
	if target == "" {
		return Check{Status: Skip, Detail: "skipped: pass --url https://<tunnel>.<domain>/ to test the public path (the login probe tells it when the server knows it)"}
	}
	hc := &http.Client{
		Transport: &http.Transport{Proxy: r.o.EndToEndProxy, DialContext: dialLocalhost},
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
			return r.unanswered(req, err)
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
		return warn(detail, "the answer carries no "+proxy.ErrorHeader+", so tether did not fail: the app behind the route (or a load balancer in front of the server) answers with an error; check the app")
	}
	return pass(detail)
}

// unanswered judges a request that got no HTTP answer. Only an answer that
// is not HTTP fails: something answers at the public URL, wrongly. The rest
// (DNS, connecting, the egress proxy, no answer in time, a certificate that
// does not verify from here) may well be where diagnose runs.
func (r *run) unanswered(req *http.Request, err error) Check {
	via := ""
	if p, perr := r.o.EndToEndProxy(req); perr == nil && p != nil {
		via = " through the egress proxy " + client.RedactProxy(p.String())
	}
	detail := fmt.Sprintf("GET %s%s: %v", req.URL, via, unwrapURLError(err))
	var record tls.RecordHeaderError
	if errors.Is(err, http.ErrSchemeMismatch) || errors.As(err, &record) {
		return fail(detail, "what answers at the public URL does not speak its scheme: check that the server's --public-url says http:// or https:// as its HTTP entry serves, and that the name points at that entry")
	}
	return warn(detail, publicHint(req.URL, via != "", err))
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

// fromHere opens every hint about a public URL that diagnose cannot reach.
const fromHere = "the public URL cannot be reached from where diagnose runs, which says nothing about the tunnel: the platform calls it, from its own network. "

func publicHint(u *url.URL, proxied bool, err error) string {
	var de *net.DNSError
	var op *net.OpError
	var unknownCA x509.UnknownAuthorityError
	var badName x509.HostnameError
	switch {
	case proxied && errors.As(err, &op) && op.Op == "proxyconnect":
		return fromHere + "Here the egress proxy (HTTPS_PROXY/HTTP_PROXY) failed: fix it, or exempt " + u.Hostname() + " with NO_PROXY"
	case errors.As(err, &de) && de.IsNotFound:
		return fromHere + fmt.Sprintf("Here %s does not resolve: run diagnose where the platform's DNS is, or pass --url with an address that resolves; if the platform cannot resolve it either, its DNS needs a wildcard record for *.<domain> pointing at the server's HTTP entry", u.Hostname())
	case errors.Is(err, syscall.ECONNREFUSED):
		return fromHere + "Here nothing listens at it; if the platform gets the same, check the server's HTTP entry (--http-addr) and the load balancer or ingress in front of it"
	case isTimeout(err):
		return fromHere + "Here no HTTP answer came within --timeout: a firewall or the egress path may drop it; if the platform gets the same, check the load balancer or ingress in front of the server's HTTP entry"
	case errors.As(err, &unknownCA), errors.As(err, &badName):
		return fromHere + "Here its certificate does not verify: a TLS-inspecting proxy on this network, or the platform's certificate for *.<domain> (check it from the platform)"
	case proxied:
		return fromHere + "Here it goes through the egress proxy (HTTPS_PROXY/HTTP_PROXY), which may refuse it: exempt " + u.Hostname() + " with NO_PROXY, or check the proxy"
	}
	return fromHere + "If the platform cannot reach it either, check its path to the server's HTTP entry (DNS, ingress, load balancer)"
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
