package server

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http/httpguts"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
)

// A stock frpc's answers reach frp's HTTP vhost on its work connections,
// and frp parses them with Go's default bound on a response head, 10 MiB,
// which frp does not let tether set: one answer with an 8 MiB head made
// the server hold 384 MiB. The work connection passes through the gate
// before frp has it, and the gate has the server wrap it (gate.Host's
// WorkConn, guardWork): the tenant's answers
// are followed through their HTTP/1.1 framing, and each head is held back
// until it has ended within proxy.MaxHeadBytes and proxy.MaxHeadFields. A
// head beyond them never reaches frp: frp reads a 502 of tether's instead,
// with the guard's mark, and the connection ends. The auth plugin refuses
// the stock proxies whose work connections frp would encrypt or compress,
// which would hide the answers from the guard (the tunnel is TLS anyway).
//
// frp writes its StartWorkConn message on the connection, then the
// requests of its vhost's http.Transport, one at a time; the guard follows
// them too, for the methods that decide how the answers are framed (HEAD).
// A protocol switch (101 to an upgrade the request asked for, 2xx to a
// CONNECT) ends the following: the bytes are no longer HTTP.
//
// The guard is the server's, not the gate's, although it wraps a stream
// the gate admitted: it reads HTTP with the router's bounds and head
// scanner (package proxy) and the entry's (maxEntryHeaderBytes), and its
// mark is shared with frp's vhost transport (frp.go). The gate moves
// bytes and frp messages and imports no HTTP code.

// guardHeader carries the guard's mark in the 502 it answers for a tenant:
// the vhost transport takes an answer with the mark for tether's, and
// drops X-Tether-* from every other answer. The mark is random per server
// and never leaves it, so a tenant cannot forge it.
const guardHeader = "X-Tether-Guard"

// maxGuardedRequestHead bounds a request head frp writes: the public
// entry's bound plus the headers frp's vhost adds. Beyond it the guard
// cannot follow frp's requests and ends the connection.
const maxGuardedRequestHead = 2*maxEntryHeaderBytes + 16<<10

// guardWork wraps a stock frpc's work connection, whose opening the gate
// read, for frp (see above): what follows the opening is read through the
// guard, and frp writes through it. v2 tells frp's wire protocol, which
// frames the message frp writes first.
func (f *embeddedFRP) guardWork(stream net.Conn, v2 bool) net.Conn {
	g := &workGuard{Conn: stream, mark: f.mark, msgHeader: tunnel.MessageHeaderSize, reqPhase: phaseMessage}
	if v2 {
		g.msgHeader = tunnel.FrameHeaderSize
	}
	return g
}

// workGuard is a work connection as frp reads and writes it.
type workGuard struct {
	// Static after guardWork.
	net.Conn // the stream
	mark     string

	// The requests frp writes, followed by its writing goroutine.
	msgHeader int         // bytes of the header of frp's first message
	reqPhase  phase       // phaseMessage until frp's message has gone
	reqBuf    []byte      // the message's header, then a request head
	reqLeft   int64       // bytes left of the message, or of a body
	reqChunks chunkedBody // a chunked request body

	// The answers, followed by frp's reading goroutine.
	resPhase  phase
	heads     proxy.HeadScanner
	head      []byte // the head being read, held back
	resLeft   int64  // bytes left of a body of known length
	resChunks chunkedBody
	out       []byte // released for frp and not read yet: heads, and what followed them
	readErr   error  // what Read returns once out is read

	// Shared by both sides.
	mu       sync.Mutex
	methods  []string // of the requests still waiting for their final answer, oldest first
	switched atomic.Bool
}

// phase is where a side stands in its message.
type phase uint8

const (
	phaseHead    phase = iota // a head; for requests, frp's first message before it
	phaseMessage              // frp's first message
	phaseLength               // a body of known length
	phaseChunked              // a chunked body
	phaseRaw                  // no HTTP to follow: a body that ends with the connection, or a switch
)

// Write follows frp's request, then writes it.
func (g *workGuard) Write(p []byte) (int, error) {
	if !g.switched.Load() {
		if err := g.followRequests(p); err != nil {
			g.end()
			return 0, fmt.Errorf("follow frp's request on a stock frpc's work connection: %w", err)
		}
	}
	return g.Conn.Write(p)
}

func (g *workGuard) followRequests(p []byte) error {
	for len(p) > 0 {
		switch g.reqPhase {
		case phaseMessage:
			n := g.followMessage(p)
			p = p[n:]
		case phaseHead:
			n, err := g.followRequestHead(p)
			if err != nil {
				return err
			}
			p = p[n:]
		case phaseLength:
			n := int(min(g.reqLeft, int64(len(p))))
			g.reqLeft -= int64(n)
			p = p[n:]
			if g.reqLeft == 0 {
				g.reqPhase = phaseHead
			}
		case phaseChunked:
			n, end, err := g.reqChunks.follow(p)
			if err != nil {
				return err
			}
			p = p[n:]
			if end {
				g.reqPhase = phaseHead
			}
		case phaseRaw:
			return nil
		}
	}
	return nil
}

// followMessage follows frp's first message: its header, which says its
// length, then its body.
func (g *workGuard) followMessage(p []byte) int {
	if g.msgHeader > 0 {
		n := min(g.msgHeader-len(g.reqBuf), len(p))
		g.reqBuf = append(g.reqBuf, p[:n]...)
		if len(g.reqBuf) < g.msgHeader {
			return n
		}
		if g.msgHeader == tunnel.FrameHeaderSize {
			g.reqLeft = int64(binary.BigEndian.Uint32(g.reqBuf[4:8]))
		} else {
			g.reqLeft = int64(binary.BigEndian.Uint64(g.reqBuf[1:9])) //nolint:gosec // frp's own length
		}
		g.msgHeader = 0
		g.reqBuf = g.reqBuf[:0]
		if g.reqLeft <= 0 {
			g.reqPhase = phaseHead
		}
		return n
	}
	n := int(min(g.reqLeft, int64(len(p))))
	if g.reqLeft -= int64(n); g.reqLeft == 0 {
		g.reqPhase = phaseHead
	}
	return n
}

var headEnd = []byte("\r\n\r\n")

// followRequestHead gathers a request head (Go's transport ends its lines
// with CRLF), and once it has ended notes its method and how its body is
// framed. It returns how many bytes of p it took.
func (g *workGuard) followRequestHead(p []byte) (int, error) {
	from := max(0, len(g.reqBuf)-len(headEnd)+1)
	g.reqBuf = append(g.reqBuf, p...)
	i := bytes.Index(g.reqBuf[from:], headEnd)
	if i < 0 {
		if len(g.reqBuf) > maxGuardedRequestHead {
			return 0, fmt.Errorf("a request head longer than %d bytes", maxGuardedRequestHead)
		}
		return len(p), nil
	}
	end := from + i + len(headEnd)
	taken := len(p) - (len(g.reqBuf) - end)
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(g.reqBuf[:end])))
	g.reqBuf = g.reqBuf[:0]
	if err != nil {
		return 0, fmt.Errorf("parse frp's request: %w", err)
	}
	g.mu.Lock()
	g.methods = append(g.methods, req.Method)
	g.mu.Unlock()
	switch {
	case chunked(req.TransferEncoding):
		g.reqPhase, g.reqChunks = phaseChunked, chunkedBody{}
	case req.ContentLength > 0:
		g.reqPhase, g.reqLeft = phaseLength, req.ContentLength
	}
	return taken, nil
}

// Read returns the tenant's answers as far as they passed.
func (g *workGuard) Read(p []byte) (int, error) {
	for {
		if len(g.out) > 0 {
			n := copy(p, g.out)
			if g.out = g.out[n:]; len(g.out) == 0 {
				g.out = nil
			}
			return n, nil
		}
		if g.readErr != nil {
			return 0, g.readErr
		}
		n, err := g.Conn.Read(p)
		k := g.followAnswers(p[:n])
		if err != nil && g.readErr == nil {
			g.readErr = err
		}
		if k > 0 {
			return k, nil
		}
	}
}

// followAnswers follows p, the next bytes of the answers, and returns how
// many of its first bytes pass as they are; what follows a held head goes
// to out once the head has passed.
func (g *workGuard) followAnswers(p []byte) int {
	passed := 0
	inPlace := true
	for len(p) > 0 && g.readErr == nil {
		if g.resPhase == phaseHead {
			n, ended, err := g.heads.Scan(p)
			g.head = append(g.head, p[:n]...)
			p, inPlace = p[n:], false
			if err == nil && ended {
				err = g.headEnded()
			}
			if err != nil {
				g.refuse(err)
			}
			continue
		}
		n, err := g.followBody(p)
		if inPlace {
			passed += n
		} else {
			g.out = append(g.out, p[:n]...)
		}
		p = p[n:]
		if err != nil {
			g.readErr = fmt.Errorf("the tunnel's service broke the framing of its answer: %w", err)
			g.end()
		}
	}
	return passed
}

// followBody takes the bytes of p that belong to the body being read.
func (g *workGuard) followBody(p []byte) (int, error) {
	switch g.resPhase {
	case phaseLength:
		n := int(min(g.resLeft, int64(len(p))))
		if g.resLeft -= int64(n); g.resLeft == 0 {
			g.nextAnswer()
		}
		return n, nil
	case phaseChunked:
		n, end, err := g.resChunks.follow(p)
		if end {
			g.nextAnswer()
		}
		return n, err
	default:
		return len(p), nil
	}
}

// headEnded decides about the head that just ended: a 1xx head passes at
// once and another follows; a final one is parsed as frp will parse it, to
// learn how its body is framed, and passes.
func (g *workGuard) headEnded() error {
	if g.heads.Done() {
		method := http.MethodGet // for an answer to no request, which frp refuses
		g.mu.Lock()
		if len(g.methods) > 0 {
			method = g.methods[0]
			g.methods = g.methods[1:]
		}
		g.mu.Unlock()
		res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(g.head)), &http.Request{Method: method})
		if err != nil {
			return err
		}
		_ = res.Body.Close() // a reader of the head alone: nothing to read
		switch {
		case res.StatusCode == http.StatusSwitchingProtocols && switchHeader(res.Header),
			method == http.MethodConnect && res.StatusCode/100 == 2:
			g.switched.Store(true)
			g.resPhase = phaseRaw
		case res.Body == http.NoBody:
			g.nextAnswer()
		case chunked(res.TransferEncoding):
			g.resPhase, g.resChunks = phaseChunked, chunkedBody{}
		case res.ContentLength > 0:
			g.resPhase, g.resLeft = phaseLength, res.ContentLength
		default:
			g.resPhase = phaseRaw // until the connection ends
		}
	}
	g.out = append(g.out, g.head...)
	g.head = g.head[:0]
	return nil
}

// nextAnswer readies the answer side for the next answer's heads.
func (g *workGuard) nextAnswer() {
	g.resPhase = phaseHead
	g.heads.Reset()
}

// refuse answers frp, in place of the tenant's answer, with tether's 502
// and the guard's mark, and ends the connection: the tenant's head beyond
// the bounds, or not HTTP, never reaches frp's parser.
func (g *workGuard) refuse(err error) {
	msg := proxy.BadResponseMessage("the tunnel's service", err) + "\n"
	g.head = nil
	g.out = fmt.Appendf(g.out, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"X-Content-Type-Options: nosniff\r\n%s: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		guardHeader, g.mark, len(msg), msg)
	g.readErr = io.EOF
	g.end()
}

// end ends the work connection: what the service still sends is not read,
// so its stream is reset rather than closed, which would leave it taking
// the rest (a megabyte head) until frpc closes its end.
func (g *workGuard) end() {
	if s, ok := g.Conn.(interface{ Reset() }); ok { // a gate.Stream
		s.Reset()
	}
	_ = g.Close()
}

// guarded reports whether h is the head of the guard's own 502 (mark is the
// server's): the vhost transport passes on X-Tether-Error only from it.
func guarded(h http.Header, mark string) bool {
	got := h.Get(guardHeader)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(mark)) == 1
}

// switchHeader reports whether h asks for, or agrees to, a protocol
// switch, as net/http decides (Upgrade and Connection: Upgrade).
func switchHeader(h http.Header) bool {
	return h.Get("Upgrade") != "" && httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade")
}

// chunked reports whether te, a message's transfer codings as net/http
// parsed them, frames its body in chunks.
func chunked(te []string) bool { return len(te) > 0 && te[0] == "chunked" }

// chunkedBody follows a chunked body as net/http's chunked reader reads it:
// size lines ending in CRLF with no other CR and shorter than 4 KiB, data,
// CRLF, and after the last chunk, trailer lines up to a blank line. It is
// owned by the side of the workGuard that follows the body.
type chunkedBody struct {
	phase uint8  // chunkSize, chunkData, chunkEnd, chunkTrailer
	line  []byte // the size line so far
	left  uint64 // data bytes left; or CRLF bytes
	// The trailer: bytes and lines so far, and whether the current line
	// so far is empty or one "\r".
	trailerBytes, trailerLines int
	lineLen                    int
	lineCR                     bool
}

const (
	chunkSize uint8 = iota
	chunkData
	chunkEnd
	chunkTrailer
	// maxChunkLine is net/http's bound on a chunk's size line.
	maxChunkLine = 4096
)

var errChunked = errors.New("malformed chunked encoding")

// follow takes the bytes of p that belong to the body and reports whether
// the body ended with them.
func (c *chunkedBody) follow(p []byte) (int, bool, error) {
	n := 0
	for n < len(p) {
		switch c.phase {
		case chunkSize:
			i := bytes.IndexByte(p[n:], '\n')
			if i < 0 {
				c.line = append(c.line, p[n:]...)
				n = len(p)
				if len(c.line) > maxChunkLine {
					return n, false, errChunked
				}
				continue
			}
			c.line = append(c.line, p[n:n+i]...)
			n += i + 1
			size, err := chunkLength(c.line)
			c.line = c.line[:0]
			if err != nil {
				return n, false, err
			}
			c.phase, c.left = chunkData, size
			if size == 0 {
				c.phase = chunkTrailer
			}
		case chunkData:
			k := min(c.left, uint64(len(p)-n))
			n += int(k) //nolint:gosec // at most len(p)
			if c.left -= k; c.left == 0 {
				c.phase, c.left = chunkEnd, 0
			}
		case chunkEnd:
			if want := "\r\n"[c.left]; p[n] != want {
				return n, false, errChunked
			}
			n++
			if c.left++; c.left == 2 {
				c.phase = chunkSize
			}
		case chunkTrailer:
			i := bytes.IndexByte(p[n:], '\n')
			if i < 0 {
				c.lineCR = c.lineLen == 0 && len(p)-n == 1 && p[n] == '\r'
				c.lineLen += len(p) - n
				c.trailerBytes += len(p) - n
				n = len(p)
			} else {
				lineLen := c.lineLen + i
				blank := lineLen == 0 || lineLen == 1 && (i == 1 && p[n] == '\r' || i == 0 && c.lineCR)
				c.trailerBytes += i + 1
				n += i + 1
				c.lineLen, c.lineCR = 0, false
				if blank {
					return n, true, nil
				}
				c.trailerLines++
			}
			if c.trailerBytes > proxy.MaxHeadBytes || c.trailerLines > proxy.MaxHeadFields {
				return n, false, fmt.Errorf("trailers beyond %d bytes or %d fields", proxy.MaxHeadBytes, proxy.MaxHeadFields)
			}
		}
	}
	return n, false, nil
}

// chunkLength parses a chunk's size line (without its "\n") as net/http
// does.
func chunkLength(line []byte) (uint64, error) {
	if len(line) == 0 || line[len(line)-1] != '\r' || bytes.IndexByte(line, '\r') != len(line)-1 || len(line) > maxChunkLine {
		return 0, errChunked
	}
	s := strings.TrimRight(string(line[:len(line)-1]), " \t")
	s, _, _ = strings.Cut(s, ";")
	if s == "" || len(s) > 16 {
		return 0, errChunked
	}
	var n uint64
	for i := range len(s) {
		c := s[i]
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, errChunked
		}
		n = n<<4 | uint64(c)
	}
	return n, nil
}
