package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"sync"
	"time"

	v1 "github.com/fatedier/frp/pkg/config/v1"
	frpserver "github.com/fatedier/frp/server"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
)

// embeddedFRP is the frp server inside tether: it runs the control protocol
// (login, proxies, work connections) on the streams the gate admits, and its
// HTTP vhost on a loopback port, through which stock frpc clients are
// reached. It never accepts client connections itself.
//
// What frp listens on, all on 127.0.0.1:
//
//   - its HTTP vhost, on a port of its own (vhostAddr): the entry's way to a
//     stock frpc's proxy. It must not share frp's bind port: there, frp
//     puts a port muxer that sends a connection to the vhost only when its
//     first bytes look like a common HTTP method, and hands anything else
//     (PROPFIND, MKCOL, a custom method) or "GET /~!frp" (frp's websocket
//     path) to frp's own client listeners, which nobody accepts from since
//     tether never calls frp's Run: such a request hung and leaked a socket
//     and a goroutine.
//   - its bind port, an ephemeral one, with that muxer: frp.NewService always
//     listens there and offers no way to close it alone. It carries nothing
//     (the gate hands frp its streams in-process, through HandleListener) and
//     only a process in the server's own network namespace can reach it. A
//     connection there is read for up to 10s, then held unanswered until the
//     server stops; Service.Close would free it, but also stops frp.
type embeddedFRP struct {
	// Static after startFRP.
	svc       *frpserver.Service
	vhostAddr string // 127.0.0.1:port of frp's HTTP vhost
	conns     *tunnel.ConnListener
	done      chan struct{} // closed when frp stops taking streams
	// mark is the work connections' guards' mark on the answers they give
	// in a tenant's place (workguard.go): random, and known only here.
	mark string
}

// frpVhostTimeout is frp's own bound on a stock frpc service's response
// headers (VhostHTTPTimeout, in seconds). It is longer than tether's
// (vhostResponseHeaderTimeout), so that tether's fires first and the caller
// gets tether's 504 with its error code rather than frp's bare one.
const frpVhostTimeout = 70

// startFRP starts frp with the auth plugin at pluginURL and feeds it the
// streams of conns. A lost race for frp's ports is retried.
func startFRP(domain, pluginAddr, pluginPath string, ops []string, conns *tunnel.ConnListener) (*embeddedFRP, error) {
	cfg := &v1.ServerConfig{
		BindAddr:         "127.0.0.1",
		ProxyBindAddr:    "127.0.0.1",
		VhostHTTPTimeout: frpVhostTimeout,
		SubDomainHost:    domain,
		Transport: v1.ServerTransportConfig{
			// The gate owns TLS and multiplexing; frp sees single streams.
			TCPMux: new(false),
			// The gate's heartbeat (watchHeartbeats, and the tether
			// client's pings) detects dead clients.
			HeartbeatTimeout: -1,
		},
		DetailedErrorsToClient: new(true), // plugin reject reasons reach the client verbatim
		HTTPPlugins: []v1.HTTPPluginOptions{{
			Name: "tether-auth",
			Addr: pluginAddr,
			Path: pluginPath,
			Ops:  ops,
		}},
	}
	if err := cfg.Complete(); err != nil {
		return nil, fmt.Errorf("complete frp server config: %w", err)
	}
	var lastErr error
	for range 5 {
		svc, err := newFRPService(cfg)
		if err != nil {
			lastErr = err
			continue
		}
		f := &embeddedFRP{
			svc: svc, vhostAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.VhostHTTPPort)),
			conns: conns, done: make(chan struct{}), mark: randomHex(),
		}
		go func() {
			defer close(f.done)
			svc.HandleListener(conns, false)
		}()
		return f, nil
	}
	return nil, fmt.Errorf("start embedded frp server: %w", lastErr)
}

// frpStarting serialises frp's NewService: it sets process-wide variables
// (vhost.NotFoundPagePath), so two servers in one process (replicas in a
// test) must not start at once.
var frpStarting sync.Mutex

// newFRPService starts frp on two free loopback ports of its own, its bind
// port and its vhost's. frp takes port numbers, not listeners, so each is
// found by listening and freed just before frp listens there: another
// process may take one in between, and NewService then fails. It must not
// fail after its bind port: it leaves that listener and its goroutines
// open, with no way to close them. So the two ports are distinct (found
// while both are held), and found while no other server of this process
// starts.
func newFRPService(cfg *v1.ServerConfig) (*frpserver.Service, error) {
	frpStarting.Lock()
	defer frpStarting.Unlock()
	var lc net.ListenConfig
	var held [2]net.Listener
	for i := range held {
		ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			for _, l := range held[:i] {
				_ = l.Close()
			}
			return nil, fmt.Errorf("find a free loopback port for the embedded frp server: %w", err)
		}
		held[i] = ln
	}
	cfg.BindPort = held[0].Addr().(*net.TCPAddr).Port
	cfg.VhostHTTPPort = held[1].Addr().(*net.TCPAddr).Port
	for _, l := range held {
		_ = l.Close()
	}
	return frpserver.NewService(cfg)
}

// Close stops frp: no more streams, every control closed.
func (f *embeddedFRP) Close() {
	_ = f.conns.Close()
	<-f.done
	_ = f.svc.Close()
}

// vhostResponseHeaderTimeout bounds the wait for a stock frpc service's
// response headers: 60s, the bound of a tether client's default route
// (the app-proxy adapter), so a tunnel answers alike whichever client
// serves it. frp's own bound (frpVhostTimeout) is longer.
const vhostResponseHeaderTimeout = 60 * time.Second

// vhostTransport is the transport to frp's vhost of one stock frpc
// session: each session has its own, closed when the session ends, so that
// a pooled connection to the vhost is never shared by two tunnels
// (whatever one tenant's service does to a connection cannot reach another
// tenant's requests).
//
// It reads frp's answers as the router reads a tether client's (the
// tenant's answer, as frp passed it on): heads bounded by
// proxy.LimitHeads, and tether's own fields (X-Tether-*) dropped from the
// head, the 1xx heads and the trailers, except from the 502 a work
// connection's guard gives in a tenant's place, which bears the guard's
// mark and becomes tether's upstream_bad_response.
type vhostTransport struct {
	*http.Transport // for CloseIdleConnections
	limited         http.RoundTripper
	mark            string
	log             *zap.Logger
}

// vhostTransport returns a new transport to frp's vhost.
func (f *embeddedFRP) vhostTransport(log *zap.Logger) *vhostTransport {
	t := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		ResponseHeaderTimeout: vhostResponseHeaderTimeout,
		// A tunnel's idle pool: enough for a busy tunnel's concurrency on
		// loopback, small enough that thousands of tunnels stay cheap.
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     60 * time.Second,
		DisableCompression:  true,
	}
	return &vhostTransport{Transport: t, limited: proxy.LimitHeads(t), mark: f.mark, log: log}
}

func (t *vhostTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	trace := &httptrace.ClientTrace{Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
		proxy.DropTetherFields(h) // before httputil.ReverseProxy's hook passes it on
		return nil
	}}
	res, err := t.limited.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	if err != nil {
		return nil, err
	}
	refused := guarded(res.Header, t.mark)
	res.Header.Del(guardHeader)
	proxy.DropTetherFields(res.Header)
	if refused {
		res.Header.Set(proxy.ErrorHeader, proxy.CodeUpstreamBadResponse)
		t.log.Warn("a stock frpc's answer refused: its head is beyond the bounds or not HTTP/1.1",
			zap.String("host", req.Host), zap.String("code", proxy.CodeUpstreamBadResponse))
	}
	proxy.DropTetherFields(res.Trailer) // the announced ones
	if res.StatusCode != http.StatusSwitchingProtocols && res.Body != http.NoBody {
		res.Body = &trailerScrubber{ReadCloser: res.Body, res: res}
	}
	return res, nil
}

// trailerScrubber drops tether's own fields from the trailers of res once
// its body has ended, when net/http has filled them in.
type trailerScrubber struct {
	io.ReadCloser
	res *http.Response
}

func (b *trailerScrubber) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		proxy.DropTetherFields(b.res.Trailer)
	}
	return n, err
}

// randomHex returns 128 random bits as hex.
func randomHex() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// randomPath returns an unguessable URL path for the in-process auth plugin,
// so that no other local process can feed it requests.
func randomPath() string { return "/tether-auth/" + randomHex() }
