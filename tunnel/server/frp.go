package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	v1 "github.com/fatedier/frp/pkg/config/v1"
	frpserver "github.com/fatedier/frp/server"

	"github.com/tether-dev/tether/tunnel"
)

// embeddedFRP is the frp server inside tether: it runs the control protocol
// (login, proxies, work connections) on the streams the gate admits, and its
// HTTP vhost on a loopback port, through which stock frpc clients are
// reached. It never accepts client connections itself.
type embeddedFRP struct {
	svc       *frpserver.Service
	vhostAddr string // 127.0.0.1:port of frp's HTTP vhost
	conns     *tunnel.ConnListener
	done      chan struct{} // closed when frp stops taking streams
}

// startFRP starts frp with the auth plugin at pluginURL and feeds it the
// streams of conns. frp listens on a port of its own (its vhost shares it),
// so a free loopback port is picked; a lost race for it is retried.
func startFRP(domain, pluginAddr, pluginPath string, ops []string, conns *tunnel.ConnListener) (*embeddedFRP, error) {
	var lastErr error
	for range 5 {
		port, err := freeLoopbackPort()
		if err != nil {
			return nil, err
		}
		cfg := &v1.ServerConfig{
			BindAddr:      "127.0.0.1",
			BindPort:      port,
			ProxyBindAddr: "127.0.0.1",
			VhostHTTPPort: port,
			SubDomainHost: domain,
			Transport: v1.ServerTransportConfig{
				// The gate owns TLS and multiplexing; frp sees single streams.
				TCPMux: new(false),
				// yamux keepalives on the gate's sessions detect dead clients.
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
		svc, err := frpserver.NewService(cfg)
		if err != nil {
			lastErr = err
			continue
		}
		f := &embeddedFRP{
			svc: svc, vhostAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			conns: conns, done: make(chan struct{}),
		}
		go func() {
			defer close(f.done)
			svc.HandleListener(conns, false)
		}()
		return f, nil
	}
	return nil, fmt.Errorf("start embedded frp server: %w", lastErr)
}

// Close stops frp: no more streams, every control closed.
func (f *embeddedFRP) Close() {
	_ = f.conns.Close()
	<-f.done
	_ = f.svc.Close()
}

// transport is the HTTP transport to frp's vhost, for stock frpc tunnels.
func (f *embeddedFRP) transport() *http.Transport {
	return &http.Transport{
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

func freeLoopbackPort() (int, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free loopback port for the embedded frp server: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// randomPath returns an unguessable URL path for the in-process auth plugin,
// so that no other local process can feed it requests.
func randomPath() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "/tether-auth/" + hex.EncodeToString(b)
}
