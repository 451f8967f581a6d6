package tunnel

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"time"
)

// ClientMetaKey is the frp login metadata key under which tether's client
// sends its version, shown in the server's /api/tunnels.
const ClientMetaKey = "tether_client"

// WebsocketPath is the HTTP path of the wss transport. It is frp's, so that a
// stock frpc with transport.protocol = "wss" connects unchanged.
const WebsocketPath = "/~!frp"

// ProbeMetaKey marks a login as a probe (`tether diagnose`): the server
// verifies its token exactly as for a login and answers, but the session
// never reaches frp, registers nothing and disturbs no running tunnel.
const ProbeMetaKey = "tether_probe"

// MessageHeaderSize is frp's v1 framing of a message: a type byte and a
// big-endian int64 length, then the JSON the length counts.
const MessageHeaderSize = 1 + 8

// FrameHeaderSize is frp's v2 framing (pkg/proto/wire) of a frame: a
// big-endian uint16 type, uint16 flags and uint32 length, then the payload
// the length counts.
const FrameHeaderSize = 2 + 2 + 4

// MaxMessageSize is the longest frp v1 message frp reads, without its
// header (golib msg/json's maxMsgLength). A login is one: the server refuses
// a longer first message before frp sees it.
const MaxMessageSize = 10240

// MaxLoginSize is the longest login a tether client sends: the server adds
// the session's ID to it (about 60 bytes) before frp reads it.
const MaxLoginSize = MaxMessageSize - 128

// ProbeReply follows the server's LoginResp to an accepted probe, as one
// JSON line: what the server knows about the token's tunnel.
type ProbeReply struct {
	Tunnel  string `json:"tunnel"`
	Account string `json:"account,omitempty"`
	Runtime string `json:"runtime,omitempty"`
	// ServerVersion is the server's tether version.
	ServerVersion string `json:"server_version"`
	// PublicURL is where the platform reaches the tunnel (the server's
	// --public-url for this tunnel).
	PublicURL string `json:"public_url,omitempty"`
	// Connected reports whether a client currently serves the tunnel, and
	// from where since when.
	Connected      bool       `json:"connected"`
	ClientAddress  string     `json:"client_address,omitempty"`
	ConnectedSince *time.Time `json:"connected_since,omitempty"`
	// Buffered counts the webhooks stored for the tunnel while it was down
	// that wait for delivery, BufferRejected those its upstream refused
	// (a 4xx), which wait for a person; BufferedSince is when the oldest
	// of either was stored. Absent when none is, or buffering is off.
	Buffered       int        `json:"buffered,omitempty"`
	BufferRejected int        `json:"buffer_rejected,omitempty"`
	BufferedSince  *time.Time `json:"buffered_since,omitempty"`
}

// Fingerprint formats the SHA-256 of a DER certificate as colon-separated
// hex: what the server logs for its self-signed certificate and what
// `tether client --tls-fingerprint` pins.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}
