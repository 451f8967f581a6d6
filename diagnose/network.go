package diagnose

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"github.com/tether-dev/tether/tunnel/client"
)

// checkProxy says which egress proxy applies to the server and why, and
// whether the proxy answers.
func (r *run) checkProxy(ctx context.Context) Check {
	if r.prober == nil {
		return unusable()
	}
	u, why, err := r.prober.EgressProxy()
	if err != nil {
		return fail(err.Error(), "fix the proxy URL: http://host:port, https://, socks5:// or socks5h://, with user:password@ when the proxy needs a login")
	}
	r.proxy = u
	if u == nil {
		return pass("direct connection: " + why)
	}
	addr := client.ProxyAddr(u)
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	start := time.Now()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fail(fmt.Sprintf("egress proxy %s (from %s) does not answer at %s: %v", client.RedactProxy(u.String()), why, addr, err),
			fmt.Sprintf("check the proxy address in %s; if the server is reachable without it, exempt %s with NO_PROXY or pass --proxy direct", why, r.host))
	}
	_ = conn.Close()
	return pass(fmt.Sprintf("egress proxy %s (from %s) accepts connections at %s (%s); it resolves and connects to %s",
		client.RedactProxy(u.String()), why, addr, ms(time.Since(start)), r.cfg.Server))
}

// checkDNS resolves the server's name, as the client would (the proxy
// resolves it when one is in the way).
func (r *run) checkDNS(ctx context.Context) Check {
	if r.prober == nil {
		return unusable()
	}
	if ip, err := netip.ParseAddr(r.host); err == nil {
		r.addrs = []string{net.JoinHostPort(ip.String(), r.port)}
		return pass(r.host + " is an IP address: nothing to look up")
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	start := time.Now()
	ips, err := r.o.Resolver.LookupIPAddr(ctx, r.host)
	took := time.Since(start)
	if r.proxy != nil {
		local := "locally it resolves too"
		if err != nil {
			local = "locally it does not resolve (" + err.Error() + "), which does not matter through the proxy"
		}
		return Check{Status: Skip, Detail: fmt.Sprintf("the egress proxy resolves %s; %s", r.host, local)}
	}
	if err != nil {
		return fail(fmt.Sprintf("lookup %s failed after %s: %v", r.host, ms(took), err), dnsHint(r.host, err))
	}
	for _, ip := range ips {
		r.addrs = append(r.addrs, net.JoinHostPort(ip.IP.String(), r.port))
	}
	detail := fmt.Sprintf("%s → %s (%s)", r.host, joinIPs(ips), ms(took))
	if took > time.Second {
		return warn(detail, "the lookup is slow: with the pod default ndots:5 every external name first tries each cluster search domain; set dnsConfig options ndots: 2 on the pod, or check the cluster DNS's upstream")
	}
	return pass(detail)
}

func joinIPs(ips []net.IPAddr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}

func dnsHint(host string, err error) string {
	var de *net.DNSError
	switch {
	case errors.As(err, &de) && de.IsNotFound:
		return fmt.Sprintf("%s does not exist in DNS: check --server for a typo; from inside a cluster the name must be public (or known to the cluster DNS)", host)
	case errors.As(err, &de) && de.IsTimeout, errors.Is(err, context.DeadlineExceeded):
		return "no DNS answer: in a pod, check that cluster DNS runs (kubectl -n kube-system get pods -l k8s-app=kube-dns) and that no NetworkPolicy blocks egress to it on UDP and TCP port 53"
	}
	return "the resolver failed: in a pod, check /etc/resolv.conf and the cluster DNS (kubectl -n kube-system get pods -l k8s-app=kube-dns)"
}

// checkTCP connects to each of the server's addresses (or through the
// proxy) and keeps the first connection for the TLS check.
func (r *run) checkTCP(ctx context.Context) Check {
	if r.prober == nil {
		return unusable()
	}
	targets := r.addrs
	if r.proxy != nil {
		targets = []string{r.cfg.Server}
	}
	if len(targets) == 0 {
		return Check{Status: Skip, Detail: "skipped: no address to connect to (see dns)"}
	}
	var lines []string
	var failures []error
	for _, target := range targets {
		sctx, cancel := r.bounded(ctx)
		start := time.Now()
		conn, err := r.prober.DialTCP(sctx, target)
		cancel()
		took := time.Since(start)
		if err != nil {
			failures = append(failures, err)
			lines = append(lines, fmt.Sprintf("%s: %v (%s)", target, err, ms(took)))
			continue
		}
		if r.conn == nil {
			r.conn = conn
		} else {
			_ = conn.Close()
		}
		how := "connected"
		if r.proxy != nil {
			how = "the proxy connected to it"
		}
		lines = append(lines, fmt.Sprintf("%s: %s (%s)", target, how, ms(took)))
	}
	detail := strings.Join(lines, "\n")
	switch {
	case r.conn == nil:
		return fail(detail, r.tcpHint(failures[0]))
	case len(failures) > 0:
		return warn(detail, "some of the server's addresses do not answer: clients that pick them wait for a timeout first; "+r.tcpHint(failures[0]))
	}
	r.reachable = true
	return pass(detail)
}

func (r *run) tcpHint(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "refused the user and password"):
		return "the egress proxy rejects the user and password in HTTPS_PROXY/--proxy: check them, with @, : and / in them percent-encoded"
	case strings.Contains(msg, "refused CONNECT"):
		return fmt.Sprintf("the egress proxy does not allow %s: ask its administrators to allow CONNECT to port %s, or exempt the server with NO_PROXY if it is reachable directly", r.cfg.Server, r.port)
	case strings.Contains(msg, "egress proxy") && !strings.Contains(msg, "CONNECT"):
		return "the egress proxy cannot be reached or fails (see proxy): fix HTTPS_PROXY/--proxy, or exempt the server with NO_PROXY if it is reachable directly"
	case strings.Contains(msg, "requires authentication"):
		return "put user:password@ in the proxy URL (HTTPS_PROXY or --proxy)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("nothing listens on port %s there: check the port in --server, and that the tunnel server and its load balancer Service are up", r.port)
	case isTimeout(err):
		return fmt.Sprintf("no answer: a firewall or an egress NetworkPolicy drops traffic to port %s; allow it, or if only HTTPS may leave, serve the tunnel on 443 and use --transport wss", r.port)
	}
	return "check the route from this network to the server: firewall, egress NetworkPolicy, proxy"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
