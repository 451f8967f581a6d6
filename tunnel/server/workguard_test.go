package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/fatedier/frp/pkg/proto/wire"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/proxy"
)

// guardedService is a tenant's service behind a work connection's guard,
// with frp's side played by an http.Transport, as frp's vhost is one: each
// dial is a work connection on which frp writes its StartWorkConn first.
type guardedService struct {
	f      *embeddedFRP
	v2     bool
	answer func(n int, req *http.Request, c net.Conn) // answers a connection's nth request
	wg     sync.WaitGroup
	mu     sync.Mutex
	ended  int // connections the guard ended, as the service saw them
}

func (s *guardedService) dial(context.Context, string, string) (net.Conn, error) {
	frpEnd, serviceEnd := net.Pipe()
	s.wg.Go(func() { s.serve(serviceEnd) })
	// As the gate hands frp a work connection: its opening, read, then
	// replayed to frp ahead of the rest, which passes the guard.
	conn, err := replayed(&msg.NewWorkConn{RunID: "run"}, s.v2, s.f.guardWork(frpEnd, s.v2))
	if err != nil {
		return nil, err
	}
	if s.v2 {
		if _, _, err := wire.CheckMagic(conn); err != nil {
			return nil, err
		}
		if _, err := wire.NewConn(conn).ReadFrame(); err != nil {
			return nil, err
		}
	} else if _, err := msg.ReadMsg(conn); err != nil {
		return nil, err
	}
	start := &msg.StartWorkConn{ProxyName: "acme"}
	if s.v2 {
		frame, err := msg.EncodeV2MessageFrame(start)
		if err != nil {
			return nil, err
		}
		if err := wire.NewConn(conn).WriteFrame(frame); err != nil {
			return nil, err
		}
	} else if err := msg.WriteMsg(conn, start); err != nil {
		return nil, err
	}
	return conn, nil
}

// replayed is conn with opening, in frp's v1 or v2 encoding, ahead of what
// conn reads.
func replayed(opening msg.Message, v2 bool, conn net.Conn) (net.Conn, error) {
	var b bytes.Buffer
	if !v2 {
		if err := msg.WriteMsg(&b, opening); err != nil {
			return nil, err
		}
	} else {
		frame, err := msg.EncodeV2MessageFrame(opening)
		if err != nil {
			return nil, err
		}
		if err := wire.WriteMagic(&b); err != nil {
			return nil, err
		}
		if err := wire.NewConn(&b).WriteFrame(frame); err != nil {
			return nil, err
		}
	}
	return &replayConn{Conn: conn, r: io.MultiReader(&b, conn)}, nil
}

// replayConn is a connection whose reads come from r.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (s *guardedService) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	if s.v2 {
		if _, err := wire.NewConn(struct {
			io.Reader
			io.Writer
		}{br, c}).ReadFrame(); err != nil {
			return
		}
	} else if _, err := msg.ReadMsg(br); err != nil {
		return
	}
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			s.mu.Lock()
			s.ended++
			s.mu.Unlock()
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		s.answer(n, req, c)
	}
}

// transport is frp's side.
func (s *guardedService) transport(t *testing.T) *http.Transport {
	tr := &http.Transport{DialContext: s.dial, Proxy: nil}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		s.wg.Wait()
	})
	return tr
}

func roundTrip(t *testing.T, tr *http.Transport, method string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://acme.tunnels.test/", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s: read the body: %v", method, err)
	}
	return res, string(b)
}

func write(c net.Conn, s string) { _, _ = io.WriteString(c, s) }

// TestWorkGuardPassesAnswers: answers within the bounds reach frp as the
// service sent them, over a kept-alive work connection, whatever their
// framing: a HEAD answer's Content-Length announces no body, chunks with
// trailers, 1xx heads (passed on before the final one), no body at all.
func TestWorkGuardPassesAnswers(t *testing.T) {
	for _, v2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("v2=%v", v2), func(t *testing.T) {
			answers := []string{
				"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst",
				"HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\n", // to HEAD
				"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n3;ext=1\r\nchu\r\n3\r\nnks\r\n0\r\nX-Sum: 6\r\n\r\n",
				"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
				"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlast",
			}
			s := &guardedService{f: &embeddedFRP{mark: "mark"}, v2: v2, answer: func(n int, _ *http.Request, c net.Conn) {
				write(c, answers[n])
			}}
			tr := s.transport(t)
			want := []struct {
				method string
				status int
				body   string
			}{
				{http.MethodGet, 200, "first"}, {http.MethodHead, 200, ""}, {http.MethodGet, 200, "chunks"},
				{http.MethodGet, 204, ""}, {http.MethodPost, 200, "last"},
			}
			for i, w := range want {
				res, body := roundTrip(t, tr, w.method)
				if res.StatusCode != w.status || body != w.body {
					t.Fatalf("answer %d: %d %q, want %d %q", i, res.StatusCode, body, w.status, w.body)
				}
				if i == 2 && res.Trailer.Get("X-Sum") != "6" {
					t.Errorf("trailers %v, want X-Sum: 6", res.Trailer)
				}
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.ended != 0 {
				t.Errorf("%d connections ended, want the one kept alive", s.ended)
			}
		})
	}
}

// TestWorkGuardRefusesHeads: a head beyond the bounds, or one that is not
// HTTP, never reaches frp's parser, wherever it comes in the connection's
// life: frp reads the guard's own 502, with its mark, and the connection
// ends. An 8 MiB head is not read beyond the bound.
func TestWorkGuardRefusesHeads(t *testing.T) {
	fields := "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-F: v\r\n", proxy.MaxHeadFields+1) + "\r\n"
	tests := []struct {
		name   string
		before string // answered to an earlier request on the connection
		answer string
		reason string
	}{
		{"too many fields", "", fields, "more than 256 header fields"},
		{"too many bytes", "", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 8<<20), "larger than 64 KiB"},
		{"1xx heads count with the final one", "", "HTTP/1.1 103 Early\r\n" + strings.Repeat("Link: <a>\r\n", 200) + "\r\n" +
			"HTTP/1.1 200 OK\r\n" + strings.Repeat("X-F: v\r\n", 100) + "\r\n", "more than 256 header fields"},
		{"not HTTP", "", "HELLO\r\n\r\n", "not a valid HTTP/1.1 response"},
		{"after a HEAD answer that announced a body", "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", fields, "header fields"},
		{"after chunks", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", fields, "header fields"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var sent int
			s := &guardedService{f: &embeddedFRP{mark: "mark"}, answer: func(n int, _ *http.Request, c net.Conn) {
				if n == 0 && tc.before != "" {
					write(c, tc.before)
					return
				}
				for i := 0; i < len(tc.answer); i += 4096 {
					k, err := io.WriteString(c, tc.answer[i:min(i+4096, len(tc.answer))])
					sent += k
					if err != nil {
						return
					}
				}
			}}
			tr := s.transport(t)
			if tc.before != "" {
				method := http.MethodGet
				if strings.Contains(tc.name, "HEAD") {
					method = http.MethodHead
				}
				if res, _ := roundTrip(t, tr, method); res.StatusCode != http.StatusOK {
					t.Fatalf("the answer before: %d", res.StatusCode)
				}
			}
			res, body := roundTrip(t, tr, http.MethodGet)
			if res.StatusCode != http.StatusBadGateway || res.Header.Get(guardHeader) != "mark" || !strings.Contains(body, tc.reason) {
				t.Fatalf("frp read %d %v %q; want the guard's 502 saying %q", res.StatusCode, res.Header, body, tc.reason)
			}
			tr.CloseIdleConnections()
			s.wg.Wait()
			if sent > 2*proxy.MaxHeadBytes {
				t.Errorf("the guard read %d bytes of the head, want it to stop near %d", sent, proxy.MaxHeadBytes)
			}
		})
	}
}

// TestWorkGuardSwitch: after a protocol switch the request asked for, the
// connection carries other bytes than HTTP, both ways, untouched.
func TestWorkGuardSwitch(t *testing.T) {
	s := &guardedService{f: &embeddedFRP{mark: "mark"}, answer: func(_ int, _ *http.Request, c net.Conn) {
		write(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		// Echo what comes, a line, and then a head no guard would pass.
		line, _ := bufio.NewReader(c).ReadString('\n')
		write(c, line+"HTTP/1.1 200 OK\r\n"+strings.Repeat("X: y\r\n", 1000)+"\r\n")
		c.Close()
	}}
	tr := s.transport(t)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://acme.tunnels.test/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	res, err := tr.RoundTrip(req)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("got %v, %v; want the switch", res, err)
	}
	rwc := res.Body.(io.ReadWriteCloser)
	defer rwc.Close()
	write2 := "GET /not-http\r\n"
	if _, err := io.WriteString(rwc, write2); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rwc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte(write2)) || !bytes.Contains(got, []byte("X: y\r\n")) {
		t.Errorf("after the switch frp read %q, want the service's bytes as they were", got[:min(len(got), 80)])
	}
}

// TestChunkLength: chunk size lines are read as net/http reads them.
func TestChunkLength(t *testing.T) {
	for line, want := range map[string]int64{
		"1a\r": 26, "1A;ext=\"x\"\r": 26, "0\r": 0, "a \t\r": 10, "ffffffffffffffff\r": -1, /* max */
		"\r": -2, "1a": -2, "1\r\r": -2, "x\r": -2, "1a ;ext\r": -2, "10000000000000000\r": -2,
	} {
		n, err := chunkLength([]byte(line))
		switch {
		case want == -2 && err == nil:
			t.Errorf("chunkLength(%q) = %d; want an error", line, n)
		case want == -1 && (err != nil || n != ^uint64(0)):
			t.Errorf("chunkLength(%q) = %d, %v; want the largest length", line, n, err)
		case want >= 0 && (err != nil || n != uint64(want)):
			t.Errorf("chunkLength(%q) = %d, %v; want %d", line, n, err, want)
		}
	}
}

// TestVhostTransportTakesTetherFieldsFromTheGuardOnly: of the answers frp's
// vhost passes on, only the guard's 502, with the server's mark, keeps an
// X-Tether-Error (tether's upstream_bad_response); every other answer,
// whatever it names, loses tether's fields, in its head, its 1xx heads and
// its trailers. A wrong mark is a tenant's guess.
func TestVhostTransportTakesTetherFieldsFromTheGuardOnly(t *testing.T) {
	vhost := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		switch r.URL.Path {
		case "/guard":
			h.Set(guardHeader, r.URL.Query().Get("mark"))
			h.Set("X-Tether-Peer-Miss", "1")
			w.WriteHeader(http.StatusBadGateway)
			return
		case "/early":
			h.Set("X-Tether-Error", "fake")
			w.WriteHeader(http.StatusEarlyHints)
			h.Del("X-Tether-Error")
		}
		h.Set("Trailer", "X-Tether-Trailer")
		h.Set("X-Tether-Error", "tunnel_down")
		h.Set("X-Tether-Peer-Miss", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "down")
		h.Set("X-Tether-Trailer", "x")
	}))
	t.Cleanup(vhost.Close)
	tr := (&embeddedFRP{mark: "server-mark"}).vhostTransport(zap.NewNop())
	t.Cleanup(tr.CloseIdleConnections)
	get := func(path string) (*http.Response, []textproto.MIMEHeader) {
		t.Helper()
		var early []textproto.MIMEHeader
		ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
			early = append(early, h)
			return nil
		}})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, vhost.URL+path, nil)
		res, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(res.Body)
		res.Body.Close()
		return res, early
	}
	res, _ := get("/guard?mark=server-mark")
	if res.StatusCode != http.StatusBadGateway || res.Header.Get(proxy.ErrorHeader) != proxy.CodeUpstreamBadResponse {
		t.Errorf("the guard's answer: %d %v, want 502 %s", res.StatusCode, res.Header, proxy.CodeUpstreamBadResponse)
	}
	if res.Header.Get(guardHeader) != "" || res.Header.Get("X-Tether-Peer-Miss") != "" {
		t.Errorf("the guard's answer keeps %v, want only X-Tether-Error", res.Header)
	}
	for _, path := range []string{"/guard?mark=guess", "/", "/early"} {
		res, early := get(path)
		for _, h := range append([]map[string][]string{res.Header, res.Trailer}, asMaps(early)...) {
			for k := range h {
				if strings.HasPrefix(k, "X-Tether-") {
					t.Errorf("%s: the answer keeps %s", path, k)
				}
			}
		}
	}
}

func asMaps(hs []textproto.MIMEHeader) []map[string][]string {
	out := make([]map[string][]string, len(hs))
	for i, h := range hs {
		out[i] = h
	}
	return out
}
