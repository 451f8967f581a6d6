package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	frpauth "github.com/fatedier/frp/pkg/auth"
	v1 "github.com/fatedier/frp/pkg/config/v1"
	"github.com/fatedier/frp/pkg/msg"
	netpkg "github.com/fatedier/frp/pkg/util/net"
	frpversion "github.com/fatedier/frp/pkg/util/version"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel"
)

// The load generator of the footprint tests: sessions opened the way a
// tether client opens them, on the wire — TLS, yamux with the client's
// configuration (so the server sees the client's pings), frp's Login with
// the token and the advertised routes, the route registered on the
// encrypted control stream — which then stay idle: each answers the
// server's pings and reads the notices the server sends, nothing more.
// Thousands fit in one process, where as many tether clients would measure
// the clients.

// loadPlan says which sessions a load generator opens.
type loadPlan struct {
	// Addr is the server's tunnel address.
	Addr string
	// Sources are the local addresses (127.0.0.x) the sessions connect
	// from, in turn: more of them, more ephemeral ports.
	Sources []string
	// Tunnels is the number of tunnels, named tNNNNN, and PerTunnel the
	// sessions each has (a tether client's --connections).
	Tunnels, PerTunnel int
	// Heartbeat is the clients' heartbeat timeout (they ping as a tether
	// client does, tunnel.KeepAlive). Default: the client's, 15s.
	Heartbeat time.Duration
	// NoPings: the sessions never ping (they still answer pings).
	NoPings bool
	// Parallel bounds the sessions being opened at once. Default 32.
	Parallel int
}

// loadRoutes is what every session advertises: one route, as a tether
// client with --route /=http://127.0.0.1:9 would.
const loadRoutes = `["/=http://127.0.0.1:9"]`

// loadTunnel names tunnel i of a plan.
func loadTunnel(i int) string { return fmt.Sprintf("t%05d", i) }

// loadGen is a plan's sessions, open.
type loadGen struct {
	mu       sync.Mutex
	sessions []*loadSession
	// notices counts the notices the sessions have read.
	notices atomic.Int64
}

// openLoad opens every session of plan, tokens signed by k, and returns
// once all are logged in with their route registered, or at the first
// failure (the sessions opened so far are closed then).
func openLoad(ctx context.Context, plan loadPlan, k *keys) (*loadGen, error) {
	if plan.Heartbeat == 0 {
		plan.Heartbeat = 15 * time.Second
	}
	if plan.Parallel == 0 {
		plan.Parallel = 32
	}
	frpAuth, err := loadFRPAuth()
	if err != nil {
		return nil, err
	}
	lg := &loadGen{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(plan.Parallel)
	n := 0
	for i := range plan.Tunnels {
		name := loadTunnel(i)
		token, err := k.signer.Issue(auth.IssueRequest{Tunnel: name, Account: "load", TTL: 24 * time.Hour}, time.Now())
		if err != nil {
			return nil, fmt.Errorf("issue a token for %s: %w", name, err)
		}
		for j := range plan.PerTunnel {
			src := ""
			if len(plan.Sources) > 0 {
				src = plan.Sources[n%len(plan.Sources)]
			}
			n++
			g.Go(func() error {
				s, err := openLoadSession(gctx, plan, frpAuth, src, token, name, fmt.Sprintf("%08x-%d", i, j), &lg.notices)
				if err != nil {
					return fmt.Errorf("session %d of tunnel %s: %w", j, name, err)
				}
				lg.mu.Lock()
				lg.sessions = append(lg.sessions, s)
				lg.mu.Unlock()
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		lg.Close()
		return nil, err
	}
	return lg, nil
}

// Len is the number of sessions.
func (lg *loadGen) Len() int {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	return len(lg.sessions)
}

// waiting names the sessions that have not had a notice yet, at most max.
func (lg *loadGen) waiting(limit int) []string {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	var names []string
	for _, s := range lg.sessions {
		if !s.hello.Load() && len(names) < limit {
			names = append(names, fmt.Sprintf("%s(closed=%v)", s.name, s.mux.IsClosed()))
		}
	}
	return names
}

// closed counts the sessions that have ended.
func (lg *loadGen) closed() int {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	n := 0
	for _, s := range lg.sessions {
		if s.mux.IsClosed() {
			n++
		}
	}
	return n
}

// Close closes every session and waits for their goroutines.
func (lg *loadGen) Close() {
	lg.mu.Lock()
	sessions := lg.sessions
	lg.sessions = nil
	lg.mu.Unlock()
	for _, s := range sessions {
		s.Close()
	}
}

// loadFRPAuth is frp's client auth as a tether client configures it: frp's
// own token is empty (the JWT travels in the login's metadata).
func loadFRPAuth() (*frpauth.ClientAuth, error) {
	common := &v1.ClientCommonConfig{}
	if err := common.Complete(); err != nil {
		return nil, fmt.Errorf("complete frp client config: %w", err)
	}
	a, err := frpauth.BuildClientAuth(&common.Auth)
	if err != nil {
		return nil, fmt.Errorf("frp client auth: %w", err)
	}
	return a, nil
}

// loadSession is one idle session of the load generator.
type loadSession struct {
	name    string
	mux     *yamux.Session
	control net.Conn
	notices *atomic.Int64
	hello   atomic.Bool   // a notice arrived
	done    chan struct{} // closed when readNotices has returned
}

// openLoadSession connects from src (any address if "") and logs in as
// tunnel name with token and runID, then registers the route
// "<name>.<runID>" at subdomain name, as a tether client's slot does. The
// notices it reads are counted in notices.
func openLoadSession(ctx context.Context, plan loadPlan, frpAuth *frpauth.ClientAuth, src, token, name, runID string, notices *atomic.Int64) (*loadSession, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d := net.Dialer{}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	raw, err := d.DialContext(ctx, "tcp", plan.Addr)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	gatherer := tunnel.NewGatherer(raw)
	conn := tls.Client(gatherer, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a load generator against a self-signed test server
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	mux, err := yamux.Client(tunnel.CoalesceFrames(conn, gatherer), tunnel.MuxConfig(plan.Heartbeat, zap.NewNop()))
	if err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("start yamux: %w", err)
	}
	s := &loadSession{name: name, mux: mux, notices: notices, done: make(chan struct{})}
	if err := s.login(ctx, frpAuth, token, name, runID); err != nil {
		_ = mux.Close()
		return nil, err
	}
	go s.readNotices()
	if !plan.NoPings {
		go func() { _ = tunnel.KeepAlive(mux, plan.Heartbeat) }()
	}
	return s, nil
}

// login sends the Login and the route's NewProxy on the control stream and
// reads the server's answers.
func (s *loadSession) login(ctx context.Context, frpAuth *frpauth.ClientAuth, token, name, runID string) error {
	stream, err := s.mux.OpenStream()
	if err != nil {
		return fmt.Errorf("open control stream: %w", err)
	}
	s.control = stream
	if deadline, ok := ctx.Deadline(); ok {
		_ = stream.SetDeadline(deadline)
	}
	login := &msg.Login{
		Version:   frpversion.Full(),
		Hostname:  "load",
		Timestamp: time.Now().Unix(),
		RunID:     runID,
		Metas: map[string]string{
			auth.TokenMetaKey:    token,
			tunnel.RoutesMetaKey: loadRoutes,
			tunnel.ClientMetaKey: "tether load generator",
		},
	}
	if err := frpAuth.Setter.SetLogin(login); err != nil {
		return fmt.Errorf("sign login: %w", err)
	}
	if err := msg.WriteMsg(stream, login); err != nil {
		return fmt.Errorf("send login: %w", err)
	}
	var resp msg.LoginResp
	if err := msg.ReadMsgInto(stream, &resp); err != nil {
		return fmt.Errorf("read login answer: %w", err)
	}
	if resp.Error != "" {
		return fmt.Errorf("login rejected: %s", resp.Error)
	}
	rw, err := netpkg.NewCryptoReadWriter(stream, frpAuth.EncryptionKey())
	if err != nil {
		return fmt.Errorf("encrypt control stream: %w", err)
	}
	route := &v1.HTTPProxyConfig{
		ProxyBaseConfig: v1.ProxyBaseConfig{Name: name + "." + runID, Type: "http"},
		DomainConfig:    v1.DomainConfig{SubDomain: name},
	}
	route.Complete()
	var np msg.NewProxy
	route.MarshalToMsg(&np)
	if err := msg.WriteMsg(rw, &np); err != nil {
		return fmt.Errorf("register route: %w", err)
	}
	var npr msg.NewProxyResp
	if err := msg.ReadMsgInto(rw, &npr); err != nil {
		return fmt.Errorf("read route answer: %w", err)
	}
	if npr.Error != "" {
		return fmt.Errorf("route rejected: %s", npr.Error)
	}
	_ = stream.SetDeadline(time.Time{})
	return nil
}

// readNotices reads the notices on the streams the server opens until the
// session ends. A load session serves no requests: any other stream is
// closed.
func (s *loadSession) readNotices() {
	defer close(s.done)
	for {
		stream, err := s.mux.AcceptStream()
		if err != nil {
			return
		}
		_ = stream.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := tunnel.ReadNotice(stream); err == nil {
			s.hello.Store(true)
			s.notices.Add(1)
		}
		_ = stream.Close()
	}
}

// Close ends the session and waits for its notice reader.
func (s *loadSession) Close() {
	_ = s.mux.Close()
	<-s.done
}

// check reports a plan the machine cannot open: each session needs a file
// descriptor here and one in the server, which inherits the limit.
func (p loadPlan) check(fdLimit uint64) error {
	const spare = 64                            // listeners, the log, HTTP clients
	sessions := uint64(p.Tunnels * p.PerTunnel) //nolint:gosec // positive counts
	if fdLimit < sessions+spare {
		return fmt.Errorf("%d sessions need %d open files in this process and in the server, and the limit is %d: "+
			"raise it (ulimit -n; the hard limit is ulimit -Hn) or open at most %d sessions",
			sessions, sessions+spare, fdLimit, max(int64(fdLimit)-spare, 0)) //nolint:gosec // fd limits fit
	}
	return nil
}
