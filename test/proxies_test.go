package test

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeHost is a name only the test's egress proxies resolve (to 127.0.0.1):
// a client that reaches the server by this name went through a proxy.
const fakeHost = "tunnel.test"

func resolveFake(hostport string) string {
	host, port, err := net.SplitHostPort(hostport)
	if err == nil && host == fakeHost {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return hostport
}

// connTracker closes the connections an egress proxy holds when the test
// ends.
type connTracker struct {
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func (c *connTracker) add(conns ...net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conns = append(c.conns, conns...)
}

func (c *connTracker) closeAll() {
	c.mu.Lock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// splice copies between a and b until either side ends.
func splice(a io.ReadWriteCloser, aReader io.Reader, b io.ReadWriteCloser) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, aReader); done <- struct{}{} }()
	go func() { _, _ = io.Copy(a, b); done <- struct{}{} }()
	<-done
	_ = a.Close()
	_ = b.Close()
	<-done
}

// connectProxy is an HTTP CONNECT proxy that requires basic auth.
type connectProxy struct {
	ln             net.Listener
	user, password string
	tunnels        atomic.Int64 // CONNECTs it granted
	refused        atomic.Int64 // CONNECTs refused for missing or wrong credentials
	mu             sync.Mutex
	targets        []string
	conns          connTracker
}

func newConnectProxy(t testing.TB, user, password string) *connectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connectProxy{ln: ln, user: user, password: password}
	srv := &http.Server{Handler: p}
	p.conns.wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() {
		_ = srv.Close()
		p.conns.closeAll()
	})
	return p
}

// url is the proxy's URL with the given credentials.
func (p *connectProxy) url(user, password string) string {
	return fmt.Sprintf("http://%s:%s@%s", user, password, p.ln.Addr())
}

func (p *connectProxy) targetList() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.targets...)
}

func (p *connectProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "this proxy only tunnels (CONNECT)", http.StatusMethodNotAllowed)
		return
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.user+":"+p.password))
	if r.Header.Get("Proxy-Authorization") != want {
		p.refused.Add(1)
		w.Header().Set("Proxy-Authenticate", `Basic realm="e2e"`)
		http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
		return
	}
	upstream, err := net.Dial("tcp", resolveFake(r.Host))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		_ = upstream.Close()
		return
	}
	p.conns.add(conn, upstream)
	p.mu.Lock()
	p.targets = append(p.targets, r.Host)
	p.mu.Unlock()
	p.tunnels.Add(1)
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		_ = conn.Close()
		_ = upstream.Close()
		return
	}
	p.conns.wg.Go(func() { splice(conn, rw.Reader, upstream) })
}

// socksProxy is a minimal SOCKS5 server (RFC 1928, CONNECT only), with
// username/password authentication (RFC 1929) when user is set.
type socksProxy struct {
	ln             net.Listener
	user, password string
	tunnels        atomic.Int64
	mu             sync.Mutex
	targets        []string
	conns          connTracker
}

func newSOCKSProxy(t testing.TB, user, password string) *socksProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &socksProxy{ln: ln, user: user, password: password}
	p.conns.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns.add(c)
			p.conns.wg.Go(func() {
				if err := p.handle(c); err != nil {
					_ = c.Close()
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.conns.closeAll()
	})
	return p
}

func (p *socksProxy) addr() string { return p.ln.Addr().String() }

func (p *socksProxy) targetList() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.targets...)
}

func (p *socksProxy) handle(c net.Conn) error {
	br := bufio.NewReader(c)
	var head [2]byte
	if _, err := io.ReadFull(br, head[:]); err != nil || head[0] != 5 {
		return errors.New("not SOCKS5")
	}
	methods := make([]byte, head[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return err
	}
	method := byte(0x00)
	if p.user != "" {
		method = 0x02
	}
	offered := false
	for _, m := range methods {
		offered = offered || m == method
	}
	if !offered {
		_, _ = c.Write([]byte{5, 0xff})
		return errors.New("no acceptable method")
	}
	if _, err := c.Write([]byte{5, method}); err != nil {
		return err
	}
	if method == 0x02 {
		readField := func() (string, error) {
			n, err := br.ReadByte()
			if err != nil {
				return "", err
			}
			b := make([]byte, n)
			_, err = io.ReadFull(br, b)
			return string(b), err
		}
		if v, err := br.ReadByte(); err != nil || v != 1 {
			return errors.New("bad auth version")
		}
		user, err := readField()
		if err != nil {
			return err
		}
		pass, err := readField()
		if err != nil {
			return err
		}
		if user != p.user || pass != p.password {
			_, _ = c.Write([]byte{1, 1})
			return errors.New("bad credentials")
		}
		if _, err := c.Write([]byte{1, 0}); err != nil {
			return err
		}
	}
	var req [4]byte
	if _, err := io.ReadFull(br, req[:]); err != nil || req[0] != 5 || req[1] != 1 {
		return errors.New("not a CONNECT request")
	}
	var host string
	switch req[3] {
	case 1:
		var ip [4]byte
		if _, err := io.ReadFull(br, ip[:]); err != nil {
			return err
		}
		host = net.IP(ip[:]).String()
	case 3:
		n, err := br.ReadByte()
		if err != nil {
			return err
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return err
		}
		host = string(b)
	case 4:
		var ip [16]byte
		if _, err := io.ReadFull(br, ip[:]); err != nil {
			return err
		}
		host = net.IP(ip[:]).String()
	default:
		return errors.New("bad address type")
	}
	var port [2]byte
	if _, err := io.ReadFull(br, port[:]); err != nil {
		return err
	}
	target := net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(port[:]))))
	upstream, err := net.Dial("tcp", resolveFake(target))
	if err != nil {
		_, _ = c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return err
	}
	p.conns.add(upstream)
	if _, err := c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0}); err != nil {
		_ = upstream.Close()
		return err
	}
	p.mu.Lock()
	p.targets = append(p.targets, target)
	p.mu.Unlock()
	p.tunnels.Add(1)
	splice(c, br, upstream)
	return nil
}

// TestStockFRPCsShareATunnel: two stock frpc processes serve one tunnel side
// by side, each with a proxy name of its own (frp's proxy names are unique
// on a server): the server puts both routes in the tunnel's load-balancing
// group, and requests reach both backends.
func TestStockFRPCsShareATunnel(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	token := k.issue(t, "gamma", time.Hour)
	backends := []*backend{newBackend(t, "gamma-1", nil), newBackend(t, "gamma-2", nil)}
	for i, b := range backends {
		startFRPC(t, fmt.Sprintf("frpc gamma %d", i+1), frpcConfig(srv, token, fmt.Sprintf(`
user = "gamma"
[[proxies]]
name = "web-%d"
type = "http"
subdomain = "gamma"
localIP = "127.0.0.1"
localPort = %d
`, i+1, b.port())))
	}
	for _, b := range backends {
		srv.waitServedBy(t, "gamma", b.name, readyTimeout)
	}
	if n := len(srv.sessions(t)); n != 2 {
		t.Errorf("server lists %d sessions, want the two frpc", n)
	}
}
