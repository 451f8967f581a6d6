package tunnel

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
)

// recordingConn records each Write as one chunk.
type recordingConn struct {
	net.Conn
	writes [][]byte
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func header(msgType byte, length uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[0], h[1] = 0, msgType
	binary.BigEndian.PutUint32(h[8:], length)
	return h
}

func TestCoalesceFrames(t *testing.T) {
	rec := &recordingConn{}
	c := CoalesceFrames(rec)
	body := []byte("GET / HTTP/1.1\r\n\r\n")
	big := bytes.Repeat([]byte("x"), coalesceLimit+1)
	writes := [][]byte{
		header(yamuxTypeData, uint32(len(body))), body, // joined
		header(1, 0),                                 // window update: no body, sent at once
		header(yamuxTypeData, 0),                     // data frame without body (FIN): sent at once
		header(yamuxTypeData, uint32(len(big))), big, // too big to copy: header, then body
	}
	for _, w := range writes {
		if n, err := c.Write(w); err != nil || n != len(w) {
			t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(w))
		}
	}
	want := [][]byte{
		append(header(yamuxTypeData, uint32(len(body))), body...),
		header(1, 0),
		header(yamuxTypeData, 0),
		header(yamuxTypeData, uint32(len(big))),
		big,
	}
	if len(rec.writes) != len(want) {
		t.Fatalf("got %d writes, want %d", len(rec.writes), len(want))
	}
	for i := range want {
		if !bytes.Equal(rec.writes[i], want[i]) {
			t.Errorf("write %d: got %d bytes, want %d", i, len(rec.writes[i]), len(want[i]))
		}
	}
}

// A yamux session over coalescing conns carries data both ways unchanged.
func TestCoalescedSession(t *testing.T) {
	a, b := net.Pipe()
	cfg := MuxConfig(15*time.Second, zap.NewNop())
	client, err := yamux.Client(CoalesceFrames(a), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := yamux.Server(CoalesceFrames(b), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	payload := bytes.Repeat([]byte("tether "), 100_000) // spans many frames
	done := make(chan error, 1)
	go func() {
		s, err := server.AcceptStream()
		if err != nil {
			done <- err
			return
		}
		_, err = io.Copy(s, s) // echo until the client's FIN
		_ = s.Close()
		done <- err
	}()
	s, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, _ = s.Write(payload)
		_ = s.Close()
	}()
	got, err := io.ReadAll(s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("echo returned %d bytes, want the %d sent", len(got), len(payload))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestDialProtocol(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteDialRequest(&buf, "argocd-server:80"); err != nil {
		t.Fatal(err)
	}
	addr, err := ReadDialRequest(&buf)
	if err != nil || addr != "argocd-server:80" {
		t.Fatalf("ReadDialRequest = %q, %v", addr, err)
	}
	if err := WriteDialReply(&buf, DialRefused, "connection refused"); err != nil {
		t.Fatal(err)
	}
	code, msg, err := ReadDialReply(&buf)
	if err != nil || code != DialRefused || msg != "connection refused" {
		t.Fatalf("ReadDialReply = %v, %q, %v", code, msg, err)
	}

	if err := WriteDialRequest(&buf, strings.Repeat("a", maxDialField+1)); err == nil {
		t.Error("an oversized address was written")
	}
	for name, in := range map[string][]byte{
		"not a request":   []byte("GET / HTTP/1.1\r\n"),
		"another version": {dialRequestMagic, 9, 0, 1, 'a'},
		"truncated":       {dialRequestMagic, dialVersion, 0, 10, 'a'},
		"oversized field": {dialRequestMagic, dialVersion, 0xff, 0xff},
	} {
		if _, err := ReadDialRequest(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Copy reads into a large buffer only while its source has more ready than
// the small one holds: a stream that trickles or idles holds the small
// buffer alone. Every byte arrives either way.
func TestCopyBuffers(t *testing.T) {
	small, large := smallCopyBuffer, MaxBulkWrite
	// What the source has ready, burst by burst; a read takes what is
	// ready, up to its buffer's size.
	bursts := []int{100, small, 3 * large, 500, 7, small + 1, 10}
	want := []int{ // the buffer each read is given
		small,               // 100: less than the small buffer holds
		small,               // fills it: more is likely waiting
		large, large, large, // the burst of three large buffers
		large, // 500: the source caught up, and the next read may wait
		small, // 7
		small, // fills it
		large, // the last byte of that burst
		small, // 10
		small, // EOF
	}
	total := 0
	for _, b := range bursts {
		total += b
	}
	src := &burstReader{bursts: bursts}
	var dst bytes.Buffer
	n, err := Copy(&dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(total) || !bytes.Equal(dst.Bytes(), src.sent.Bytes()) {
		t.Fatalf("copied %d bytes (%d arrived intact: %v), want the %d sent", n, dst.Len(), bytes.Equal(dst.Bytes(), src.sent.Bytes()), total)
	}
	if !slices.Equal(src.sizes, want) {
		t.Errorf("reads were given buffers of %v bytes, want %v", src.sizes, want)
	}
}

// burstReader serves bursts of bytes (a counter) and records the size of
// the buffer each read is given.
type burstReader struct {
	bursts []int
	sizes  []int
	sent   bytes.Buffer
	next   byte
}

func (r *burstReader) Read(p []byte) (int, error) {
	r.sizes = append(r.sizes, len(p))
	if len(r.bursts) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), r.bursts[0])
	if r.bursts[0] -= n; r.bursts[0] == 0 {
		r.bursts = r.bursts[1:]
	}
	for i := range p[:n] {
		p[i] = r.next
		r.next++
	}
	r.sent.Write(p[:n])
	return n, nil
}
