package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	wait "github.com/tether-dev/tether/internal/testutil"
)

// dialEntry opens a TCP connection to the public entry, closed when the
// test ends. A connection the server reset before the dial returned is
// nil.
func dialEntry(t testing.TB, s *testServer) net.Conn { return dialEntryFrom(t, s, "127.0.0.1") }

// dialEntryFrom is dialEntry from the local address src.
func dialEntryFrom(t testing.TB, s *testServer, src string) net.Conn {
	t.Helper()
	return wait.DialRefusable(t, strings.TrimPrefix(s.entry, "http://"), src)
}

// waitingCount is the number of connections waiting for a request.
func (c *connSlots) waitingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for conn := c.waiting.front(); conn != nil; conn = conn.links[allSources].next {
		n++
	}
	return n
}

func (s *testServer) waitEntryConns(t testing.TB, want int) {
	t.Helper()
	waitCount(t, "entry connections open", s.entryConns.count, want)
}

// The public entry holds at most MaxHTTPConnections connections, websockets
// included; with none of them waiting for a request, one more is closed at
// accept and counted, and the ones it holds are not disturbed. A slot comes
// back when its connection closes, hijacked or not.
func TestEntryConnectionCap(t *testing.T) {
	const limit = 4
	s := startServer(t, func(c *Config) { c.MaxHTTPConnections = limit })
	s.startClient(t, "alpha", upgradeEcho(t).URL)
	if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
		t.Fatalf("alpha: %d %s", code, body)
	}
	http.DefaultClient.CloseIdleConnections()
	s.waitEntryConns(t, 0)

	ws := upgrade(t, s.entry, "alpha")
	defer ws.Close()
	for range limit - 1 {
		// Part of a head: held until ReadHeaderTimeout, and not waiting.
		if _, err := io.WriteString(dialEntry(t, s), "GET / HTTP/1.1\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	s.waitEntryConns(t, limit)
	waitCount(t, "entry connections waiting for a request", s.entryConns.waitingCount, 0)

	refused := s.refusedConns(entryCapLabels.refused)
	if err := wait.ClosedByServer(dialEntry(t, s), 5*time.Second); err != nil {
		t.Errorf("a connection beyond --max-http-connections: %v; want it closed at once", err)
	}
	if got := s.refusedConns(entryCapLabels.refused) - refused; got != 1 {
		t.Errorf("tether_connections_refused_total{reason=http_connections} rose by %v, want 1", got)
	}
	ws.echo(t, "still here") // the connections held are not disturbed

	_ = ws.Close()
	s.waitEntryConns(t, limit-1)
	if code, body, _ := s.get(t, "alpha", "/"); code != http.StatusOK {
		t.Errorf("alpha once a websocket closed and gave its slot back: %d %s", code, body)
	}
}

// A request head larger than maxEntryHeaderBytes, or with more than
// maxEntryHeadLines lines, gets 431 and nothing else happens; one within
// both reaches the tunnel, headers and all. A body is not a head, however
// many lines it has, on a connection that is kept alive too.
func TestEntryHeaderLimit(t *testing.T) {
	s := startServer(t)
	s.startClient(t, "alpha", headerEcho(t, "alpha").URL)
	start := "GET / HTTP/1.1\r\nHost: alpha." + testDomain + "\r\n"
	for _, tc := range []struct {
		name   string
		fields string
		want   int
	}{
		{"too many bytes", "X-Big: " + strings.Repeat("a", maxEntryHeaderBytes+8<<10) + "\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"bytes within the limit", "X-Big: " + strings.Repeat("a", maxEntryHeaderBytes-4<<10) + "\r\n", http.StatusOK},
		{"too many lines", headerFields(maxEntryHeadLines, 0), http.StatusRequestHeaderFieldsTooLarge},
		{"lines within the limit", headerFields(maxEntryHeadLines-3, 0), http.StatusOK},
	} {
		res, body := rawExchange(t, s.entry, start+tc.fields+"Connection: close\r\n\r\n")
		if res.StatusCode != tc.want {
			t.Errorf("%s: %d %.100q, want %d", tc.name, res.StatusCode, body, tc.want)
		}
		if tc.want == http.StatusOK && !strings.Contains(body, `"backend":"alpha"`) {
			t.Errorf("%s: %.100q, want alpha's answer", tc.name, body)
		}
	}

	// Two POSTs on one connection, each body 4,000 lines, the second sent
	// with its head in one write.
	c := dialEntry(t, s)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	body := strings.Repeat("line\n", 4000)
	for i := range 2 {
		post := "POST /hook HTTP/1.1\r\nHost: alpha." + testDomain + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		if _, err := io.WriteString(c, post); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("POST %d with a body of 4,000 lines: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("POST %d with a body of 4,000 lines: %d, want 200", i, res.StatusCode)
		}
	}
}

// A flood of connections that send request heads as slowly as the
// timeouts allow holds at most entryConnMemory per connection the cap
// admits; the rest are closed at accept. Every slot comes back.
func TestEntryFloodMemory(t *testing.T) {
	const limit, conns = 128, 192
	s := startServer(t, func(c *Config) { c.MaxHTTPConnections = limit })
	s.startClient(t, "alpha", backend(t, "alpha").URL)
	http.DefaultClient.CloseIdleConnections()
	start := "GET / HTTP/1.1\r\nHost: alpha." + testDomain + "\r\n"
	budget := maxEntryHeaderBytes - len(start) - 64
	lines := maxEntryHeadLines - 2 // the request line and Host are two
	attacks := []struct {
		name string
		head string
	}{
		{"idle", ""},
		// One header line that never ends: textproto grows a slice for it.
		{"long line", start + "X-Long: " + strings.Repeat("a", budget)},
		// As many header fields as allowed, filling the budget, the last
		// unfinished: a key, a value and a map entry for each.
		{"many fields", start + headerFields(lines-1, (budget-20)/(lines-1)) + "X-Last: b"},
		// As many short fields as allowed, then a line filling the budget.
		{"short fields, long line", start + headerFields(lines-1, 0) + "X-Long: " + strings.Repeat("a", budget-lines*8)},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			s.waitEntryConns(t, 0)
			before := serverMemory()
			refused := s.refusedConns(entryCapLabels.refused) + s.refusedConns(entryCapLabels.evicted)
			var held []net.Conn
			for range conns {
				if c := dialEntry(t, s); c != nil {
					_, _ = io.WriteString(c, a.head) // a refused one may fail
					held = append(held, c)
				}
			}
			// Connections that wait for a request (all of the idle
			// attack's, the others' until their head is read) are evicted
			// by the newer ones; the rest are refused.
			wait.WaitFor(t, 10*time.Second, func() error {
				r := s.refusedConns(entryCapLabels.refused) + s.refusedConns(entryCapLabels.evicted) - refused
				if n := s.entryConns.count(); n != limit || r != conns-limit {
					return fmt.Errorf("%d entry connections held, %v refused or evicted; want %d and %d", n, r, limit, conns-limit)
				}
				return nil
			})
			// The server reads what was sent as it arrives: wait until its
			// memory stops growing.
			last := serverMemory()
			wait.WaitFor(t, 10*time.Second, func() error {
				m := serverMemory()
				defer func() { last = m }()
				if m > last+limit<<10 {
					return fmt.Errorf("memory still growing: %d KiB → %d KiB", last>>10, m>>10)
				}
				return nil
			})
			growth := int64(last) - int64(before) //nolint:gosec // memory sizes fit
			t.Logf("%d connections held: %d KiB more in use, %d KiB each", limit, growth>>10, growth/limit>>10)
			if bound := int64(limit * entryConnMemory); growth > bound {
				t.Errorf("%d entry connections hold %d KiB, want at most %d KiB (%d KiB each)", limit, growth>>10, bound>>10, entryConnMemory>>10)
			}
			for _, c := range held {
				_ = c.Close()
			}
		})
	}
	s.waitEntryConns(t, 0)
	if code, body, _ := s.get(t, "alpha", "/x"); code != http.StatusOK {
		t.Errorf("tunnel alpha after the floods: %d %s", code, body)
	}
}

// headerFields is n header fields with distinct names and values of size
// bytes, one per line.
func headerFields(n, size int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X%x: %s\r\n", i, strings.Repeat("v", size))
	}
	return b.String()
}

// headLinesOf is what headLines reads, the plain way: the non-blank lines
// of the head, up to the first blank line after the request line, and
// whether its header lines (the request line is not one) name both
// Content-Length and Transfer-Encoding.
func headLinesOf(b []byte) (lines int, ended, ambiguous bool) {
	var cl, te bool
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if !bytes.HasSuffix(line, []byte("\n")) {
			break // not ended yet
		}
		switch blank := len(line) <= 2 && (len(line) == 1 || line[0] == '\r'); {
		case blank && lines > 0:
			return lines, true, cl && te
		case !blank:
			if lines > 0 {
				name, _, _ := strings.Cut(strings.ToLower(string(line)), ":")
				cl = cl || name == "content-length" && strings.Contains(string(line), ":")
				te = te || name == "transfer-encoding" && strings.Contains(string(line), ":")
			}
			lines++
		}
	}
	return lines, false, false
}

// However a head arrives, in one read or byte by byte, headLines counts its
// lines as headLinesOf does, stops at its end, and refuses it exactly when
// it has more than max lines, or, at its end, both framing headers.
func FuzzHeadLines(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\nbody\nbody\n"), uint8(3), uint8(2))
	f.Add([]byte("\r\n\nGET / HTTP/1.1\nA: b\nC: d\n\n"), uint8(1), uint8(1))
	f.Add([]byte("GET / HTTP/1.1\r\nA: b\r\nA: b\r\nA: b\r"), uint8(5), uint8(2))
	f.Add([]byte("POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), uint8(4), uint8(8))
	f.Add([]byte("POST / HTTP/1.1\r\ntransfer-ENCODING:chunked\r\nX: y\r\ncontent-length:0\r\n\r\n"), uint8(0), uint8(8))
	f.Add([]byte("POST /content-length: HTTP/1.1\r\nX-Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"), uint8(6), uint8(8))
	f.Fuzz(func(t *testing.T, head []byte, split, maxLines uint8) {
		h := headLines{max: int(maxLines)}
		h.start()
		answer := headOK
		for rest := head; len(rest) > 0 && h.reading.Load() && answer == headOK; {
			n := min(len(rest), int(split)+1)
			answer = h.scan(rest[:n])
			rest = rest[n:]
		}
		lines, ended, ambiguous := headLinesOf(head)
		tooMany := answer == headTooManyLines
		if want := lines > int(maxLines); tooMany != want {
			t.Fatalf("%q (max %d, pieces of %d): refused %v, want %v (%d lines)", head, maxLines, int(split)+1, tooMany, want, lines)
		}
		if tooMany {
			return
		}
		if h.reading.Load() == ended {
			t.Fatalf("%q: still reading %v, want %v (head ended %v)", head, h.reading.Load(), !ended, ended)
		}
		if !ended && h.lines != lines {
			t.Fatalf("%q: counted %d lines, want %d", head, h.lines, lines)
		}
		if got := answer == headAmbiguousLength; got != ambiguous {
			t.Fatalf("%q (pieces of %d): refused for both framing headers %v, want %v", head, int(split)+1, got, ambiguous)
		}
	})
}

// A drain closes at once the connections that never sent a byte, whose
// callers opened them in advance (Go's HTTP server would wait 5 s for
// each), while a request in flight still finishes.
func TestDrainClosesUnusedConnections(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	s := startServer(t, func(c *Config) { c.ShutdownTimeout = 20 * time.Second })
	s.startClient(t, "alpha", newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "done")
	})).URL)
	http.DefaultClient.CloseIdleConnections()
	s.waitEntryConns(t, 0)

	slow := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, s.entry+"/slow", nil)
		req.Host = "alpha." + testDomain
		res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			slow <- err.Error()
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		slow <- fmt.Sprintf("%d %s", res.StatusCode, b)
	}()
	<-arrived
	unused := dialEntry(t, s)
	s.waitEntryConns(t, 2)

	stopped := make(chan struct{})
	go func() { s.stop(); close(stopped) }()
	if err := wait.ClosedByServer(unused, 3*time.Second); err != nil {
		t.Errorf("a connection that never sent a byte, during the drain: %v; want it closed at once", err)
	}
	select {
	case <-stopped:
		t.Fatal("the drain ended with a request in flight")
	default:
	}
	close(release)
	if got := <-slow; got != "200 done" {
		t.Errorf("the request in flight during the drain: %s, want 200 done", got)
	}
	<-stopped
}
