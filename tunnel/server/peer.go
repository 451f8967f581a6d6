package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// Replicas forward requests to each other over the peer listener
// (--peer-addr): a replica whose public entry receives a request for a
// tunnel it does not serve sends it, as it came, to a replica the registry
// says serves it. That replica serves it from its own sessions and never
// forwards it again.
//
// A forwarded request is signed with the shared secret (--peer-secret-file;
// see peerauth.go) in peerAuthHeader; the peer listener refuses anything
// without a valid signature before looking at the request, and the public
// entry removes the header from what callers send. The X-Forwarded-* headers the first replica set travel
// unchanged. Connections between replicas are kept alive and shared by the
// tunnels: both ends are tether's own HTTP servers, which frame every
// response themselves, so no tenant's bytes can leave one where another's
// request expects its answer.
const (
	// peerAuthHeader carries a forwarded request's signature.
	peerAuthHeader = "X-Tether-Peer-Auth"
	// peerMissHeader marks a peer's 503 for a tunnel it no longer serves:
	// the forwarding replica then tries another holder.
	peerMissHeader = "X-Tether-Peer-Miss"
	// peerDialTimeout bounds connecting to another replica: on a cluster
	// network a live replica answers in milliseconds.
	peerDialTimeout = 2 * time.Second
)

// servePeer serves a request another replica forwarded.
func (s *serving) servePeer(w http.ResponseWriter, r *http.Request) {
	if !verifyPeer(s.peerSecret, time.Now(), r.Header.Get(peerAuthHeader), r.Method, r.Host, r.RequestURI) {
		s.metrics.peerRefused.Inc()
		s.floodLog.Warn("peer request refused: missing or wrong signature (another --peer-secret-file, or clocks more than a minute apart)",
			zap.String("remote_addr", r.RemoteAddr), zap.String("host", r.Host))
		proxy.WriteError(w, http.StatusForbidden, "peer_forbidden",
			"tether: this is the tunnel server's peer port; replicas forward requests here with the shared --peer-secret-file")
		return
	}
	delete(r.Header, peerAuthHeader)
	if s.refuseTarget(w, r) {
		return
	}
	name, ok := tunnelName(r.Host, s.cfg.Domain)
	if !ok {
		w.Header().Set(peerMissHeader, "1")
		proxy.WriteError(w, http.StatusNotFound, "unknown_host",
			fmt.Sprintf("tether: no tunnel is served at host %q; tunnels are served at <name>.%s", r.Host, s.cfg.Domain))
		return
	}
	s.metrics.peerServed.Inc()
	s.route(proxy.NewStatusWriter(w), r, name, true)
}

// forward sends a request to one of the replicas that hold its tunnel, and
// the answer back to the caller. It reports done false, having written
// nothing, when every holder was passed over with nothing of the request's
// body sent: it could not be connected to, or it no longer serves the
// tunnel (a drain moved the client away, the registry lags). The caller may
// then wait for the tunnel's client to reconnect elsewhere. unreached
// reports whether a holder could not be connected to.
func (s *serving) forward(w http.ResponseWriter, r *http.Request, holders []registry.Holder, body *guardedBody) (done, unreached bool) {
	att := &peerAttempt{holders: holders, body: body}
	s.peers.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), holdersKey{}, att)))
	return !att.passed.Load(), att.unreached.Load()
}

type holdersKey struct{}

// peerAttempt is one forwarded request's holders, tried in turn.
type peerAttempt struct {
	holders []registry.Holder
	body    *guardedBody
	// passed is set when every holder was passed over and nothing of the
	// body was sent: no answer was written.
	passed atomic.Bool
	// unreached is set when a holder could not be connected to.
	unreached atomic.Bool
}

// errNoHolderReached: a forwarded request reached none of the tunnel's
// holders that still serve it, and nothing of its body was sent.
var errNoHolderReached = errors.New("no replica that serves the tunnel could be reached")

// newPeerProxy is the reverse proxy that forwards requests to other
// replicas.
func (s *serving) newPeerProxy() *httputil.ReverseProxy {
	transport := &http.Transport{
		DialContext: (&net.Dialer{Timeout: peerDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		// No response-header timeout: the replica that serves the tunnel
		// applies the route's own (long polls and event streams have none).
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		Proxy:               nil,
	}
	// HTTP/1.1: websocket upgrades pass through it.
	transport.Protocols = new(http.Protocols)
	transport.Protocols.SetHTTP1(true)
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.Host = pr.In.Host
			// Rewrite drops X-Forwarded-*; the entry set them, and the
			// replica that serves the tunnel passes them on.
			for _, h := range forwardedHeaders {
				pr.Out.Header[h] = pr.In.Header[h]
			}
			pr.Out.Header.Set(peerAuthHeader, signPeer(s.peerSecret, time.Now(), pr.Out.Method, pr.Out.Host, pr.Out.URL.RequestURI()))
		},
		Transport:  &peerTransport{next: transport, self: s.cfg.ReplicaID, outcomes: s.metrics.forwarded},
		BufferPool: bufferPool{},
		ErrorLog:   s.proxyErrorLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the caller went away; nobody reads an answer
			}
			s.floodLog.Warn("request to another replica failed", zap.String("host", r.Host), zap.Error(err))
			if att, _ := r.Context().Value(holdersKey{}).(*peerAttempt); att != nil && errors.Is(err, errNoHolderReached) {
				att.passed.Store(true) // route decides what to answer
				return
			}
			writeReplicaUnreachable(w)
		},
	}
}

// peerTransport tries a forwarded request on the tunnel's holders in turn:
// one that cannot be connected to (it died, it is restarting), or that
// answers it no longer serves the tunnel, is passed over while the request
// has sent nothing of its body.
type peerTransport struct {
	next     http.RoundTripper
	self     string
	outcomes *prometheus.CounterVec // by result: ok, unreachable, missed
	turn     atomic.Uint32
}

func (t *peerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	att, _ := req.Context().Value(holdersKey{}).(*peerAttempt)
	if att == nil || len(att.holders) == 0 {
		return nil, errors.New("no replica holds the tunnel")
	}
	holders := att.holders
	start := int(t.turn.Add(1))
	var lastErr error
	for i := range holders {
		h := holders[(start+i)%len(holders)]
		if h.Replica == t.self {
			continue
		}
		out := req.Clone(req.Context())
		out.URL.Host = h.Addr
		res, err := t.next.RoundTrip(out)
		retry := !att.body.started()
		switch {
		case err != nil && dialFailed(err) && retry:
			t.outcomes.WithLabelValues("unreachable").Inc()
			att.unreached.Store(true)
			lastErr = fmt.Errorf("replica %s at %s: %w", h.Replica, h.Addr, err)
			continue
		case err == nil && res.StatusCode == http.StatusServiceUnavailable && res.Header.Get(peerMissHeader) != "" && retry:
			_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 4<<10))
			_ = res.Body.Close()
			t.outcomes.WithLabelValues("missed").Inc()
			lastErr = fmt.Errorf("replica %s no longer serves it", h.Replica)
			continue
		case err != nil:
			return nil, err
		}
		res.Header.Del(peerMissHeader)
		t.outcomes.WithLabelValues("ok").Inc()
		return res, nil
	}
	if lastErr == nil {
		return nil, fmt.Errorf("%w: no other replica holds it", errNoHolderReached)
	}
	return nil, fmt.Errorf("%w: %w", errNoHolderReached, lastErr)
}

// writeReplicaUnreachable answers a request that no replica holding its
// tunnel could be reached for.
func writeReplicaUnreachable(w http.ResponseWriter) {
	proxy.WriteError(w, http.StatusBadGateway, "replica_unreachable",
		"tether: the server replica that holds this tunnel could not be reached; retry")
}

// dialFailed reports whether err is a failure to connect, so the request
// was not sent.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
