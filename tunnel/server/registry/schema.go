package registry

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// schema names the keys and the channel of one deployment (one prefix); the
// package doc describes them.
type schema struct {
	prefix  string
	channel string
}

func newSchema(prefix string) schema {
	return schema{prefix: prefix, channel: prefix + "events"}
}

func (s schema) key(tunnel, replica string) string {
	return s.prefix + "tunnel:" + tunnel + ":" + replica
}

// tunnelPattern matches every tunnel key of this prefix, and no key of
// another: the prefix's glob characters are escaped.
func (s schema) tunnelPattern() string {
	var b strings.Builder
	for _, c := range s.prefix + "tunnel:" {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	b.WriteByte('*')
	return b.String()
}

// parseKey splits a tunnel key into tunnel and replica: a replica ID has no
// ':', so the last ':' separates them.
func (s schema) parseKey(key string) (tunnel, replica string, ok bool) {
	rest, ok := strings.CutPrefix(key, s.prefix+"tunnel:")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// value is what a tunnel key holds: "{epoch} {addr}". The epoch comes first
// so that the release script can compare it with a pattern.
func value(epoch uint64, addr string) string {
	return strconv.FormatUint(epoch, 10) + " " + addr
}

func parseValue(v string) (epoch uint64, addr string, err error) {
	e, addr, ok := strings.Cut(v, " ")
	if !ok {
		return 0, "", fmt.Errorf("value %q: want \"EPOCH ADDR\"", v)
	}
	epoch, err = strconv.ParseUint(e, 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("value %q: epoch: %w", v, err)
	}
	return epoch, addr, nil
}

// Event operations on the channel.
const (
	opHold    = "hold"
	opRelease = "release"
	opBeat    = "beat"
)

// event is one message on the channel.
type event struct {
	Op      string `json:"op"`
	Tunnel  string `json:"tunnel,omitempty"`
	Replica string `json:"replica"`
	Addr    string `json:"addr,omitempty"`
	Epoch   uint64 `json:"epoch,omitempty"`
	// TTLMillis is the sender's TTL: a hold or a beat keeps the sender
	// alive for that long.
	TTLMillis int64 `json:"ttl_ms,omitempty"`
	// Tunnels is, in a beat, how many tunnels the sender holds.
	Tunnels int `json:"tunnels,omitempty"`
}

func (e event) encode() string {
	b, _ := json.Marshal(e) // strings and numbers only: cannot fail
	return string(b)
}

// holdScript writes this replica's holds: for each key it sets the value
// with the TTL and, when the key did not already hold that value (a new
// hold, or a Redis that lost it), publishes the hold event, so that every
// cache learns it. It returns how many it published.
//
// KEYS: tunnel keys. ARGV[1]: TTL in ms; ARGV[2]: channel; then for each key
// i, ARGV[1+2i]: value, ARGV[2+2i]: hold event.
var holdScript = redis.NewScript(`
local n = 0
for i, key in ipairs(KEYS) do
	local val = ARGV[1 + 2 * i]
	if redis.call('GET', key) == val then
		redis.call('PEXPIRE', key, ARGV[1])
	else
		redis.call('SET', key, val, 'PX', ARGV[1])
		redis.call('PUBLISH', ARGV[2], ARGV[2 + 2 * i])
		n = n + 1
	end
end
return n
`)

// releaseScript deletes each key only if it still holds the given epoch,
// and then publishes the release event: a late release never erases a newer
// hold. It returns how many it deleted.
//
// KEYS: tunnel keys. ARGV[1]: channel; then for each key i, ARGV[2i]: epoch,
// ARGV[1+2i]: release event.
var releaseScript = redis.NewScript(`
local n = 0
for i, key in ipairs(KEYS) do
	local val = redis.call('GET', key)
	if val and string.match(val, '^(%d+) ') == ARGV[2 * i] then
		redis.call('DEL', key)
		redis.call('PUBLISH', ARGV[1], ARGV[1 + 2 * i])
		n = n + 1
	end
end
return n
`)
