package server

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/proxy"
)

// cutAnswerService answers every request with head, then closes the
// connection: an answer that breaks off before its body's first byte.
func cutAnswerService(t testing.TB, ln net.Listener, head string) {
	t.Helper()
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, head)
			}()
		}
	}()
}

// cutHead is an answer's head that promises a body.
const cutHead = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nSet-Cookie: upstream=1\r\n\r\n"

// getCut asks for /cut on tunnel name and returns the answer, or fails the
// test when the connection closed without one.
func getCut(t testing.TB, s *testServer, name string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.entry+"/cut", nil)
	req.Host = name + "." + testDomain
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("an answer broken off before its body: the caller got no answer at all (%v); want tether's 502", err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// A replica that sends a forwarded answer's head and dies before its body:
// the caller gets 502 replica_unreachable from the replica it reached.
func TestForwardedAnswerCutBeforeBodyAnswers502(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	// b is a replica of the fleet (its certificate made from the same
	// secret) that holds the tunnel, answers with a head and dies.
	bln, err := tls.Listen("tcp", "127.0.0.1:0", a.srv.peerTLS.serverConfig())
	if err != nil {
		t.Fatal(err)
	}
	cutAnswerService(t, bln, cutHead)
	f.replica("b", bln.Addr().String()).Hold("cut")
	res := getCut(t, a, "cut")
	if res.StatusCode != http.StatusBadGateway || res.Header.Get(proxy.ErrorHeader) != "replica_unreachable" {
		t.Errorf("got %s %q; want 502 replica_unreachable", res.Status, res.Header.Get(proxy.ErrorHeader))
	}
	body, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(body), "went away") || res.Header.Get("Set-Cookie") != "" {
		t.Errorf("got %q with Set-Cookie %q; want tether's own answer", body, res.Header.Get("Set-Cookie"))
	}
}

// An answer that began is cut short, not replaced: the caller reads its
// head and the bytes that came, then an unexpected end.
func TestForwardedAnswerCutInItsBodyIsCutShort(t *testing.T) {
	f, k := newFleet(), newKeys(t)
	a := startReplica(t, f, k, "a")
	bln, err := tls.Listen("tcp", "127.0.0.1:0", a.srv.peerTLS.serverConfig())
	if err != nil {
		t.Fatal(err)
	}
	cutAnswerService(t, bln, cutHead+"first bytes")
	f.replica("b", bln.Addr().String()).Hold("cut")
	res := getCut(t, a, "cut")
	body, err := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || string(body) != "first bytes" || err == nil {
		t.Errorf("got %s, body %q, read error %v; want the 200, the bytes that came, then an error", res.Status, body, err)
	}
}
