package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/server/gate"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// serveEntry is the public HTTP entry: a request for <tunnel>.<domain> goes
// to that tunnel's sessions and nowhere else, here or on the replica that
// holds them.
func (s *replica) serveEntry(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if refused := s.refuseTarget(w, r); refused {
		return
	}
	name, ok := tunnelName(r.Host, s.srv.cfg.Domain)
	if !ok {
		s.metrics.unrouted.WithLabelValues("unknown_host").Inc()
		proxy.WriteError(w, http.StatusNotFound, "unknown_host",
			fmt.Sprintf("tether: no tunnel is served at host %q; tunnels are served at <name>.%s", r.Host, s.srv.cfg.Domain))
		return
	}
	s.srv.setForwarded(r)
	body, w := s.watchBody(w, r)
	rec := proxy.NewStatusWriter(w)
	s.route(rec, s.srv.webhooks.markOfferable(r, name), name, origin{})
	status := rec.Status()
	if body.stalled() {
		s.answerStalled(body, r)
		status = http.StatusRequestTimeout
	}
	s.metrics.requestDuration.WithLabelValues(classLabel(status)).Observe(time.Since(start).Seconds())
}

// tunnelWait bounds how long a request for a tunnel that no replica serves
// waits for one to: a client reconnecting (after a network blip, a server
// restart, a drain) is back well within it.
const tunnelWait = 3 * time.Second

// route serves a request for tunnel name: through a session here (trying
// the tunnel's other sessions when one fails before the request reached
// it), or, for a request from the public entry, through a replica that
// holds a session of the tunnel. When none does, or none of those that do
// can take it (the registry still lists a replica that died until its
// entries expire, or one whose client a drain just moved away), it waits up
// to tunnelWait for a session here or another holder, then answers 503
// tunnel_down (502 replica_unreachable when a holder could not be
// connected to). A request a
// replica forwarded (from.peer) is served here or refused at once: the
// replica that forwarded it tries the next holder. A request beyond the
// tunnel's slots here (requestslots.go), whichever way it goes, is answered
// at once: 503 tunnel_busy, or 429 caller_busy beyond its caller's share.
func (s *replica) route(w *proxy.StatusWriter, r *http.Request, name string, from origin) {
	slot, ok := s.takeSlot(w, r, name)
	if !ok {
		return
	}
	defer s.inflight.release(slot)
	body := guardBody(r)
	var tried []*member
	var passed []string // holders a forward passed over: unreachable, or no longer serving
	unreached := false  // one of them could not be connected to
	waited := false
	for {
		holders := without(s.srv.registry.Holders(name), passed)
		// A session a drain retired still serves when nothing else can.
		if m := s.members.pick(name, from.peer || len(holders) == 0, tried); m != nil {
			if s.serveBy(m, w, r, body) {
				return
			}
			tried = append(tried, m)
			continue
		}
		if !from.peer && len(holders) > 0 {
			done, unreachedNow := s.forward(w, r, holders, body)
			if done {
				return
			}
			unreached = unreached || unreachedNow
			for _, h := range holders {
				passed = append(passed, h.Replica)
			}
			continue
		}
		if from.peer || waited {
			if unreached && len(tried) == 0 {
				writeReplicaUnreachable(w)
				return
			}
			s.answerUnserved(w, r, name, tried, from)
			return
		}
		// A client may be reconnecting: wait for a session, here or on
		// another replica.
		waited = true
		ctx, cancel := context.WithTimeout(r.Context(), tunnelWait)
		s.waitServed(ctx, name, passed)
		cancel()
		if r.Context().Err() != nil {
			return // the caller went away
		}
	}
}

// holderPoll is how often a request whose holders were all passed over
// looks for another: the registry wakes waiters on a tunnel's first holder
// only, and the passed ones still count as holders.
const holderPoll = 50 * time.Millisecond

// waitServed waits until ctx ends or tunnel name is served here or by a
// replica not in passed.
func (s *replica) waitServed(ctx context.Context, name string, passed []string) {
	if len(passed) == 0 {
		_ = s.srv.registry.Wait(ctx, name)
		return
	}
	t := time.NewTicker(holderPoll)
	defer t.Stop()
	for !s.members.serves(name) && len(without(s.srv.registry.Holders(name), passed)) == 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// without returns holders but the replicas in passed.
func without(holders []registry.Holder, passed []string) []registry.Holder {
	if len(passed) == 0 {
		return holders
	}
	var list []registry.Holder
	for _, h := range holders {
		if !slices.Contains(passed, h.Replica) {
			list = append(list, h)
		}
	}
	return list
}

// answerUnserved answers a request no session could take, none of which
// received any of it: 502 when a session it tried is still connected (it
// failed under the request), 503 when none serves the tunnel any more. A
// request that came as a client died, to a session that died with it, is
// answered as one that came just after: the tunnel is down.
func (s *replica) answerUnserved(w http.ResponseWriter, r *http.Request, name string, tried []*member, from origin) {
	if !from.peer && s.srv.webhooks.offer(w, r, name) {
		return // stored for delivery once the tunnel is back (webhooks.go)
	}
	if slices.ContainsFunc(tried, func(m *member) bool { return m.sess.Alive() }) {
		s.metrics.unrouted.WithLabelValues("tunnel_disconnected").Inc()
		tried[0].sess.Logger().Warn("request not delivered: every session of the tunnel failed under it",
			zap.Int("sessions_tried", len(tried)), zap.String("method", r.Method), zap.String("path", r.URL.Path))
		status, code, msg := (&gate.ClosedError{Tunnel: name}).Response()
		proxy.WriteError(w, status, code, msg)
		return
	}
	if from.peer {
		// The replica that forwarded the request tries another holder.
		from.markMiss(w)
	}
	s.metrics.unrouted.WithLabelValues("tunnel_down").Inc()
	proxy.WriteError(w, http.StatusServiceUnavailable, "tunnel_down",
		fmt.Sprintf("tether: tunnel %q is not connected; check the tether client in that cluster", name))
}

// serveBy serves the request through sess and reports whether it is done:
// false when the session failed before any of the request reached it, so
// that another session may take it.
func (s *replica) serveBy(m *member, w *proxy.StatusWriter, r *http.Request, body *guardedBody) bool {
	h, ok := s.members.handler(m)
	if !ok {
		return false
	}
	if delivered := h.Deliver(w, r); !delivered && r.Context().Err() == nil {
		// Nothing of it reached the client: another session may take it,
		// unless part of its body was read.
		return body.started() && s.answerUndelivered(m, w)
	}
	m.countRequest(w.Status())
	return true
}

// answerUndelivered answers a request whose session failed after part of
// its body was read: it cannot go elsewhere.
func (s *replica) answerUndelivered(m *member, w http.ResponseWriter) bool {
	m.countRequest(0)
	s.metrics.unrouted.WithLabelValues("tunnel_disconnected").Inc()
	status, code, msg := (&gate.ClosedError{Tunnel: m.sess.Tunnel()}).Response()
	proxy.WriteError(w, status, code, msg)
	return true
}

// guardedBody is a request body that records whether any of it was read,
// and that a failed attempt cannot close: http.Transport (forwarding to
// another replica, or to frp's vhost) closes the body of a request it could
// not send, and the request may then go elsewhere.
type guardedBody struct {
	io.ReadCloser
	read atomic.Bool
}

// guardBody puts a guardedBody in place of r's body; a request without a
// body gets none (nil), which reports nothing started.
func guardBody(r *http.Request) *guardedBody {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	g := &guardedBody{ReadCloser: r.Body}
	r.Body = g
	return g
}

func (b *guardedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.read.Store(true)
	}
	return n, err
}

// Close does nothing: the HTTP server closes the request body itself.
func (b *guardedBody) Close() error { return nil }

// started reports whether any of the body was read; a nil body never is.
func (b *guardedBody) started() bool { return b != nil && b.read.Load() }

// refuseTarget answers, before any routing, the request targets a tunnel
// never serves, and reports whether it did.
//
// CONNECT gets 405 whatever the tunnel. The entry is no forward proxy, and
// frp's vhost, which serves stock frpc tunnels, answers CONNECT by joining
// the connection raw to the tenant's service: whatever that service wrote
// back could leave the connection looking reusable, with the tenant on the
// other end.
//
// An absolute-form target ("GET http://b.<domain>/ HTTP/1.1") gets 400. Go's
// server takes the host from the URL and drops the Host header before the
// handler runs, so a request naming one tunnel in its Host header could
// reach another, and the two cannot be compared here. Clients send such
// targets only to forward proxies; an ingress sends origin-form.
//
// Refusals are counted, and logged at most once per 10s each, so that a
// flood of them cannot flood the log.
func (s *replica) refuseTarget(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case r.Method == http.MethodConnect:
		s.metrics.unrouted.WithLabelValues("connect").Inc()
		s.srv.refusalLog.Warn("connect request refused", zap.String("remote_addr", r.RemoteAddr), zap.String("host", r.Host))
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		// The caller wanted a raw tunnel: what it sends next is no request.
		w.Header().Set("Connection", "close")
		proxy.WriteError(w, http.StatusMethodNotAllowed, proxy.CodeMethodNotAllowed,
			"tether: CONNECT is not supported; tunnels serve HTTP requests at <tunnel>."+s.srv.cfg.Domain)
		return true
	case r.URL.Host != "" || r.URL.Scheme != "":
		s.metrics.unrouted.WithLabelValues("absolute_form").Inc()
		s.srv.refusalLog.Warn("absolute-form request refused", zap.String("remote_addr", r.RemoteAddr), zap.String("host", r.Host))
		proxy.WriteError(w, http.StatusBadRequest, proxy.CodeBadRequest,
			fmt.Sprintf("tether: bad request: absolute-form target %q; send origin-form (%s /path) with a Host header of <tunnel>.%s",
				r.RequestURI, r.Method, s.srv.cfg.Domain))
		return true
	}
	return false
}

// tunnelName extracts N from a Host of N.<domain>, with or without a port.
func tunnelName(host, domain string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	name, ok := strings.CutSuffix(host, "."+domain)
	if !ok || auth.ValidTunnelName(name) != nil {
		return "", false
	}
	return name, true
}

var forwardedHeaders = []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// setForwarded sets X-Forwarded-For/-Host/-Proto on a public request before
// it is routed. A trusted proxy's (--trusted-proxies) forwarding headers are
// kept and extended. From anyone else, every header that tells an upstream
// about the caller (X-Forwarded-*, Forwarded, X-Real-Ip) is dropped first,
// so that what the upstreams read comes from tether: a caller's
// X-Forwarded-Prefix would otherwise reach them, and the router would build
// its own X-Forwarded-Prefix on it.
func (s *Server) setForwarded(r *http.Request) {
	clientIP, _, _ := net.SplitHostPort(r.RemoteAddr)
	forwardedFor, proto, host := clientIP, "http", r.Host
	if r.TLS != nil {
		proto = "https"
	}
	h := r.Header
	if s.trusts(clientIP) {
		if prior := h.Values("X-Forwarded-For"); len(prior) > 0 {
			forwardedFor = strings.Join(prior, ", ") + ", " + clientIP
		}
		if p := h.Get("X-Forwarded-Proto"); p == "http" || p == "https" {
			proto = p
		}
		if fh := h.Get("X-Forwarded-Host"); fh != "" {
			host = fh
		}
	} else {
		for k := range h {
			if isForwardingHeader(k) {
				delete(h, k)
			}
		}
	}
	// One backing array for the three values: this runs for every request.
	v := []string{forwardedFor, host, proto}
	h["X-Forwarded-For"], h["X-Forwarded-Host"], h["X-Forwarded-Proto"] = v[0:1:1], v[1:2:2], v[2:3:3]
}

// isForwardingHeader reports whether the header named k is X-Forwarded-*,
// Forwarded or X-Real-Ip, in any case and with '_' for '-': servers that
// map headers to CGI-style variables (HTTP_X_FORWARDED_PREFIX) read
// "X-Forwarded_Prefix" as the same header.
func isForwardingHeader(k string) bool {
	const xf = "x-forwarded-"
	return headerIs(k, "forwarded") || headerIs(k, "x-real-ip") ||
		len(k) > len(xf) && headerIs(k[:len(xf)], xf)
}

// headerIs reports whether k equals name (lower case) ignoring case, with
// '_' matching '-'. It does not allocate: it runs for every header of every
// untrusted request.
func headerIs(k, name string) bool {
	if len(k) != len(name) {
		return false
	}
	for i := range len(k) {
		c := k[i]
		switch {
		case c == '_':
			c = '-'
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

func (s *Server) trusts(ip string) bool {
	if len(s.cfg.TrustedProxies) == 0 {
		return false
	}
	addr, err := netip.ParseAddr(ip)
	return err == nil && s.trustsAddr(addr.Unmap())
}

// trustsAddr reports whether addr is in --trusted-proxies.
func (s *Server) trustsAddr(addr netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// classLabel is the bounded status label of metrics: "2xx".."5xx", or
// "error" when no response was written.
func classLabel(status int) string {
	if c := statusClass(status); c > 0 {
		return strconv.Itoa(c) + "xx"
	}
	return "error"
}

// bufferPool lends 32 KiB copy buffers to the reverse proxies, so streaming a
// body allocates nothing per request.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
