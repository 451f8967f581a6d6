package server

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	frputil "github.com/fatedier/frp/pkg/util/util"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/auth"
	wait "github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/client"
	"github.com/tether-dev/tether/tunnel/server/gate"
)

// closedWithin fails the test unless the server closes c within d.
func closedWithin(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			t.Fatalf("the server did not close the connection within %v", d)
		}
		return
	}
}

func (s *testServer) limited(limit string) float64 {
	return testutil.ToFloat64(s.metrics.sessionsLimited.WithLabelValues(limit))
}

func (s *testServer) refusedConns(reason string) float64 {
	return testutil.ToFloat64(s.metrics.connectionsRefused.WithLabelValues(reason))
}

// waitCount waits until count() is want.
func waitCount(t testing.TB, what string, count func() int, want int) {
	t.Helper()
	wait.WaitFor(t, 10*time.Second, func() error {
		if n := count(); n != want {
			return fmt.Errorf("%d %s, want %d", n, what, want)
		}
		return nil
	})
}

// A second stream before the login is verified closes the connection:
// the login (or a probe) is all an anonymous client may send.
func TestSecondStreamBeforeLoginClosesTheSession(t *testing.T) {
	s := startServer(t)
	c := dialRaw(t, s.tunnel)
	if _, err := c.mux.OpenStream(); err != nil {
		t.Fatal(err)
	}
	_, _ = c.mux.OpenStream() // may see the session end already
	select {
	case <-c.mux.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("a session with two streams before login is still open")
	}
	wait.WaitFor(t, 5*time.Second, func() error {
		if got := s.limited(gate.LimitStreamBeforeLogin); got != 1 {
			return fmt.Errorf("tether_sessions_closed_by_limit_total{limit=stream_before_login} = %v, want 1", got)
		}
		return nil
	})
}

// A yamux frame's header (hashicorp/yamux const.go): version(1) type(1)
// flags(2) stream(4) length(4).
const (
	muxHeaderSize    = 12
	muxTypeData      = 0
	muxTypeWindowUpd = 1
	muxFlagSYN       = 1
)

// muxFrame is a yamux frame: version 0, type, flags, stream, length.
func muxFrame(typ byte, flags uint16, stream, length uint32, body []byte) []byte {
	h := make([]byte, muxHeaderSize, muxHeaderSize+len(body))
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], stream)
	binary.BigEndian.PutUint32(h[8:12], length)
	return append(h, body...)
}

// What a connection sends before its login is verified is bounded, at
// every layer: TLS, yamux, and yamux frames announced but not sent.
func TestLoginBudget(t *testing.T) {
	s := startServer(t)
	for _, tc := range []struct {
		name   string
		attack func(t *testing.T) net.Conn
	}{
		{"a yamux frame announcing more than the budget", func(t *testing.T) net.Conn {
			c := wait.DialTLSFrom(t, s.tunnel, "127.0.0.1")
			_, _ = c.Write(muxFrame(muxTypeData, muxFlagSYN, 1, gate.LoginBudget, nil))
			return c
		}},
		{"small yamux frames adding up to more than the budget", func(t *testing.T) net.Conn {
			c := wait.DialTLSFrom(t, s.tunnel, "127.0.0.1")
			out := muxFrame(muxTypeWindowUpd, muxFlagSYN, 1, 0, nil)
			for len(out) <= gate.LoginBudget {
				out = append(out, muxFrame(muxTypeWindowUpd, 0, 1, 0, nil)...)
			}
			_, _ = c.Write(out)
			return c
		}},
		{"a TLS ClientHello larger than the budget", func(t *testing.T) net.Conn {
			c := wait.DialFrom(t, s.tunnel, "127.0.0.1")
			for i := range 3 {
				rec := make([]byte, 5+16000)
				rec[0], rec[1], rec[2] = 0x16, 0x03, 0x01
				binary.BigEndian.PutUint16(rec[3:5], 16000)
				if i == 0 {
					rec[5], rec[7], rec[8] = 1, 0xea, 0x60 // ClientHello of 60,000 bytes
				}
				if _, err := c.Write(rec); err != nil {
					break // the server closed the connection
				}
			}
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := s.limited(gate.LimitLoginBudget)
			closedWithin(t, tc.attack(t), 5*time.Second)
			wait.WaitFor(t, 5*time.Second, func() error {
				if got := s.limited(gate.LimitLoginBudget) - before; got != 1 {
					return fmt.Errorf("tether_sessions_closed_by_limit_total{limit=login_budget} rose by %v, want 1", got)
				}
				return nil
			})
		})
	}
}

// A first message announcing more than gate.MaxOpeningSize is refused from its
// header, and its session closed.
func TestOversizedOpeningIsRefused(t *testing.T) {
	s := startServer(t)
	v1 := make([]byte, 9)
	v1[0] = msg.TypeLogin
	binary.BigEndian.PutUint64(v1[1:], gate.MaxOpeningSize+1)
	v2 := []byte("FRP\x00\x02\r\n\x00\x10\x00\x00\x00\x01\x00\x00") // a message frame of 64 KiB
	for name, opening := range map[string][]byte{"v1": v1, "v2": v2} {
		t.Run(name, func(t *testing.T) {
			before := testutil.ToFloat64(s.metrics.refusedStreams.WithLabelValues("too_large"))
			c := dialRaw(t, s.tunnel)
			stream, err := c.mux.OpenStream()
			if err != nil {
				t.Fatal(err)
			}
			_, _ = stream.Write(opening) // may see the session end already
			select {
			case <-c.mux.CloseChan():
			case <-time.After(5 * time.Second):
				t.Fatal("the session is still open")
			}
			if got := testutil.ToFloat64(s.metrics.refusedStreams.WithLabelValues("too_large")) - before; got != 1 {
				t.Errorf("tether_streams_refused_total{reason=too_large} rose by %v, want 1", got)
			}
		})
	}
}

// A connection that sends no login soon after its handshake is closed,
// whether it opened a stream for it or not.
func TestNoLoginAfterTheHandshake(t *testing.T) {
	s := startServer(t, func(c *Config) { c.LoginTimeout = time.Second })
	pinged := dialRaw(t, s.tunnel)
	if _, err := pinged.mux.Ping(); err != nil {
		t.Fatal(err)
	}
	silent := dialRaw(t, s.tunnel)
	if _, err := silent.mux.OpenStream(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*rawClient{pinged, silent} {
		select {
		case <-c.mux.CloseChan():
		case <-time.After(5 * time.Second):
			t.Fatal("a connection without a login is still open")
		}
	}
	wait.WaitFor(t, 5*time.Second, func() error {
		if got := s.limited(gate.LimitNoLogin); got != 2 {
			return fmt.Errorf("tether_sessions_closed_by_limit_total{limit=no_login} = %v, want 2", got)
		}
		return nil
	})
}

// A client that pings faster than any keepalive is closed, logged in or
// not: yamux answers each ping from a goroutine of its own.
func TestPingFloodClosesTheSession(t *testing.T) {
	s := startServer(t)
	c := dialRaw(t, s.tunnel)
	if resp, _ := c.login(s.keys.token(t, "alpha", time.Hour), ""); resp.Error != "" {
		t.Fatalf("login: %s", resp.Error)
	}
	pings := 0
	for ; pings < 10*gate.PingBurst; pings++ {
		if _, err := c.mux.Ping(); err != nil {
			break
		}
	}
	if pings < gate.PingBurst || pings >= 10*gate.PingBurst {
		t.Fatalf("the session answered %d pings in a row, want about %d", pings, gate.PingBurst)
	}
	wait.WaitFor(t, 5*time.Second, func() error {
		if _, ok := s.members.lookup("alpha"); ok {
			return errors.New("tunnel alpha is still registered")
		}
		if got := s.limited(gate.LimitPings); got != 1 {
			return fmt.Errorf("tether_sessions_closed_by_limit_total{limit=pings} = %v, want 1", got)
		}
		return nil
	})
}

// A logged-in client may have gate.MaxClientStreams streams open at once, and
// no more.
func TestStreamsOfALoggedInClientAreCapped(t *testing.T) {
	s := startServer(t)
	c := dialRaw(t, s.tunnel)
	if resp, _ := c.login(s.keys.token(t, "alpha", time.Hour), ""); resp.Error != "" {
		t.Fatalf("login: %s", resp.Error)
	}
	sess, ok := s.members.lookup("alpha")
	if !ok {
		t.Fatal("tunnel alpha not registered")
	}
	for range gate.MaxClientStreams - 1 { // the control stream is one
		if _, err := c.mux.OpenStream(); err != nil {
			t.Fatal(err)
		}
	}
	wait.WaitFor(t, 10*time.Second, func() error {
		if n := sess.ClientStreams(); n != gate.MaxClientStreams {
			return fmt.Errorf("%d client streams open on the server, want %d", n, gate.MaxClientStreams)
		}
		return nil
	})
	if reason := sess.CloseReason(); reason != "" {
		t.Fatalf("the session closed at %d streams: %s", gate.MaxClientStreams, reason)
	}
	_, _ = c.mux.OpenStream() // may see the session end already
	select {
	case <-c.mux.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatalf("a session with %d streams is still open", gate.MaxClientStreams+1)
	}
	wait.WaitFor(t, 5*time.Second, func() error {
		if got := s.limited(gate.LimitStreams); got != 1 {
			return fmt.Errorf("tether_sessions_closed_by_limit_total{limit=streams} = %v, want 1", got)
		}
		return nil
	})
}

// The cap counts the streams open at once, not all a client ever opened:
// frp work connections frp has closed no longer count.
func TestClosedStreamsLeaveTheCount(t *testing.T) {
	s := startServer(t)
	c := dialRaw(t, s.tunnel)
	if resp, _ := c.login(s.keys.token(t, "alpha", time.Hour), "alpha"); resp.Error != "" {
		t.Fatalf("login: %s", resp.Error)
	}
	sess, ok := s.members.lookup("alpha")
	if !ok {
		t.Fatal("tunnel alpha not registered")
	}
	// frp keeps a few work connections in its pool and closes the rest;
	// each is waited for (frp's close, or a moment for one it keeps), so
	// that at most the pool is open at a time.
	for i := range gate.MaxClientStreams + 50 {
		stream, err := c.mux.OpenStream()
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		now := time.Now().Unix()
		if err := msg.WriteMsg(stream, &msg.NewWorkConn{RunID: sess.RunID(), PrivilegeKey: frputil.GetAuthKey("", now), Timestamp: now}); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		_ = stream.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, _ = stream.Read(make([]byte, 1))
		wait.WaitFor(t, 10*time.Second, func() error {
			if n := sess.ClientStreams(); n > 1+16 {
				return fmt.Errorf("%d client streams open", n)
			}
			return nil
		})
	}
	if reason := sess.CloseReason(); reason != "" {
		t.Fatalf("the session closed after %d work connections, one at a time: %s", gate.MaxClientStreams+50, reason)
	}
}

// routes32 are 32 routes of realistic length, as many as a client may
// advertise.
func routes32(upstream string) []proxy.Route {
	var routes []proxy.Route
	for i := range maxRoutes {
		spec := fmt.Sprintf("/component-%02d-with-a-long-name=%s;timeout=2m30s", i, upstream)
		if i == 0 {
			spec = "/=" + upstream
		}
		r, err := proxy.ParseRoute(spec)
		if err != nil {
			panic(err)
		}
		routes = append(routes, r)
	}
	return routes
}

// The largest login a tether client sends (32 routes whose upstreams have
// long in-cluster names, a token with every claim) fits the opening bound
// with room to spare, and logs in through the gate.
func TestLargestLoginFitsTheBounds(t *testing.T) {
	upstream := "http://argocd-server.a-namespace-of-sixty-three-characters-long-for-the-test.svc.cluster.local:8080"
	var specs []string
	for _, r := range routes32(upstream) {
		specs = append(specs, r.String())
	}
	advertised, err := json.Marshal(specs)
	if err != nil {
		t.Fatal(err)
	}
	token, err := newKeys(t).signer.Issue(auth.IssueRequest{
		Tunnel: strings.Repeat("t", 63), Account: strings.Repeat("a", 128), Runtime: strings.Repeat("r", 128), TTL: time.Hour,
	}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	login := &msg.Login{
		Version: "0.71.0", Hostname: strings.Repeat("h", 253), Os: "linux", Arch: "amd64", RunID: strings.Repeat("t", 63),
		PrivilegeKey: frputil.GetAuthKey("", 1), Timestamp: time.Now().Unix(),
		Metas: map[string]string{
			auth.TokenMetaKey: token, tunnel.RoutesMetaKey: string(advertised), tunnel.ClientMetaKey: "tether v1.2.3-rc.4+0123456789ab",
		},
	}
	var buf strings.Builder
	if err := msg.WriteMsg(&buf, login); err != nil {
		t.Fatal(err)
	}
	t.Logf("the largest login is %d bytes; the bound is %d, the login budget %d", buf.Len(), gate.MaxOpeningSize, gate.LoginBudget)
	if buf.Len() > gate.MaxOpeningSize*2/3 {
		t.Errorf("a login with %d routes is %d bytes, want at most two thirds of gate.MaxOpeningSize (%d)", maxRoutes, buf.Len(), gate.MaxOpeningSize)
	}

	// And through the gate, with a real client.
	s := startServer(t)
	be := backend(t, "big")
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, s.keys.token(t, "big", time.Hour))
	cl, err := client.New(client.Config{
		Server: s.tunnel, TokenFile: tokenFile, Routes: routes32(be.URL),
		TLSFingerprint: s.Fingerprint(), Proxy: "direct",
	}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cl.Serve(t.Context(), nil) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Errorf("client Serve: %v", err)
		}
	})
	wait.WaitFor(t, 10*time.Second, func() error {
		if code, body, _ := s.get(t, "big", "/component-31-with-a-long-name/x"); code != http.StatusOK {
			return fmt.Errorf("tunnel big: %d %s", code, body)
		}
		return nil
	})
	// The client's other connection may still be logging in.
	wait.WaitFor(t, 10*time.Second, func() error {
		if got := s.gate.Anonymous(); got != 0 {
			return fmt.Errorf("%d anonymous connections after the logins, want 0", got)
		}
		return nil
	})
}
