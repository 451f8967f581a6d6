package proxy

import (
	"bytes"
	"errors"
	"fmt"
)

// Bounds of the response heads tether reads from an upstream, a tunnel or a
// replica. Go's parser holds about 16 times the bytes of a head made of
// short header fields (a map entry, a key and a slice each), and an
// upstream may send its head and never the body: bounded in bytes only (Go
// allows 10 MiB), 40 such answers in flight held 1.9 GB. Ingress
// controllers pass at most 32 KiB of request head and a few dozen fields;
// answers are no larger.
const (
	// MaxHeadBytes bounds the bytes of the heads of one exchange: the
	// final response's and those of the 1xx responses before it, together.
	MaxHeadBytes = 64 << 10
	// MaxHeadFields bounds the header fields of those heads, together.
	MaxHeadFields = 256
)

// ErrBadResponse is the error (for errors.Is) of an answer tether does not
// pass on: heads beyond MaxHeadBytes or MaxHeadFields, a protocol switch
// (101) the request did not ask for, or bytes that are not an HTTP/1.1
// response. The caller gets 502 with CodeUpstreamBadResponse, and the
// connection is closed.
var ErrBadResponse = errors.New("bad response")

// badResponseError is an ErrBadResponse with what was wrong, in words that
// name no address and quote none of the upstream's bytes, so that the
// caller may read them.
type badResponseError struct {
	reason string
	err    error // the parser's error, for the log; nil if none
}

func (e *badResponseError) Error() string {
	if e.err != nil {
		return e.reason + ": " + e.err.Error()
	}
	return e.reason
}

func (e *badResponseError) Is(target error) bool { return target == ErrBadResponse }

func (e *badResponseError) Unwrap() error { return e.err }

var (
	errHeadBytes = &badResponseError{
		reason: fmt.Sprintf("its response heads are larger than %d KiB", MaxHeadBytes>>10)}
	errHeadFields = &badResponseError{
		reason: fmt.Sprintf("its response heads have more than %d header fields", MaxHeadFields)}
	errUnaskedSwitch = &badResponseError{
		reason: "it switched protocols (101) where the request asked for no such switch"}
)

// malformed wraps the parser's error about an answer that is not HTTP/1.1.
func malformed(err error) error {
	return &badResponseError{reason: "its answer is not a valid HTTP/1.1 response", err: err}
}

// badResponseReason is what the caller is told about err, an
// ErrBadResponse.
func badResponseReason(err error) string {
	var br *badResponseError
	if errors.As(err, &br) {
		return br.reason
	}
	return "its answer is not a valid HTTP/1.1 response"
}

// A HeadScanner follows the response heads of one exchange as the bytes of
// the connection are read, before any parser holds them: it counts their
// bytes and header fields against MaxHeadBytes and MaxHeadFields, and finds
// where the final head ends, the first head that is not 1xx (101 is final).
// It reads status lines as net/http does, so that it ends where Go's parser
// does. The zero value is ready for an exchange; Reset makes it ready for
// the next.
type HeadScanner struct {
	size   int // bytes of the heads so far
	fields int // header fields of the heads so far
	// The current line: its bytes so far (without "\n"), whether those are
	// one "\r", and whether it is a head's first line, its status line.
	line       int
	lineCR     bool
	inStatus   bool
	status     statusLine
	continuing bool // the head being read is 1xx, not the final one
	done       bool
}

// Reset makes s ready for the next exchange's heads.
func (s *HeadScanner) Reset() { *s = HeadScanner{} }

// Done reports whether the final head has ended.
func (s *HeadScanner) Done() bool { return s.done }

// Scan takes p, the next bytes read from the connection, and returns how
// many of them it took: all of p, or up to the end of a head (ended), so
// that each head, a 1xx one too, can be passed on as it ends; Done tells
// whether it was the final one. Call it again with the rest of p. It
// returns an ErrBadResponse once the heads exceed MaxHeadBytes or
// MaxHeadFields. After the final head it takes nothing.
func (s *HeadScanner) Scan(p []byte) (n int, ended bool, err error) {
	for n < len(p) && !s.done {
		if s.size == 0 && s.line == 0 {
			s.inStatus = true
		}
		seg := p[n:]
		end := bytes.IndexByte(seg, '\n')
		if end >= 0 {
			seg = seg[:end+1]
		}
		if s.size+len(seg) > MaxHeadBytes {
			return n, false, errHeadBytes
		}
		s.size += len(seg)
		n += len(seg)
		if end < 0 {
			if s.inStatus {
				s.status.feed(seg)
			}
			s.lineCR = s.line == 0 && len(seg) == 1 && seg[0] == '\r'
			s.line += len(seg)
			return n, false, nil
		}
		content := seg[:end]
		blank := s.line+end == 0 || s.line+end == 1 && (end == 1 && content[0] == '\r' || end == 0 && s.lineCR)
		if ended, err = s.endLine(content, blank); ended || err != nil {
			return n, ended, err
		}
	}
	return n, false, nil
}

// endLine ends the current line, whose last bytes are content, and reports
// whether it ended a head.
func (s *HeadScanner) endLine(content []byte, blank bool) (bool, error) {
	s.line, s.lineCR = 0, false
	switch {
	case s.inStatus:
		s.inStatus = false
		if blank {
			// No status line: not a response. The parser refuses it;
			// nothing after it is a head.
			s.done = true
			return true, nil
		}
		s.status.feed(content)
		s.continuing = s.status.informational()
		s.status = statusLine{}
	case blank:
		if !s.continuing {
			s.done = true
			return true, nil
		}
		s.continuing = false
		s.inStatus = true // the next head follows at once
		return true, nil
	default:
		if s.fields++; s.fields > MaxHeadFields {
			return false, errHeadFields
		}
	}
	return false, nil
}

// headCount follows the response heads read from a connection, one
// exchange's from start until its final head has ended. Once they go
// beyond the bounds its fault stays: every later read is to fail with it,
// for bufio.Reader.ReadLine drops a read error that comes after part of a
// line, and Go's parser would go on.
type headCount struct {
	heads HeadScanner
	open  bool  // the heads are being read
	err   error // their fault, once found
}

// start readies c for the next exchange's heads.
func (c *headCount) start() {
	c.heads.Reset()
	c.open, c.err = true, nil
}

// read follows p, the bytes just read, and returns the heads' fault if
// they have gone beyond the bounds.
func (c *headCount) read(p []byte) error {
	for c.open && len(p) > 0 {
		k, _, err := c.heads.Scan(p)
		if err != nil {
			c.err = err
			return err
		}
		p = p[k:]
		c.open = !c.heads.Done()
	}
	return nil
}

// statusLine reads a status line as net/http's ReadResponse does, a piece
// at a time: the protocol up to the first space, any spaces, then the code
// up to the next space or the end of the line, one "\r" before "\n" not
// included.
type statusLine struct {
	phase uint8 // 0 protocol, 1 spaces, 2 code, 3 the rest
	code  [4]byte
	n     int // bytes of the code so far (at most 4 kept)
}

func (l *statusLine) feed(p []byte) {
	for _, c := range p {
		switch l.phase {
		case 0:
			if c == ' ' {
				l.phase = 1
			}
		case 1:
			if c == ' ' {
				continue
			}
			l.phase = 2
			fallthrough
		case 2:
			if c == ' ' {
				l.phase = 3
				continue
			}
			if l.n < len(l.code) {
				l.code[l.n] = c
			}
			l.n++
		}
	}
}

// informational reports whether the line, ended, is a 1xx status other
// than 101: a head that another follows.
func (l *statusLine) informational() bool {
	n := l.n
	if l.phase == 2 && n == 4 && l.code[3] == '\r' {
		n = 3 // "\r\n" ended the line
	}
	if n != 3 || l.code[0] != '1' || !isDigit(l.code[1]) || !isDigit(l.code[2]) {
		return false
	}
	return l.code[1] != '0' || l.code[2] != '1'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
