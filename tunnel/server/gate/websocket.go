package gate

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/websocket"

	"github.com/tether-dev/tether/tunnel"
)

// acceptWebsocket completes the wss upgrade of one TLS connection (frp's
// websocket transport: binary frames at tunnel.WebsocketPath) and returns the
// websocket as a net.Conn. Networks that let only HTTPS out still reach the
// tunnel this way.
func acceptWebsocket(conn net.Conn, log *zap.Logger) (net.Conn, error) {
	// The handler hands the websocket over on accepted, unbuffered, so that
	// either this function takes it or the handler learns through gaveUp
	// that nobody will, and closes it: an upgrade that completes as the
	// timer fires must not leave a handler waiting forever.
	accepted := make(chan net.Conn)
	gaveUp := make(chan struct{})
	defer close(gaveUp)
	mux := http.NewServeMux()
	mux.Handle(tunnel.WebsocketPath, websocket.Server{
		// The tunnel is not a browser API: any Origin may connect, and the
		// JWT login decides who gets in.
		Handshake: func(*websocket.Config, *http.Request) error { return nil },
		Handler: func(ws *websocket.Conn) {
			ws.PayloadType = websocket.BinaryFrame
			c := &wsConn{Conn: ws, remote: conn.RemoteAddr(), done: make(chan struct{})}
			select {
			case accepted <- c:
				// x/net/websocket closes the connection when the handler
				// returns, so it returns only once the session is done.
				<-c.done
			case <-gaveUp:
				_ = c.Close()
			}
		},
	})
	// Anything else is a person (or `tether diagnose`, reading the Date
	// header for the clock check) looking at the tunnel port.
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "tether tunnel server: tunnel clients connect here (TLS, or wss at "+tunnel.WebsocketPath+
			"); requests for tunnels go to the HTTP entry at <tunnel>.<domain>", http.StatusNotFound)
	})
	ln := &oneConnListener{conn: &closeNotifyConn{Conn: conn, closed: make(chan struct{})}}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: HandshakeTimeout,
		// Before login every byte a client makes the server hold counts
		// against it (see limits.go); an upgrade request needs a few
		// hundred bytes, net/http's default would allow 1 MB.
		MaxHeaderBytes: maxUpgradeHeaderBytes,
		ErrorLog:       zap.NewStdLog(log.Named("wss")),
	}
	go func() { _ = srv.Serve(ln) }() // returns after its one connection; the handler outlives it
	timer := time.NewTimer(HandshakeTimeout)
	defer timer.Stop()
	select {
	case c := <-accepted:
		return c, nil
	case <-ln.conn.closed:
		return nil, fmt.Errorf("wss upgrade refused: the request was not a websocket upgrade to %s", tunnel.WebsocketPath)
	case <-timer.C:
		_ = conn.Close()
		return nil, errors.New("wss upgrade timed out")
	}
}

// maxUpgradeHeaderBytes bounds the header of the wss upgrade request.
const maxUpgradeHeaderBytes = 8 << 10

// wsConn is a server-side websocket whose RemoteAddr is the client's address
// (x/net/websocket reports the Origin instead).
type wsConn struct {
	*websocket.Conn
	remote net.Addr
	done   chan struct{}
	once   sync.Once
}

func (c *wsConn) RemoteAddr() net.Addr { return c.remote }

func (c *wsConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// oneConnListener yields one connection, then reports closed.
type oneConnListener struct {
	conn *closeNotifyConn
	once sync.Once
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.conn })
	if c != nil {
		return c, nil
	}
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// closeNotifyConn closes a channel when the connection is closed.
type closeNotifyConn struct {
	net.Conn
	closed chan struct{}
	once   sync.Once
}

func (c *closeNotifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}
