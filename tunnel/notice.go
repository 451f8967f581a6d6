package tunnel

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Notices are what the server tells a tether client about its session, on a
// stream the server opens for each one: which replica the session landed on
// once its login is bound, that the replica is draining so the client
// should move, and the renewal of the client's token. The client tells a notice from a dial request by the first
// byte of the stream.
//
//	notice: 'N' version(1) len(2) JSON
const (
	noticeMagic   = 'N'
	noticeVersion = 1
	// maxNotice bounds a notice: a token notice carries a token of up to
	// 8 KiB (what servers accept).
	maxNotice = 12 << 10
)

// Notice kinds.
const (
	// NoticeHello follows a bound login: the session is served by Replica.
	NoticeHello = "hello"
	// NoticeMove says the replica is draining: open a replacement session
	// (it lands on another replica), and close this one once the replacement
	// serves and this one's requests have ended.
	NoticeMove = "move"
	// NoticeToken carries the renewal of the token the session logged in
	// with (Token): the client logs in with it from now on.
	NoticeToken = "token"
)

// Notice is one message from the server about the session it arrives on.
type Notice struct {
	Kind    string `json:"kind"`
	Replica string `json:"replica"`
	Session string `json:"session"`
	// Alone, in a hello, says the server is the only replica (its registry
	// is in memory): a client need not look for another.
	Alone bool `json:"alone,omitempty"`
	// Token, in a token notice, is the renewed token.
	Token string `json:"token,omitempty"`
}

// WriteNotice writes n as one notice.
func WriteNotice(w io.Writer, n Notice) error {
	body, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode notice: %w", err)
	}
	if len(body) > maxNotice {
		return fmt.Errorf("notice of %d bytes is too long", len(body))
	}
	b := make([]byte, 4, 4+len(body))
	b[0], b[1] = noticeMagic, noticeVersion
	binary.BigEndian.PutUint16(b[2:], uint16(len(body))) //nolint:gosec // at most maxNotice, checked above
	_, err = w.Write(append(b, body...))
	return err
}

// IsNotice reports whether a stream's first byte starts a notice.
func IsNotice(first byte) bool { return first == noticeMagic }

// ReadNotice reads one notice.
func ReadNotice(r io.Reader) (Notice, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Notice{}, fmt.Errorf("read notice: %w", err)
	}
	if h[0] != noticeMagic || h[1] != noticeVersion {
		return Notice{}, errors.New("read notice: not a tether notice (version mismatch between server and client?)")
	}
	n := binary.BigEndian.Uint16(h[2:])
	if n > maxNotice {
		return Notice{}, fmt.Errorf("notice of %d bytes is too long", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return Notice{}, fmt.Errorf("read notice: %w", err)
	}
	var out Notice
	if err := json.Unmarshal(body, &out); err != nil {
		return Notice{}, fmt.Errorf("decode notice: %w", err)
	}
	return out, nil
}
