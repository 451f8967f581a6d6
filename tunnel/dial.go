package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The dial protocol runs on streams the server opens in a tether client's
// session. The server asks the client to connect to one of the client's own
// configured upstreams; once the client answers OK, the stream carries the
// bytes of that upstream connection both ways, and the server speaks HTTP to
// the upstream through it. The client refuses any address that is not one of
// its routes' upstreams, so the server can never use it as an open proxy
// into the cluster.
//
//	request: 'D' version(1) len(2) address          (address = host:port)
//	reply:   'R' code(1) len(2) message             (code 0 = connected)

const (
	dialRequestMagic = 'D'
	dialReplyMagic   = 'R'
	dialVersion      = 1
	maxDialField     = 1024
)

// DialCode is the client's answer to a dial request.
type DialCode byte

// Dial answers. They are a closed set so that the server can explain a
// failure without trusting the client's words for its HTTP answer.
const (
	DialOK          DialCode = iota // connected; the stream now carries the connection
	DialNotAllowed                  // the address is not one of the client's upstreams
	DialRefused                     // connection refused
	DialNotFound                    // the host name does not resolve
	DialUnreachable                 // no route to the host
	DialTimeout                     // no answer in time
	DialFailed                      // any other failure
)

// WriteDialRequest asks for a connection to addr (host:port).
func WriteDialRequest(w io.Writer, addr string) error {
	if len(addr) > maxDialField {
		return fmt.Errorf("dial address of %d bytes is too long", len(addr))
	}
	b := make([]byte, 4, 4+len(addr))
	b[0], b[1] = dialRequestMagic, dialVersion
	binary.BigEndian.PutUint16(b[2:], uint16(len(addr))) //nolint:gosec // at most maxDialField, checked above
	_, err := w.Write(append(b, addr...))
	return err
}

// ReadDialRequest reads a dial request and returns its address.
func ReadDialRequest(r io.Reader) (string, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return "", fmt.Errorf("read dial request: %w", err)
	}
	if h[0] != dialRequestMagic || h[1] != dialVersion {
		return "", errors.New("read dial request: not a tether dial request (version mismatch between server and client?)")
	}
	return readField(r, binary.BigEndian.Uint16(h[2:]))
}

// WriteDialReply answers a dial request.
func WriteDialReply(w io.Writer, code DialCode, msg string) error {
	if len(msg) > maxDialField {
		msg = msg[:maxDialField]
	}
	b := make([]byte, 4, 4+len(msg))
	b[0], b[1] = dialReplyMagic, byte(code)
	binary.BigEndian.PutUint16(b[2:], uint16(len(msg))) //nolint:gosec // at most maxDialField, cut above
	_, err := w.Write(append(b, msg...))
	return err
}

// ReadDialReply reads the answer to a dial request.
func ReadDialReply(r io.Reader) (DialCode, string, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, "", fmt.Errorf("read dial reply: %w", err)
	}
	if h[0] != dialReplyMagic {
		return 0, "", errors.New("read dial reply: not a tether dial reply")
	}
	msg, err := readField(r, binary.BigEndian.Uint16(h[2:]))
	return DialCode(h[1]), msg, err
}

func readField(r io.Reader, n uint16) (string, error) {
	if n > maxDialField {
		return "", fmt.Errorf("dial field of %d bytes is too long", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("read dial field: %w", err)
	}
	return string(b), nil
}

// RoutesMetaKey is the login metadata key under which a tether client
// advertises its routes (a JSON array of proxy.Route strings). The server
// routes each request by them and asks the client to dial the chosen
// route's upstream.
const RoutesMetaKey = "tether_routes"
