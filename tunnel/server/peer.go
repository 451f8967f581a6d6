package server

import (
	"context"
	"crypto/rand"
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
// The peer listener speaks TLS and serves only other replicas, which
// authenticate with their certificates (peertls.go): a request reaches a
// tunnel through it only from a replica. The X-Forwarded-* headers the
// first replica set travel unchanged. Connections between replicas are kept
// alive and shared by the tunnels: both ends are tether's own HTTP servers,
// which frame every response themselves, so no tenant's bytes can leave one
// where another's request expects its answer.
const (
	// peerMissHeader marks a peer's 503 for a tunnel it no longer serves:
	// the forwarding replica then tries another holder. An upstream's
	// answer passes through the serving replica, headers and all, so the
	// mark is a value the upstream cannot know: the forwarding replica
	// sends a fresh random one in the request, under the same name, and
	// the serving replica takes it out of the request before routing it and
	// answers a miss with it.
	peerMissHeader = "X-Tether-Peer-Miss"
	// peerDialTimeout bounds connecting to another replica: on a cluster
	// network a live replica answers in milliseconds.
	peerDialTimeout = 2 * time.Second
)

// servePeer serves a request another replica forwarded; the peer listener
// admitted only replicas.
func (s *replica) servePeer(w http.ResponseWriter, r *http.Request) {
	if r.Host == peerControlHost {
		s.servePeerControl(w, r)
		return
	}
	miss := r.Header.Get(peerMissHeader)
	delete(r.Header, peerMissHeader)
	if s.refuseTarget(w, r) {
		return
	}
	name, ok := tunnelName(r.Host, s.srv.cfg.Domain)
	if !ok {
		if miss != "" {
			w.Header().Set(peerMissHeader, miss)
		}
		proxy.WriteError(w, http.StatusNotFound, "unknown_host",
			fmt.Sprintf("tether: no tunnel is served at host %q; tunnels are served at <name>.%s", r.Host, s.srv.cfg.Domain))
		return
	}
	s.metrics.peerServed.Inc()
	// A webhook whose upstream refuses is stored here, where the session
	// that found it away is: the replicas share the store, and the 202
	// goes back through the replica the caller reached.
	r = s.srv.webhooks.markOfferable(r, name)
	s.route(proxy.NewStatusWriter(w), r, name, origin{peer: true, missMark: miss})
}

// origin is where a request route serves came from: the public entry (the
// zero value), or another replica.
type origin struct {
	// peer: another replica forwarded it. It is served here or refused at
	// once, and that replica tries the tunnel's next holder.
	peer bool
	// missMark is the forwarding replica's mark for an answer that says
	// this replica no longer serves the tunnel (peerMissHeader).
	missMark string
}

// markMiss marks w's answer to a forwarded request as a miss.
func (o origin) markMiss(w http.ResponseWriter) {
	if o.missMark != "" {
		w.Header().Set(peerMissHeader, o.missMark)
	}
}

// forward sends a request to one of the replicas that hold its tunnel, and
// the answer back to the caller. It reports done false, having written
// nothing, when every holder was passed over with nothing of the request's
// body sent: it could not be connected to, or it no longer serves the
// tunnel (a drain moved the client away, the registry lags). The caller may
// then wait for the tunnel's client to reconnect elsewhere. unreached
// reports whether a holder could not be connected to.
func (s *replica) forward(w http.ResponseWriter, r *http.Request, holders []registry.Holder, body *guardedBody) (done, unreached bool) {
	att := &peerAttempt{via: s.peers.transport, holders: holders, body: body}
	s.peers.forward(w, r, att)
	return !att.passed.Load(), att.unreached.Load()
}

// peerAttempt is one forwarded request's holders, tried in turn: the
// RoundTripper of its forward.
type peerAttempt struct {
	// Static after forward made it.
	via     *peerTransport
	holders []registry.Holder
	body    *guardedBody

	// Set by the transport and the proxy's error handler, read by forward
	// once the proxy returned.
	//
	// passed is set when every holder was passed over and nothing of the
	// body was sent: no answer was written.
	passed atomic.Bool
	// unreached is set when a holder could not be connected to.
	unreached atomic.Bool
}

func (att *peerAttempt) RoundTrip(req *http.Request) (*http.Response, error) {
	return att.via.roundTrip(req, att)
}

// peerProxy forwards requests to other replicas.
type peerProxy struct {
	// template is copied for each forward, which sets the copy's
	// Transport and ErrorHandler to the attempt's.
	template  httputil.ReverseProxy
	transport *peerTransport
	log       *zap.Logger
}

// forward sends r to att's holders and the answer back to w.
func (p *peerProxy) forward(w http.ResponseWriter, r *http.Request, att *peerAttempt) {
	rp := p.template
	rp.Transport = att
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		if r.Context().Err() != nil {
			return // the caller went away; nobody reads an answer
		}
		p.log.Warn("request to another replica failed", zap.String("host", r.Host), zap.Error(err))
		if errors.Is(err, errNoHolderReached) {
			att.passed.Store(true) // route decides what to answer
			return
		}
		writeReplicaUnreachable(w)
	}
	serveHeld(w, r, rp.ServeHTTP, writeReplicaLost)
}

// writeReplicaLost answers a forwarded request whose answer broke off
// before its body began: the replica that serves the tunnel went away.
func writeReplicaLost(w http.ResponseWriter) {
	proxy.WriteError(w, http.StatusBadGateway, "replica_unreachable",
		"tether: the server replica that serves this tunnel went away before its answer arrived; retry")
}

// errNoHolderReached: a forwarded request reached none of the tunnel's
// holders that still serve it, and nothing of its body was sent.
var errNoHolderReached = errors.New("no replica that serves the tunnel could be reached")

// newPeerProxy is the reverse proxy that forwards requests to other
// replicas.
func (s *replica) newPeerProxy() *peerProxy {
	transport := &http.Transport{
		DialTLSContext: s.peerDialer(),
		// No response-header timeout: the replica that serves the tunnel
		// applies the route's own (long polls and event streams have none).
		MaxResponseHeaderBytes: maxPeerResponseHeaderBytes,
		MaxIdleConnsPerHost:    256,
		IdleConnTimeout:        90 * time.Second,
		DisableCompression:     true,
		Proxy:                  nil,
	}
	// HTTP/1.1: websocket upgrades pass through it.
	transport.Protocols = new(http.Protocols)
	transport.Protocols.SetHTTP1(true)
	return &peerProxy{
		template: httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.URL.Scheme = "https"
				pr.Out.Host = pr.In.Host
				// Rewrite drops X-Forwarded-*; the entry set them, and the
				// replica that serves the tunnel passes them on.
				for _, h := range forwardedHeaders {
					pr.Out.Header[h] = pr.In.Header[h]
				}
			},
			BufferPool: bufferPool{},
			ErrorLog:   s.srv.proxyErrorLog,
		},
		transport: &peerTransport{next: transport, self: s.srv.cfg.ReplicaID, outcomes: s.metrics.forwarded},
		log:       s.srv.floodLog,
	}
}

// peerListener is the peer port's listener on ln: TLS, for replicas only.
// A connection without a replica's certificate is counted, logged
// (sampled) and closed before any request is read.
func (s *replica) peerListener(ln net.Listener) net.Listener {
	return &peerListener{Listener: ln, config: s.srv.peerTLS.serverConfig(), refused: func(conn net.Conn, err error) {
		s.metrics.peerRefused.Inc()
		s.srv.floodLog.Warn("peer connection refused: no certificate of a replica of this fleet (another --peer-secret-file or --peer-tls-ca, a replica of an earlier version, or no replica at all)",
			zap.String("remote_addr", conn.RemoteAddr().String()), zap.Error(err))
	}}
}

// peerDialer connects to other replicas' peer ports over TLS.
func (s *replica) peerDialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	if s.srv.peerTLS == nil { // no peer listener, no replica to forward to
		return func(_ context.Context, network, _ string) (net.Conn, error) {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("no peer credentials: set --peer-secret-file")}
		}
	}
	return s.srv.peerTLS.dialer(s.srv.floodLog.Named("peer"))
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

// roundTrip sends req to att's holders in turn.
func (t *peerTransport) roundTrip(req *http.Request, att *peerAttempt) (*http.Response, error) {
	if len(att.holders) == 0 {
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
		miss := rand.Text()
		out.Header.Set(peerMissHeader, miss)
		res, err := t.next.RoundTrip(out)
		retry := !att.body.started()
		switch {
		case err != nil && dialFailed(err) && retry:
			t.outcomes.WithLabelValues("unreachable").Inc()
			att.unreached.Store(true)
			lastErr = fmt.Errorf("replica %s at %s: %w", h.Replica, h.Addr, err)
			continue
		case err == nil && res.StatusCode == http.StatusServiceUnavailable && res.Header.Get(peerMissHeader) == miss && retry:
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
		noteForwarded(req.Context(), h.Replica)
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

// dialFailed reports whether err is a failure to connect, or to complete
// the TLS handshake, so the request was not sent.
func dialFailed(err error) bool {
	var op *net.OpError
	var hs *peerHandshakeError
	return errors.As(err, &op) && op.Op == "dial" || errors.As(err, &hs)
}
