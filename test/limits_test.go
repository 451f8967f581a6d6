package test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	frputil "github.com/fatedier/frp/pkg/util/util"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel"
)

// The server's limits, as tunnel/server/limits.go sets them.
const (
	maxAnonymousPerIP   = 64
	maxClientStreams    = 256
	loginBudget         = 32 << 10
	anonymousConnMemory = 160 << 10 // the most one anonymous connection may hold
)

// procMemory reads a field of /proc/<pid>/status (VmRSS, VmHWM), in bytes.
func procMemory(t testing.TB, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status %s: %v", pid, field, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// sourceAddrs are n loopback addresses, each in a /24 of its own, so that
// only the per-address caps apply to them.
func sourceAddrs(first, n int) []string {
	var s []string
	for i := range n {
		s = append(s, fmt.Sprintf("127.0.%d.1", first+i))
	}
	return s
}

// An anonymous flood against the server binary: connections that hold
// what the limits allow, from 8 addresses, each beyond its per-address cap,
// and connections that open thousands of streams announcing 64 KiB frames.
// The server's memory grows by what the caps allow, no more; the rule
// breakers are closed at once; a tunnel keeps being served throughout.
func TestAnonymousFloodAgainstTheServer(t *testing.T) {
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	be := newBackend(t, "alpha", nil)
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + be.url()}})
	watch := srv.watch("alpha", "alpha")
	defer watch.stop()
	watch.check(t, "before the flood")

	pid := srv.cmd.Process.Pid
	before := procMemory(t, pid, "VmRSS")
	const sources, perSource = 8, maxAnonymousPerIP + 16
	held := sources * maxAnonymousPerIP
	// The heap may grow to twice what is live before a collection, and
	// the runtime keeps some slack.
	bound := 2*int64(held)*anonymousConnMemory + 32<<20

	ctx := t.Context()
	hold := testutil.Flood{Addr: srv.tunnelAddr, Sources: sourceAddrs(2, sources), PerSource: perSource,
		Attack: testutil.AttackHelloFrame, Budget: loginBudget}.Start(ctx)
	defer hold.Close()
	streams := testutil.Flood{Addr: srv.tunnelAddr, Sources: sourceAddrs(2+sources, 2), PerSource: 8,
		Attack: testutil.AttackStreams, Streams: 5000}.Start(ctx)
	defer streams.Close()

	testutil.WaitFor(t, 30*time.Second, func() error {
		if grown := procMemory(t, pid, "VmRSS") - before; grown > bound {
			t.Fatalf("the server's RSS grew by %d MiB under the flood, want at most %d MiB", grown>>20, bound>>20)
		}
		if r := streams.Report(); r.Open > 0 || r.Failed > 0 {
			return fmt.Errorf("stream flood: %+v", r)
		}
		if r := hold.Report(); r.Open != held {
			return fmt.Errorf("holding flood: %d open, want %d: %+v", r.Open, held, r)
		}
		if n := srv.metric(t, "tether_anonymous_connections"); n != float64(held) {
			return fmt.Errorf("tether_anonymous_connections = %v, want %d", n, held)
		}
		return nil
	})
	peak := procMemory(t, pid, "VmHWM") - before
	t.Logf("RSS before the flood %d MiB; peak growth %d MiB with %d anonymous connections held (bound %d MiB); stream flood closed within %v",
		before>>20, peak>>20, held, bound>>20, streams.Report().SlowestClose)
	if peak > bound {
		t.Errorf("the server's peak RSS grew by %d MiB, want at most %d MiB", peak>>20, bound>>20)
	}
	if got, want := srv.metric(t, "tether_connections_refused_total", "reason", "anonymous_per_ip"), float64(sources*(perSource-maxAnonymousPerIP)); got != want {
		t.Errorf("tether_connections_refused_total{reason=anonymous_per_ip} = %v, want %v", got, want)
	}
	if r := streams.Report(); r.SlowestClose > 5*time.Second {
		t.Errorf("a connection opening thousands of streams lived %v, want it closed at once", r.SlowestClose)
	}
	watch.check(t, "during the flood")

	hold.Close()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if n := srv.metric(t, "tether_anonymous_connections"); n != 0 {
			return fmt.Errorf("tether_anonymous_connections = %v after the flood, want 0", n)
		}
		return nil
	})
	t.Logf("RSS after the flood: %d MiB", procMemory(t, pid, "VmRSS")>>20)
	watch.check(t, "after the flood")
}

// rawSession is a hostile tunnel client speaking frp over the server's
// TLS and yamux by hand.
type rawSession struct {
	t   testing.TB
	mux *yamux.Session
}

func dialRawSession(t testing.TB, s *server) *rawSession {
	t.Helper()
	conn, err := (&tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}}).DialContext(t.Context(), "tcp", s.tunnelAddr) //nolint:gosec // a hostile client does not verify
	if err != nil {
		t.Fatal(err)
	}
	mux, err := yamux.Client(conn, tunnel.MuxConfig(15*time.Second, zap.NewNop()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mux.Close() })
	return &rawSession{t: t, mux: mux}
}

// login logs in with token, as a stock frpc would, and fails the test if
// the server refuses.
func (r *rawSession) login(token string) {
	r.t.Helper()
	stream, err := r.mux.OpenStream()
	if err != nil {
		r.t.Fatal(err)
	}
	now := time.Now().Unix()
	if err := msg.WriteMsg(stream, &msg.Login{Version: "0.71.0", Timestamp: now, PrivilegeKey: frputil.GetAuthKey("", now),
		Metas: map[string]string{"token": token}}); err != nil {
		r.t.Fatal(err)
	}
	_ = stream.SetReadDeadline(time.Now().Add(30 * time.Second))
	var resp msg.LoginResp
	if err := msg.ReadMsgInto(stream, &resp); err != nil {
		r.t.Fatalf("read the login answer: %v", err)
	}
	if resp.Error != "" {
		r.t.Fatalf("login refused: %s", resp.Error)
	}
}

// closedWithin fails the test unless the server ends the session within d.
func (r *rawSession) closedWithin(d time.Duration) {
	r.t.Helper()
	select {
	case <-r.mux.CloseChan():
	case <-time.After(d):
		r.t.Fatalf("the server did not close the session within %v", d)
	}
}

// Streams are capped: one before the login is verified, and
// maxClientStreams at once after. A session over its cap is closed and
// counted; another tunnel is not disturbed.
func TestStreamCapsAgainstTheServer(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	be := newBackend(t, "alpha", nil)
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + be.url()}})
	watch := srv.watch("alpha", "alpha")
	defer watch.stop()

	t.Run("before login", func(t *testing.T) {
		r := dialRawSession(t, srv)
		if _, err := r.mux.OpenStream(); err != nil {
			t.Fatal(err)
		}
		_, _ = r.mux.OpenStream() // may see the session end already
		r.closedWithin(10 * time.Second)
		testutil.WaitFor(t, 10*time.Second, func() error {
			if got := srv.metric(t, "tether_sessions_closed_by_limit_total", "limit", "stream_before_login"); got != 1 {
				return fmt.Errorf("tether_sessions_closed_by_limit_total{limit=stream_before_login} = %v, want 1", got)
			}
			return nil
		})
	})

	t.Run("after login", func(t *testing.T) {
		r := dialRawSession(t, srv)
		r.login(k.issue(t, "beta", time.Hour))
		for i := range maxClientStreams { // with the control stream, one too many
			if _, err := r.mux.OpenStream(); err != nil && i < maxClientStreams-1 {
				t.Fatalf("stream %d: %v", i, err)
			}
		}
		r.closedWithin(10 * time.Second)
		testutil.WaitFor(t, 10*time.Second, func() error {
			if got := srv.metric(t, "tether_sessions_closed_by_limit_total", "limit", "streams"); got != 1 {
				return fmt.Errorf("tether_sessions_closed_by_limit_total{limit=streams} = %v, want 1", got)
			}
			return nil
		})
	})
	watch.check(t, "while sessions went over their stream caps")
	if _, ok := srv.tunnels(t)["beta"]; ok {
		t.Error("tunnel beta is still connected after its session went over the stream cap")
	}
}
