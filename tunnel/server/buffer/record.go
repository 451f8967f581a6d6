package buffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// meta is what a store keeps of a request beside its payload, as JSON: all
// that a listing shows and a delivery decides on. The Redis scripts read and
// change it with cjson, whose numbers stay exact below 10^14 (a timestamp in
// milliseconds is 13 digits).
type meta struct {
	Method    string `json:"method"`
	Path      string `json:"path"`
	Size      int64  `json:"size"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error"`
	// NextAt is when the request is due, in Unix milliseconds; 0 is now.
	NextAt int64 `json:"next_at"`
}

// entry is the Entry of the request id of tunnel in state s.
func (m meta) entry(tunnel, id string, s State) (Entry, error) {
	ms, _, ok := parseID(id)
	if !ok {
		return Entry{}, fmt.Errorf("buffered request ID %q was not made by tether", id)
	}
	e := Entry{
		ID: id, Tunnel: tunnel, State: s, QueuedAt: time.UnixMilli(ms).UTC(),
		Method: m.Method, Path: m.Path, Size: m.Size, Attempts: m.Attempts, LastError: m.LastError,
	}
	if m.NextAt > 0 {
		e.NextAttemptAt = time.UnixMilli(m.NextAt).UTC()
	}
	return e, nil
}

// maxLastError bounds what a request keeps of its last error.
const maxLastError = 512

// failed records a failed attempt that will be retried.
func (m *meta) failed(f Failure) {
	if f.Reached {
		m.Attempts++
	}
	m.LastError = truncateError(f.Err)
	m.NextAt = f.NextAttemptAt.UnixMilli()
}

// rejected records an attempt the upstream refused.
func (m *meta) rejected(reason string) {
	m.Attempts++
	m.LastError = truncateError(reason)
	m.NextAt = 0
}

// truncateError cuts an error to at most maxLastError bytes, on a rune
// boundary.
func truncateError(s string) string {
	n := maxLastError
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// sortEntries sorts a listing by ID: the order of arrival.
func sortEntries(list []Entry) {
	slices.SortFunc(list, func(a, b Entry) int { return strings.Compare(a.ID, b.ID) })
}

// maxSeq is the largest sequence within one millisecond of an ID.
const maxSeq = 1<<24 - 1

// formatID is the ID of the seq-th request stored in millisecond ms.
func formatID(ms int64, seq uint32) string { return fmt.Sprintf("%012x-%06x", ms, seq) }

// parseID splits an ID into its millisecond and sequence.
func parseID(id string) (ms int64, seq uint32, ok bool) {
	if len(id) != 19 || id[12] != '-' {
		return 0, 0, false
	}
	m, err1 := strconv.ParseInt(id[:12], 16, 64)
	s, err2 := strconv.ParseUint(id[13:], 16, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return m, uint32(s), true
}

// nextID returns the millisecond and sequence of the ID after the last one
// (lastMS, lastSeq) at nowMS: IDs never go back, even when the clock does.
// The Redis append script does the same.
func nextID(lastMS int64, lastSeq uint32, nowMS int64) (int64, uint32) {
	if nowMS > lastMS {
		return nowMS, 0
	}
	if lastSeq >= maxSeq {
		return lastMS + 1, 0
	}
	return lastMS, lastSeq + 1
}

// idBefore is the smallest ID string above every ID of a millisecond before
// ms, for the range scans of expiry.
func idBefore(ms int64) string { return fmt.Sprintf("%012x-", ms) }

// payloadVersion starts an encoded payload.
const payloadVersion = 1

// encodePayload encodes what a delivery needs beyond the metadata: the
// request URI, the headers in order, the body. Each string is a uvarint
// length and its bytes:
//
//	version byte, URI, header count, then per header: name, value count,
//	values; then the body to the end.
func encodePayload(uri string, h http.Header, body []byte) []byte {
	n := 1 + 2*binary.MaxVarintLen64 + len(uri) + len(body)
	for k, vs := range h {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, payloadVersion)
	b = appendString(b, uri)
	b = binary.AppendUvarint(b, uint64(len(h)))
	for k, vs := range h {
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return append(b, body...)
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

var errPayload = errors.New("stored payload is corrupt")

// decodePayload decodes what encodePayload made. The body aliases b.
func decodePayload(b []byte) (uri string, h http.Header, body []byte, err error) {
	if len(b) == 0 || b[0] != payloadVersion {
		return "", nil, nil, fmt.Errorf("%w: unknown version", errPayload)
	}
	d := decoder{b: b[1:]}
	uri = d.string()
	n := d.count()
	h = make(http.Header, n)
	for range n {
		k := d.string()
		vs := make([]string, d.count())
		for i := range vs {
			vs[i] = d.string()
		}
		h[k] = vs
	}
	if d.err != nil {
		return "", nil, nil, d.err
	}
	return uri, h, d.b, nil
}

// decoder reads a payload; its first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad length", errPayload)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a number of items, each at least one byte long.
func (d *decoder) count() int {
	v := d.uvarint()
	if v > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: count past the end", errPayload)
		return 0
	}
	return int(v) //nolint:gosec // at most len(d.b)
}

func (d *decoder) string() string {
	v := d.uvarint()
	if d.err != nil {
		return ""
	}
	if v > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: string past the end", errPayload)
		return ""
	}
	s := string(d.b[:v])
	d.b = d.b[v:]
	return s
}
