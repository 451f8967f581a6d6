package tunnel

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"math/big"
	"net"
	"slices"
	"strings"
	"sync/atomic"
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
	c := CoalesceFrames(rec, nil)
	body := []byte("GET / HTTP/1.1\r\n\r\n")
	big := bytes.Repeat([]byte("x"), gatherLimit+1)
	writes := [][]byte{
		header(yamuxTypeData, uint32(len(body))), body, // joined
		header(1, 0),                                 // window update: no body, sent at once
		header(yamuxTypeData, 0),                     // data frame without body (FIN): sent at once
		header(yamuxTypeData, uint32(len(big))), big, // more than a gatherer holds: header, then body
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

func TestGatherer(t *testing.T) {
	rec := &recordingConn{}
	g := NewGatherer(rec)
	write := func(s string) {
		t.Helper()
		if n, err := g.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	write("straight ")
	g.start()
	write("gathered ")
	write("and ")
	if len(rec.writes) != 1 {
		t.Fatalf("%d writes went out while gathering, want none", len(rec.writes)-1)
	}
	big := strings.Repeat("x", gatherLimit)
	write(big) // over the limit: what was gathered leaves first, then big itself
	write("after ")
	if err := g.stop(); err != nil {
		t.Fatal(err)
	}
	write("straight again")
	want := []string{"straight ", "gathered and ", big, "after ", "straight again"}
	if len(rec.writes) != len(want) {
		t.Fatalf("got %d writes, want %d", len(rec.writes), len(want))
	}
	for i := range want {
		if string(rec.writes[i]) != want[i] {
			t.Errorf("write %d: got %d bytes, want %d", i, len(rec.writes[i]), len(want[i]))
		}
	}
}

// Over TLS, a data frame leaves in one write of the TCP connection, not in
// one per TLS record (16 KiB): a megabyte written to a stream leaves in a
// handful of writes, and arrives whole.
func TestFramesOverTLS(t *testing.T) {
	a, b := net.Pipe()
	counted := &countingWrites{Conn: a}
	clientG := NewGatherer(counted)
	cert := testCertificate(t)
	clientTLS := tls.Client(clientG, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a test certificate
	serverG := NewGatherer(b)
	serverTLS := tls.Server(serverG, &tls.Config{Certificates: []tls.Certificate{cert}})
	cfg := MuxConfig(15*time.Second, zap.NewNop())
	type result struct {
		sess *yamux.Session
		err  error
	}
	accepted := make(chan result, 1)
	go func() {
		if err := serverTLS.HandshakeContext(t.Context()); err != nil {
			accepted <- result{err: err}
			return
		}
		sess, err := yamux.Server(CoalesceFrames(serverTLS, serverG), cfg)
		accepted <- result{sess, err}
	}()
	if err := clientTLS.HandshakeContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	client, err := yamux.Client(CoalesceFrames(clientTLS, clientG), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	r := <-accepted
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.sess.Close()

	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: 64 TLS records
	received := make(chan []byte, 1)
	go func() {
		s, err := r.sess.AcceptStream()
		if err != nil {
			received <- nil
			return
		}
		got, _ := io.ReadAll(s)
		received <- got
	}()
	s, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	before := counted.n.Load()
	if _, err := s.Write(payload); err != nil {
		t.Fatal(err)
	}
	writes := counted.n.Load() - before
	_ = s.Close()
	if got := <-received; !bytes.Equal(got, payload) {
		t.Fatalf("received %d bytes, want the %d sent", len(got), len(payload))
	}
	// The stream's first window is 256 KiB, so the megabyte is two frames
	// or a few more; one write per record would be 64.
	if writes > 8 {
		t.Errorf("a 1 MiB stream write left in %d writes of the connection, want at most 8", writes)
	}
}

// countingWrites counts the writes made to a connection.
type countingWrites struct {
	net.Conn
	n atomic.Int64
}

func (c *countingWrites) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// testCertificate makes a self-signed ECDSA certificate for the test.
func testCertificate(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// A yamux session over coalescing conns carries data both ways unchanged.
func TestCoalescedSession(t *testing.T) {
	a, b := net.Pipe()
	cfg := MuxConfig(15*time.Second, zap.NewNop())
	client, err := yamux.Client(CoalesceFrames(a, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := yamux.Server(CoalesceFrames(b, nil), cfg)
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
