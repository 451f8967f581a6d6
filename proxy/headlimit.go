package proxy

import (
	"context"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
)

// LimitHeads makes t, a transport that reads answers relayed from tenants
// (frp's vhost for stock frpc clients, another replica), bound response
// heads as the router does: MaxHeadBytes and MaxHeadFields for the heads
// of one exchange, 1xx heads included. http.Transport bounds a head in
// bytes only (MaxResponseHeaderBytes), and each 1xx head on its own when a
// ClientTrace looks at them, as httputil.ReverseProxy's does.
//
// It sets t.MaxResponseHeaderBytes, wraps t.DialContext (nil: a
// net.Dialer) so that each connection counts the heads as they are read,
// and returns the RoundTripper to use in t's place: it tells the
// connection a request carries where its response begins (GotConn). A
// head beyond the bounds fails the round trip with an error for which
// errors.Is(err, ErrBadResponse), and the connection is closed. Call it
// once, before t is used; t stays the one to close idle connections on.
func LimitHeads(t *http.Transport) http.RoundTripper {
	dial := t.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	t.MaxResponseHeaderBytes = MaxHeadBytes
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hc := &headCountingConn{Conn: c}
		hc.heads.start()
		return hc, nil
	}
	return headLimiter{t}
}

// headLimiter is LimitHeads's RoundTripper.
type headLimiter struct{ t *http.Transport }

func (l headLimiter) RoundTrip(req *http.Request) (*http.Response, error) {
	// A trace of its own per request: WithClientTrace chains it to the
	// request's own hooks by changing it.
	trace := &httptrace.ClientTrace{GotConn: expectResponse}
	return l.t.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
}

// expectResponse tells the connection that carries a request that its
// response's heads come next.
func expectResponse(info httptrace.GotConnInfo) {
	if c, ok := info.Conn.(*headCountingConn); ok {
		c.expect.Store(true)
	}
}

// headCountingConn counts the response heads read from it. http.Transport
// reads a connection from one goroutine, which may be waiting in Read as
// the next request takes the connection: that request's mark (expect) is
// taken up by the read, before it looks at the bytes.
type headCountingConn struct {
	net.Conn
	expect atomic.Bool
	heads  headCount // the read's own
}

func (c *headCountingConn) Read(p []byte) (int, error) {
	if c.heads.err != nil {
		return 0, c.heads.err
	}
	n, err := c.Conn.Read(p)
	if c.expect.Swap(false) {
		c.heads.start()
	}
	if herr := c.heads.read(p[:n]); herr != nil {
		return 0, herr
	}
	return n, err
}

// DropTetherFields deletes tether's own fields (X-Tether-*) from h, an
// answer's header or trailer that came from a tenant, as the router drops
// them: a tenant's would pass for tether's.
func DropTetherFields(h map[string][]string) {
	for k := range h {
		if tetherField(k) {
			delete(h, k)
		}
	}
}

// BadResponseMessage is the answer's text for err, an ErrBadResponse, from
// whoever sent it (e.g. "the tunnel's service"): the caller learns what
// was wrong, never the bytes that were.
func BadResponseMessage(from string, err error) string {
	return "tether: " + from + " sent an answer tether does not pass on: " + badResponseReason(err)
}
