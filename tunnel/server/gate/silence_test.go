package gate

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel"
)

// freezableConn is a client's connection whose reads stop while it is
// frozen, as when the client's node freezes or a NAT drops the path: what
// the server sends waits unread, and nothing is answered, pings included.
type freezableConn struct {
	net.Conn
	closed    chan struct{}
	closeOnce sync.Once
	parked    atomic.Int32 // reads waiting for the thaw

	mu     sync.Mutex
	thawed chan struct{} // closed while reads go through
}

func newFreezableConn(c net.Conn) *freezableConn {
	thawed := make(chan struct{})
	close(thawed)
	return &freezableConn{Conn: c, closed: make(chan struct{}), thawed: thawed}
}

func (c *freezableConn) freeze() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.thawed = make(chan struct{})
}

func (c *freezableConn) thaw() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.thawed:
	default:
		close(c.thawed)
	}
}

func (c *freezableConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	thawed := c.thawed
	c.mu.Unlock()
	select {
	case <-thawed:
	default:
		c.parked.Add(1)
		select {
		case <-thawed:
		case <-c.closed:
			return 0, net.ErrClosed
		}
		c.parked.Add(-1)
	}
	return c.Conn.Read(p)
}

func (c *freezableConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// dialFreezable is a raw client whose connection can be frozen.
func dialFreezable(t *testing.T, addr string) (*rawClient, *freezableConn) {
	t.Helper()
	conn := newFreezableConn(dialTLSFrom(t, addr, "127.0.0.1"))
	mux, err := yamux.Client(conn, tunnel.MuxConfig(15*time.Second, zap.NewNop()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mux.Close() })
	return &rawClient{t: t, mux: mux}, conn
}

// freezeWhileSent freezes conn, has send write to the client, and waits
// until the client's reader is stuck behind the freeze: the one read that
// may have been under way took part of what was sent, and nothing after it
// is read.
func freezeWhileSent(t *testing.T, conn *freezableConn, send func()) {
	t.Helper()
	conn.freeze()
	send()
	testutil.WaitFor(t, 10*time.Second, func() error {
		if conn.parked.Load() == 0 {
			return errors.New("the client's reader is not held by the freeze")
		}
		return nil
	})
}

// When a client stops answering while something written to it awaits an
// answer (here frp asks a stock frpc for a work connection), the host hears
// that the session went silent within SilenceBound + SilencePing, long
// before the heartbeat timeout, and the session turns suspect. The gate
// does not close it: that is the host's call (it closes the session when
// its tunnel has others). A client that answers again is served on the
// same session.
func TestSilentClientIsReportedAndLeftOpen(t *testing.T) {
	t.Parallel()
	g := serveWithHost(t) // a heartbeat timeout of a minute
	c, conn := dialFreezable(t, g.addr)
	sess, control, clientControl := g.logIn(t, c, "alpha", "alpha.r1", true)

	freezeWhileSent(t, conn, func() {
		if err := msg.WriteMsg(control, &msg.ReqWorkConn{}); err != nil {
			t.Fatal(err)
		}
	})
	testutil.WaitFor(t, 10*time.Second, func() error {
		if g.host.silentCalls(sess) == 0 {
			return errors.New("the host has not heard that the session went silent")
		}
		return nil
	})
	if !sess.Alive() || sess.CloseReason() != "" {
		t.Fatalf("the gate closed the silent session (%q); want it left to the host", sess.CloseReason())
	}
	if !sess.Suspect(time.Now()) {
		t.Error("the silent session is not suspect")
	}
	if _, ok := g.Session(sess.ID()); !ok {
		t.Error("the gate no longer lists the silent session")
	}

	conn.thaw()
	var req msg.ReqWorkConn
	if err := readAnswer(clientControl, &req); err != nil {
		t.Fatalf("the client, answering again, reads frp's request: %v", err)
	}
	if err := msg.WriteMsg(clientControl, &msg.Ping{}); err != nil {
		t.Fatal(err)
	}
	var ping msg.Ping
	if err := readAnswer(control, &ping); err != nil {
		t.Fatalf("frp reads the client's next message on the session: %v", err)
	}
	if !sess.Alive() || len(g.host.endedCalls(sess)) != 0 {
		t.Errorf("the session ended (%q), want it serving", sess.CloseReason())
	}
	if r := g.obs.reports(); len(r) != 0 {
		t.Errorf("the observer was told %v, want nothing", r)
	}
}

// The heartbeat is the gate's own: of two quiet clients of one gate, the
// one that stops answering is closed within the heartbeat timeout of its
// last word, and the host hears it ended, while the one that answers the
// gate's ping is left open. An idle tether client's session awaits
// nothing, so neither is reported silent.
func TestHeartbeatClosesOnlyAClientThatStopsAnswering(t *testing.T) {
	t.Parallel()
	g := serveWithHost(t, func(c *Config) { c.HeartbeatTimeout = 3 * time.Second }) // the shortest allowed
	answers, _, _ := g.logIn(t, dialRawFrom(t, g.addr, "127.0.0.1"), "alpha", "alpha.r1", false)
	inBefore, _ := answers.Traffic()
	c, conn := dialFreezable(t, g.addr)
	frozen, control, _ := g.logIn(t, c, "beta", "beta.r1", false)
	freezeWhileSent(t, conn, func() {
		if err := msg.WriteMsg(control, &msg.Pong{}); err != nil {
			t.Fatal(err)
		}
	})

	g.host.waitEnded(t, frozen)
	if got, want := frozen.CloseReason(), "connection lost: "+describeEnd(yamux.ErrKeepAliveTimeout); got != want {
		t.Errorf("close reason %q, want %q", got, want)
	}
	conn.thaw()
	waitClosed(t, c.mux.CloseChan(), "the connection of the client that stopped answering")

	// The other was as quiet for longer: the gate pinged it too, and is
	// done with the ping.
	testutil.WaitFor(t, 10*time.Second, func() error {
		if in, _ := answers.Traffic(); in-inBefore < muxHeaderSize || answers.beat.pinging.Load() {
			return fmt.Errorf("%d bytes read from the client that answers since its login, want its answer to a ping", in-inBefore)
		}
		return nil
	})
	if !answers.Alive() || answers.CloseReason() != "" || len(g.host.endedCalls(answers)) != 0 {
		t.Errorf("the session of the client that answers closed (%q), want it open", answers.CloseReason())
	}
	for _, sess := range []*Session{answers, frozen} {
		if n := g.host.silentCalls(sess); n != 0 {
			t.Errorf("an idle session of tunnel %s was reported silent %d times, want never", sess.Tunnel(), n)
		}
	}
}
