package server

import (
	"bytes"
	"fmt"
	"io"
	"net"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/fatedier/frp/pkg/proto/wire"
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

// readOpening reads the first frp message from a client stream, in either
// wire protocol. The caller bounds it with a read deadline.
func readOpening(conn net.Conn) (*opening, error) {
	checked, isV2, err := wire.CheckMagic(conn)
	if err != nil {
		return nil, fmt.Errorf("read wire protocol magic: %w", err)
	}
	if !isV2 {
		m, err := msg.ReadMsg(checked)
		if err != nil {
			return nil, fmt.Errorf("read first message: %w", err)
		}
		return &opening{Msg: m, rest: checked}, nil
	}
	wc := wire.NewConn(conn)
	frame, err := wc.ReadFrame()
	if err != nil {
		return nil, fmt.Errorf("read first v2 frame: %w", err)
	}
	op := &opening{v2: true, rest: conn}
	if frame.Type == wire.FrameTypeClientHello {
		op.hello = frame.Payload
		if frame, err = wc.ReadFrame(); err != nil {
			return nil, fmt.Errorf("read first v2 message frame: %w", err)
		}
	}
	if op.Msg, err = msg.DecodeV2MessageFrame(frame); err != nil {
		return nil, fmt.Errorf("decode first v2 message: %w", err)
	}
	return op, nil
}

// replay returns a conn that yields the opening (with Msg as it is now, so a
// rewritten login is what frp reads) followed by the rest of the stream.
func (op *opening) replay(conn net.Conn) (net.Conn, error) {
	var buf bytes.Buffer
	if !op.v2 {
		if err := msg.WriteMsg(&buf, op.Msg); err != nil {
			return nil, fmt.Errorf("encode first message: %w", err)
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
