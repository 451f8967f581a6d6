package test

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestWSS: the tunnel also runs as a TLS websocket (for networks that let
// only HTTPS out), from a tether client and from a stock frpc.
func TestWSS(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	alpha := newBackend(t, "alpha", nil)
	gamma := newBackend(t, "gamma", nil)
	startClient(t, srv, clientOpts{
		tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)),
		routes:    []string{"/=" + alpha.url()},
		args:      []string{"--transport", "wss"},
	})
	startFRPC(t, "frpc gamma wss", frpcConfig(srv, k.issue(t, "gamma", time.Hour),
		"transport.protocol = \"wss\"\n"+frpcHTTPProxy("gamma", gamma)))

	srv.waitServedBy(t, "alpha", "alpha", readyTimeout)
	srv.waitServedBy(t, "gamma", "gamma", readyTimeout)
	list := srv.tunnels(t)
	for _, name := range []string{"alpha", "gamma"} {
		if got := list[name].Transport; got != "wss" {
			t.Errorf("%s: transport %q, want wss", name, got)
		}
	}
}

// TestEgressProxies: the client reaches the server through an HTTP CONNECT
// proxy with basic auth or a SOCKS5 proxy, given by --proxy or by
// HTTPS_PROXY with NO_PROXY. The server is named tunnel.test, a name only
// the test's proxies resolve, so a client that got through used the proxy.
func TestEgressProxies(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	b := newBackend(t, "backend", nil)
	token := writeToken(t, k.issue(t, "alpha", time.Hour))
	viaFake := net.JoinHostPort(fakeHost, srv.tunnelPort())
	const password = "pw-5d0e7c1b9a"

	// Each subtest runs its own client of the one tunnel, so they run one
	// after the other.
	run := func(t *testing.T, o clientOpts) *client {
		o.tokenFile = token
		o.routes = []string{"/=" + b.url()}
		return startClient(t, srv, o)
	}

	t.Run("HTTP CONNECT proxy with basic auth, --proxy", func(t *testing.T) {
		p := newConnectProxy(t, "tether", password)
		c := run(t, clientOpts{server: viaFake, args: []string{"--proxy", p.url("tether", password)}})
		srv.waitServedBy(t, "alpha", "backend", 10*time.Second)
		if p.tunnels.Load() < 1 || !slices.Contains(p.targetList(), viaFake) {
			t.Errorf("proxy granted %d tunnels to %v; want one to %s", p.tunnels.Load(), p.targetList(), viaFake)
		}
		st, err := c.status()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(st.Via, "proxy") || strings.Contains(st.Via, password) {
			t.Errorf("/status via = %q, want the proxy, without its password", st.Via)
		}
		assertNoSecret(t, "the proxy password", password, c.proc)
	})

	t.Run("HTTP CONNECT proxy with a wrong password", func(t *testing.T) {
		p := newConnectProxy(t, "tether", password)
		const wrong = "wrong-3f9b2c7e11"
		c := run(t, clientOpts{server: viaFake, args: []string{"--proxy", p.url("tether", wrong)}, noWait: true})
		testutil.WaitFor(t, 20*time.Second, func() error {
			st, err := c.status()
			if err != nil {
				return err
			}
			if !strings.Contains(st.LastError, "407") || !strings.Contains(st.LastError, "refused the user and password") {
				return fmt.Errorf("/status last_error = %q, want it to say the proxy refused the user and password (407)", st.LastError)
			}
			if strings.Contains(st.LastError, wrong) {
				t.Errorf("/status last_error shows the proxy password: %q", st.LastError)
			}
			return nil
		})
		if p.refused.Load() < 1 || p.tunnels.Load() != 0 {
			t.Errorf("proxy refused %d and granted %d tunnels; want refusals only", p.refused.Load(), p.tunnels.Load())
		}
		if code, _, _ := c.readyz(); code == 200 {
			t.Errorf("client ready without a way to the server")
		}
		assertNoSecret(t, "the proxy password", wrong, c.proc)
		c.stop()
	})

	t.Run("SOCKS5 proxy, --proxy socks5h", func(t *testing.T) {
		p := newSOCKSProxy(t, "", "")
		run(t, clientOpts{server: viaFake, args: []string{"--proxy", "socks5h://" + p.addr()}})
		srv.waitServedBy(t, "alpha", "backend", 10*time.Second)
		if !slices.Contains(p.targetList(), viaFake) {
			t.Errorf("SOCKS5 proxy connected to %v; want %s (resolved by the proxy)", p.targetList(), viaFake)
		}
	})

	t.Run("SOCKS5 proxy with username and password, --proxy socks5", func(t *testing.T) {
		p := newSOCKSProxy(t, "tether", password)
		c := run(t, clientOpts{args: []string{"--proxy", "socks5://tether:" + password + "@" + p.addr()}})
		srv.waitServedBy(t, "alpha", "backend", 10*time.Second)
		if !slices.Contains(p.targetList(), srv.tunnelAddr) {
			t.Errorf("SOCKS5 proxy connected to %v; want %s", p.targetList(), srv.tunnelAddr)
		}
		assertNoSecret(t, "the proxy password", password, c.proc)
	})

	t.Run("HTTPS_PROXY from the environment", func(t *testing.T) {
		p := newConnectProxy(t, "tether", password)
		run(t, clientOpts{server: viaFake, env: []string{"HTTPS_PROXY=" + p.url("tether", password)}})
		srv.waitServedBy(t, "alpha", "backend", 10*time.Second)
		if !slices.Contains(p.targetList(), viaFake) {
			t.Errorf("proxy tunnelled to %v; want %s", p.targetList(), viaFake)
		}
	})

	t.Run("lower-case https_proxy and ALL_PROXY", func(t *testing.T) {
		for _, name := range []string{"https_proxy", "ALL_PROXY"} {
			p := newConnectProxy(t, "tether", password)
			c := run(t, clientOpts{server: viaFake, env: []string{name + "=" + p.url("tether", password)}})
			srv.waitServedBy(t, "alpha", "backend", 10*time.Second)
			if !slices.Contains(p.targetList(), viaFake) {
				t.Errorf("%s: proxy tunnelled to %v; want %s", name, p.targetList(), viaFake)
			}
			c.stop()
		}
	})

	t.Run("NO_PROXY exempts the server", func(t *testing.T) {
		p := newConnectProxy(t, "tether", password)
		c := run(t, clientOpts{
			server: viaFake, noWait: true,
			env:  []string{"HTTPS_PROXY=" + p.url("tether", password), "NO_PROXY=example.com," + fakeHost},
			args: []string{"--dial-timeout", "2s"},
		})
		// Dialled directly, tunnel.test does not resolve: the client fails
		// on its own, and the proxy never sees it.
		waitDirectDialFailed(t, c)
		if n := p.tunnels.Load() + p.refused.Load(); n != 0 {
			t.Errorf("proxy got %d CONNECTs; want none, NO_PROXY names the server", n)
		}
		c.stop()
	})

	t.Run("loopback server is never proxied from the environment", func(t *testing.T) {
		p := newConnectProxy(t, "tether", password)
		run(t, clientOpts{env: []string{"HTTPS_PROXY=" + p.url("tether", password)}})
		srv.waitServedBy(t, "alpha", "backend", 10*time.Second)
		if n := p.tunnels.Load() + p.refused.Load(); n != 0 {
			t.Errorf("proxy got %d CONNECTs for a loopback server; want none", n)
		}
	})

	t.Run("--proxy direct ignores the environment", func(t *testing.T) {
		p := newConnectProxy(t, "tether", password)
		c := run(t, clientOpts{
			server: viaFake, noWait: true,
			env:  []string{"HTTPS_PROXY=" + p.url("tether", password)},
			args: []string{"--proxy", "direct", "--dial-timeout", "2s"},
		})
		waitDirectDialFailed(t, c)
		if n := p.tunnels.Load() + p.refused.Load(); n != 0 {
			t.Errorf("proxy got %d CONNECTs; want none with --proxy direct", n)
		}
		c.stop()
	})
}

// waitDirectDialFailed waits until the client reports that it dialled
// fakeHost itself, not through a proxy, and failed: the name resolves only
// in the test's proxies.
func waitDirectDialFailed(t *testing.T, c *client) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, func() error {
		st, err := c.status()
		if err != nil {
			return err
		}
		if !strings.Contains(st.LastError, fakeHost) || strings.Contains(st.LastError, "proxy") {
			return fmt.Errorf("/status last_error = %q, want a direct dial of %s that failed", st.LastError, fakeHost)
		}
		return nil
	})
}
