package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/proxy"
)

// A session that dies after the upstream's response head reached the server,
// before its body did (a client killed between the two writes of its
// upstream), still leaves the caller an answer: 502 tunnel_disconnected,
// not a connection closed without a word. The server held the head unsent
// (an answer with a Content-Length is not flushed before its body), so
// nothing of the upstream's answer had reached the caller.
func TestSessionDeathBetweenHeadAndBodyAnswers502(t *testing.T) {
	s := startServer(t)
	// A head long enough that the client's pings and window updates cannot
	// be mistaken for it as it arrives.
	res, conn := cutUnderResponse(t, s, strings.Repeat("p", 2<<10), "", 5)
	defer conn.Close()
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusBadGateway || res.Header.Get(proxy.ErrorHeader) != "tunnel_disconnected" {
		t.Errorf("got %d %s %q, want 502 tunnel_disconnected", res.StatusCode, res.Header.Get(proxy.ErrorHeader), body)
	}
	if c := res.Header.Get("Set-Cookie"); c != "" {
		t.Errorf("tether's own 502 carries the upstream's Set-Cookie %q", c)
	}
}

// A session that dies in the middle of a response body the server still
// held unsent leaves the caller the response cut short: its head and what
// came of the body, then the connection closed. Aborted with nothing of it
// sent, the caller would have had no answer at all.
func TestSessionDeathMidBodyCutsTheResponseShort(t *testing.T) {
	s := startServer(t)
	part := strings.Repeat("b", 2<<10)
	res, conn := cutUnderResponse(t, s, "", part, 2*len(part))
	defer conn.Close()
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK || string(body) != part || err == nil {
		t.Errorf("got %d with %d bytes of body and %v; want 200, the %d bytes sent, and the body cut short", res.StatusCode, len(body), err, len(part))
	}
}

// cutUnderResponse sends a GET for a tunnel whose client reaches the server
// through a relay, and whose upstream answers 200 with a head padded with
// pad, a Content-Length of length and the first bytes part of its body, and
// then nothing more. Once the server has read those, the relay is cut, as
// a client killed -9 leaves it. It returns what the caller read, and the
// caller's connection.
func cutUnderResponse(t *testing.T, s *testServer, pad, part string, length int) (*http.Response, net.Conn) {
	t.Helper()
	sent := make(chan struct{})
	be := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/cut" {
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(length))
		w.Header().Set("Set-Cookie", "session=upstream-secret")
		if pad != "" {
			w.Header().Set("X-Pad", pad)
		}
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, part)
		w.(http.Flusher).Flush()
		close(sent)
		<-r.Context().Done() // the rest never comes
	}))
	r := newRelay(t, s.tunnel)
	s.runClient(t, "alpha", r.addr(), 1, be.URL)
	sess := s.waitSessions(t, "alpha", 1)[0].sess

	conn, err := net.Dial("tcp", strings.TrimPrefix(s.entry, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := sess.Traffic()
	if _, err := fmt.Fprintf(conn, "GET /cut HTTP/1.1\r\nHost: alpha.%s\r\n\r\n", testDomain); err != nil {
		t.Fatal(err)
	}
	<-sent
	testutil.WaitFor(t, 10*time.Second, func() error {
		in, _ := sess.Traffic()
		if got, want := in-before, uint64(len(pad)+len(part)); got < want {
			return fmt.Errorf("the server read %d bytes of the session since the request, want %d", got, want)
		}
		return nil
	})
	r.cut()

	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		_ = conn.Close()
		t.Fatalf("the caller got no answer: %v", err)
	}
	return res, conn
}
