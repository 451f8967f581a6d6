package gate

import (
	"bufio"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel"
)

// An upgrade that completes just as the handshake times out leaves nothing
// behind: either the caller gets the websocket, or the upgrade is undone.
// synctest.Test fails when a goroutine of the bubble is still blocked once
// the test function has returned.
func TestWebsocketUpgradeAtTheDeadlineLeaksNothing(t *testing.T) {
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			server, client := net.Pipe()
			type result struct {
				conn net.Conn
				err  error
			}
			accepted := make(chan result, 1)
			go func() {
				c, err := acceptWebsocket(server, zap.NewNop())
				accepted <- result{c, err}
			}()
			req, _ := http.NewRequest(http.MethodGet, "http://tunnel.test"+tunnel.WebsocketPath, nil)
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Origin", "http://tunnel.test")
			if err := req.Write(client); err != nil {
				t.Fatal(err)
			}
			// The server's answer is read exactly when its handshake
			// times out.
			time.Sleep(HandshakeTimeout)
			if resp, err := http.ReadResponse(bufio.NewReader(client), req); err == nil {
				resp.Body.Close()
			}
			r := <-accepted
			// The caller hangs up first: net.Pipe has no buffer, so the
			// close frame the websocket writes on Close would otherwise
			// wait for a reader that never comes.
			_ = client.Close()
			if r.err == nil {
				_ = r.conn.Close()
			}
			_ = server.Close()
		})
	}
}
