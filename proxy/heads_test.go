package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// goHeadsEnd reads data as http.Transport reads an exchange's heads (1xx
// heads, then the final one) and returns where the final head ends, its
// raw lines beyond status lines, and whether Go's parser accepted them.
func goHeadsEnd(data []byte) (end, fields int, ok bool) {
	r := bytes.NewReader(data)
	br := bufio.NewReader(r)
	for range maxInformational + 2 {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			return 0, 0, false
		}
		if res.StatusCode < 100 || res.StatusCode > 199 || res.StatusCode == http.StatusSwitchingProtocols {
			end = len(data) - r.Len() - br.Buffered()
			for _, line := range strings.SplitAfter(string(data[:end]), "\n") {
				if l := strings.TrimRight(line, "\r\n"); l != "" && !strings.HasPrefix(l, "HTTP/") {
					fields++
				}
			}
			return end, fields, true
		}
	}
	return 0, 0, false
}

// scanHeads runs a HeadScanner over data in pieces of size step and
// returns where it found the final head's end, or its error.
func scanHeads(data []byte, step int) (int, error) {
	var s HeadScanner
	pos := 0
	for pos < len(data) && !s.Done() {
		piece := data[pos:min(pos+step, len(data))]
		for len(piece) > 0 && !s.Done() {
			k, ended, err := s.Scan(piece)
			if err != nil {
				return 0, err
			}
			if k == 0 && !ended {
				return 0, errors.New("Scan took nothing")
			}
			piece = piece[k:]
			pos += k
		}
	}
	if !s.Done() {
		return -1, nil
	}
	return pos, nil
}

func TestHeadScanner(t *testing.T) {
	tests := []struct {
		name string
		data string
		end  int // -1: not ended
		err  error
	}{
		{"one head", "HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody", 25, nil},
		{"bare LF", "HTTP/1.1 200 OK\nA: b\n\nbody", 22, nil},
		{"1xx heads before the final one", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nLink: x\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", 75, nil},
		{"101 is final", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", 56, nil},
		{"spaces before the code", "HTTP/1.1    100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", 47, nil},
		{"a CR before the line's end is no blank line", "HTTP/1.1 200 OK\r\nA: b\r\r\n\r\n", 26, nil},
		{"no end yet", "HTTP/1.1 200 OK\r\nA: b\r\n", -1, nil},
		{"too many fields", "HTTP/1.1 200 OK\r\n" + strings.Repeat("A: b\r\n", MaxHeadFields+1) + "\r\n", 0, errHeadFields},
		{"too many bytes", "HTTP/1.1 200 OK\r\nA: " + strings.Repeat("b", MaxHeadBytes) + "\r\n\r\n", 0, errHeadBytes},
		{"1xx fields count with the final head's", "HTTP/1.1 103 Early\r\n" + strings.Repeat("A: b\r\n", MaxHeadFields/2+1) + "\r\n" +
			"HTTP/1.1 200 OK\r\n" + strings.Repeat("A: b\r\n", MaxHeadFields/2) + "\r\n", 0, errHeadFields},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, step := range []int{1, 2, 7, len(tc.data)} {
				end, err := scanHeads([]byte(tc.data), step)
				if !errors.Is(err, tc.err) || err == nil && end != tc.end {
					t.Errorf("in pieces of %d: end %d, error %v; want %d, %v", step, end, err, tc.end, tc.err)
				}
			}
			if goEnd, _, ok := goHeadsEnd([]byte(tc.data)); ok && tc.err == nil && tc.end >= 0 && goEnd != tc.end {
				t.Errorf("net/http ends the heads at %d, the test expects %d", goEnd, tc.end)
			}
		})
	}
}

// FuzzHeadScanner checks the HeadScanner against net/http's parser, which
// reads the heads after it: wherever Go accepts heads within the bounds,
// the scanner ends them where Go does, in whatever pieces the bytes come;
// it refuses only heads beyond the bounds.
func FuzzHeadScanner(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"HTTP/1.0 200 OK\nA: b\n continued\n\n",
		"HTTP/1.1  199 x\r\n\r\nHTTP/1.1 200\r\n\r\n",
		"HTTP/1.1 100\r\r\n\r\n",
		"\r\n",
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		end, err := scanHeads(data, int(step)+1)
		goEnd, fields, ok := goHeadsEnd(data)
		if !ok {
			return // Go fails the exchange: the scanner may say anything
		}
		within := goEnd <= MaxHeadBytes && fields <= MaxHeadFields
		switch {
		case err != nil && within:
			t.Fatalf("the scanner refused heads net/http accepts within the bounds (%d bytes, %d lines): %v", goEnd, fields, err)
		case err == nil && end != goEnd:
			t.Fatalf("the scanner ends the heads at %d, net/http at %d", end, goEnd)
		case err == nil && !within:
			t.Fatalf("the scanner accepted heads beyond the bounds (%d bytes, %d lines)", goEnd, fields)
		}
	})
}

// FuzzUpstreamAnswer sends whatever an upstream may answer through the
// transport: it never panics or hangs, never passes on heads beyond the
// bounds, and the next request, on whatever connection the transport
// keeps, gets its own answer, never bytes of the first.
func FuzzUpstreamAnswer(f *testing.F) {
	for _, s := range []string{
		okResponse,
		okResponse + extraResponse,
		"HTTP/1.1 101 Switching Protocols\r\n\r\n" + extraResponse,
		"HTTP/1.1 204 No Content\r\n\r\n" + extraResponse,
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n\r\n" + extraResponse,
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
		"garbage",
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, answer []byte, head bool) {
		up := newPipeUpstream(t, func(c *upstreamConn) {
			for {
				req, _, err := c.readRequest()
				if err != nil {
					return
				}
				reply := answer
				if req.URL.Path == "/next" {
					reply = []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
				}
				if _, err := c.Write(reply); err != nil {
					return
				}
			}
		})
		tr := up.transport(t)
		defer tr.closeIdle()
		method := http.MethodGet
		if head {
			method = http.MethodHead
		}
		// An answer that stops short waits until the caller gives up.
		first, cancelFirst := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancelFirst()
		req, err := http.NewRequestWithContext(first, method, "http://up/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		if res, err := tr.roundTrip(req, 0, nil); err == nil {
			size := 0
			for k, vv := range res.Header {
				size += len(k)
				for _, v := range vv {
					size += len(v)
				}
			}
			if size > MaxHeadBytes || len(res.Header) > MaxHeadFields {
				t.Fatalf("passed on a head of %d bytes and %d fields", size, len(res.Header))
			}
			if res.StatusCode != http.StatusSwitchingProtocols {
				_, _ = io.Copy(io.Discard, res.Body)
			}
			res.Body.Close()
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		next, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://up/next", nil)
		if err != nil {
			t.Fatal(err)
		}
		res, body, err := fetch(t, tr, next)
		if err != nil || body != "fresh" {
			t.Fatalf("the next request got %v %q, %v; want its own answer", res, body, err)
		}
	})
}
