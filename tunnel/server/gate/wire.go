package gate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/fatedier/frp/pkg/proto/wire"

	"github.com/tether-dev/tether/tunnel"
)

// opening is the first frp message of a client stream, read by the session
// layer before frp sees the stream, so that it can decide whether frp may see
// it at all and stamp the login with the session's identity.
type opening struct {
	// Msg is the decoded first message (*msg.Login, *msg.NewWorkConn, ...).
	Msg msg.Message
	// v2 is true for frp's framed wire protocol v2 (magic, optional
	// ClientHello, JSON frames); false for the classic v1 encoding.
	v2 bool
	// hello is the raw ClientHello payload of a v2 control stream. Its bytes
	// are hashed into the v2 crypto transcript, so it is replayed unchanged.
	hello []byte
	// rest yields the stream's bytes after the first message.
	rest io.Reader
}

// errOpeningTooLarge: a frame of the opening announced more than the bound.
// The frame is refused from its header, before anything is allocated for it.
var errOpeningTooLarge = errors.New("first message too large")

// v1 framing: a type byte and a big-endian int64 length, then JSON.
const v1HeaderSize = tunnel.MessageHeaderSize

// frpMaxV1Message is the longest v1 message frp reads.
const frpMaxV1Message = tunnel.MaxMessageSize

// v2 framing (frp pkg/proto/wire): type uint16, flags uint16, length uint32.
const v2HeaderSize = tunnel.FrameHeaderSize

// readOpening reads the first frp message from a client stream, in either
// wire protocol, allocating no frame larger than limit bytes: the lengths
// are checked in the headers, which frp's own readers would trust up to
// 10 KiB (v1) and 64 KiB (v2) per frame. The caller bounds it with a read
// deadline.
func readOpening(r io.Reader, limit int) (*opening, error) {
	var first [1]byte
	if _, err := io.ReadFull(r, first[:]); err != nil {
		return nil, fmt.Errorf("read first message: %w", err)
	}
	if first[0] != wire.MagicV2[0] { // no v1 message type is 'F'
		m, err := readV1(first[0], r, limit)
		if err != nil {
			return nil, err
		}
		return &opening{Msg: m, rest: r}, nil
	}
	magic := make([]byte, len(wire.MagicV2))
	magic[0] = first[0]
	if _, err := io.ReadFull(r, magic[1:]); err != nil {
		return nil, fmt.Errorf("read wire protocol magic: %w", err)
	}
	if string(magic) != wire.MagicV2 {
		return nil, fmt.Errorf("neither an frp message nor frp's v2 magic: %q", magic)
	}
	frame, err := readV2Frame(r, limit)
	if err != nil {
		return nil, fmt.Errorf("read first v2 frame: %w", err)
	}
	op := &opening{v2: true, rest: r}
	if frame.Type == wire.FrameTypeClientHello {
		op.hello = frame.Payload
		if frame, err = readV2Frame(r, limit); err != nil {
			return nil, fmt.Errorf("read first v2 message frame: %w", err)
		}
	}
	if op.Msg, err = msg.DecodeV2MessageFrame(frame); err != nil {
		return nil, fmt.Errorf("decode first v2 message: %w", err)
	}
	return op, nil
}

// readV1 reads the rest of a v1 message whose type byte is typ.
func readV1(typ byte, r io.Reader, limit int) (msg.Message, error) {
	var h [v1HeaderSize]byte
	h[0] = typ
	if _, err := io.ReadFull(r, h[1:]); err != nil {
		return nil, fmt.Errorf("read first message header: %w", err)
	}
	n := int64(binary.BigEndian.Uint64(h[1:])) //nolint:gosec // a negative length is refused below
	if n < 0 || n > int64(limit) {
		return nil, fmt.Errorf("%w: header announces %d bytes, at most %d are read before a stream is admitted", errOpeningTooLarge, n, limit)
	}
	buf := make([]byte, v1HeaderSize+n)
	copy(buf, h[:])
	if _, err := io.ReadFull(r, buf[v1HeaderSize:]); err != nil {
		return nil, fmt.Errorf("read first message: %w", err)
	}
	m, err := msg.ReadMsg(bytes.NewReader(buf))
	if err != nil {
		return nil, fmt.Errorf("decode first message: %w", err)
	}
	return m, nil
}

// readV2Frame reads one v2 frame of at most limit payload bytes.
func readV2Frame(r io.Reader, limit int) (*wire.Frame, error) {
	var h [v2HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	f := &wire.Frame{Type: binary.BigEndian.Uint16(h[0:2]), Flags: binary.BigEndian.Uint16(h[2:4])}
	if f.Flags != 0 {
		return nil, fmt.Errorf("unsupported frame flags %#x", f.Flags)
	}
	n := binary.BigEndian.Uint32(h[4:8])
	if int64(n) > int64(limit) {
		return nil, fmt.Errorf("%w: frame header announces %d bytes, at most %d are read before a stream is admitted", errOpeningTooLarge, n, limit)
	}
	f.Payload = make([]byte, n)
	if _, err := io.ReadFull(r, f.Payload); err != nil {
		return nil, err
	}
	return f, nil
}

// replay returns a conn that yields the opening (with Msg as it is now, so a
// rewritten login is what frp reads) followed by the rest of the stream.
func (op *opening) replay(conn net.Conn) (net.Conn, error) {
	var buf bytes.Buffer
	if !op.v2 {
		if err := msg.WriteMsg(&buf, op.Msg); err != nil {
			return nil, fmt.Errorf("encode first message: %w", err)
		}
		if n := buf.Len() - v1HeaderSize; n > frpMaxV1Message {
			return nil, fmt.Errorf("%w: %d bytes with the session's ID, frp reads at most %d", errOpeningTooLarge, n, frpMaxV1Message)
		}
	} else {
		if err := wire.WriteMagic(&buf); err != nil {
			return nil, err
		}
		wc := wire.NewConn(&buf)
		if op.hello != nil {
			if err := wc.WriteFrame(&wire.Frame{Type: wire.FrameTypeClientHello, Payload: op.hello}); err != nil {
				return nil, fmt.Errorf("encode ClientHello: %w", err)
			}
		}
		frame, err := msg.EncodeV2MessageFrame(op.Msg)
		if err != nil {
			return nil, fmt.Errorf("encode first message: %w", err)
		}
		if err := wc.WriteFrame(frame); err != nil {
			return nil, fmt.Errorf("encode first message: %w", err)
		}
	}
	return &replayConn{Conn: conn, r: io.MultiReader(&buf, op.rest)}, nil
}

// replayConn is a stream whose first bytes come from a buffer.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }
