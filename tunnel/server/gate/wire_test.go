package gate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"reflect"
	"runtime"
	"testing"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/fatedier/frp/pkg/proto/wire"
)

// v1Encode is m in frp's classic encoding.
func v1Encode(t testing.TB, m msg.Message) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := msg.WriteMsg(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// v2Encode is m in frp's v2 encoding: the magic, hello (if any) as a
// ClientHello frame, and m's message frame.
func v2Encode(t testing.TB, hello []byte, m msg.Message) []byte {
	t.Helper()
	var b bytes.Buffer
	_ = wire.WriteMagic(&b)
	wc := wire.NewConn(&b)
	if hello != nil {
		if err := wc.WriteFrame(&wire.Frame{Type: wire.FrameTypeClientHello, Payload: hello}); err != nil {
			t.Fatal(err)
		}
	}
	f, err := msg.EncodeV2MessageFrame(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := wc.WriteFrame(f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// readerConn is a net.Conn that reads from r.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// The opening is read in either protocol, and replayed to frp byte for
// byte, followed by the rest of the stream.
func TestReadOpeningReplaysWhatItRead(t *testing.T) {
	login := &msg.Login{Version: "0.71.0", RunID: "alpha", Metas: map[string]string{"token": "t"}}
	work := &msg.NewWorkConn{RunID: "alpha", Timestamp: 1}
	for _, tc := range []struct {
		name  string
		bytes []byte
		want  msg.Message
	}{
		{"v1 login", v1Encode(t, login), login},
		{"v1 work connection", v1Encode(t, work), work},
		{"v2 login with ClientHello", v2Encode(t, []byte(`{"capabilities":{}}`), login), login},
		{"v2 work connection", v2Encode(t, nil, work), work},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append(bytes.Clone(tc.bytes), "rest of the stream"...)
			r := bytes.NewReader(in)
			op, err := readOpening(r, MaxOpeningSize)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(op.Msg, tc.want) {
				t.Errorf("read %#v, want %#v", op.Msg, tc.want)
			}
			conn, err := op.replay(readerConn{r: r})
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(conn)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, in) {
				t.Errorf("replayed %q, want %q", got, in)
			}
		})
	}
}

// headerOnly are openings whose header announces more than MaxOpeningSize,
// and nothing after the header.
func headerOnly() map[string][]byte {
	v1 := func(n int64) []byte {
		b := make([]byte, 9)
		b[0] = msg.TypeLogin
		binary.BigEndian.PutUint64(b[1:], uint64(n)) //nolint:gosec // negative on purpose
		return b
	}
	v2 := func(n uint32) []byte {
		b := []byte(wire.MagicV2 + "\x00\x10\x00\x00....")
		binary.BigEndian.PutUint32(b[len(b)-4:], n)
		return b
	}
	return map[string][]byte{
		"v1 just over":   v1(MaxOpeningSize + 1),
		"v1 64 KiB":      v1(64 << 10),
		"v1 1 TiB":       v1(1 << 40),
		"v1 negative":    v1(-1),
		"v2 just over":   v2(MaxOpeningSize + 1),
		"v2 64 KiB":      v2(64 << 10),
		"v2 4 GiB":       v2(1<<32 - 1),
		"v2 hello 1 MiB": []byte(wire.MagicV2 + "\x00\x01\x00\x00\x00\x10\x00\x00"),
	}
}

// An opening announcing more than the bound is refused from its header:
// the reader neither waits for the announced bytes nor allocates them.
func TestReadOpeningRefusesLargeFramesFromTheHeader(t *testing.T) {
	for name, in := range headerOnly() {
		t.Run(name, func(t *testing.T) {
			_, err := readOpening(bytes.NewReader(in), MaxOpeningSize)
			if name == "v1 negative" {
				if err == nil {
					t.Fatal("a negative length was accepted")
				}
				return
			}
			if !errors.Is(err, errOpeningTooLarge) {
				t.Fatalf("got %v, want %v", err, errOpeningTooLarge)
			}
			if alloc := allocated(func() { _, _ = readOpening(bytes.NewReader(in), MaxOpeningSize) }); alloc > 4<<10 {
				t.Errorf("refusing the header allocated %d bytes, want at most 4 KiB", alloc)
			}
		})
	}
}

// allocated is the heap f allocates: the least of a few runs, as the
// process's count includes what other goroutines allocate meanwhile (an
// earlier test's servers shutting down), and f allocates the same each run.
func allocated(f func()) uint64 {
	least := uint64(math.MaxUint64)
	for range 5 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// maxOpeningAlloc bounds what reading one opening allocates: two frames of
// at most MaxOpeningSize (a v2 ClientHello and a message), copied once for
// frp's decoder, and what JSON decoding makes of them.
const maxOpeningAlloc = 24 * MaxOpeningSize

// Whatever a client sends, reading its opening neither panics nor
// allocates more than maxOpeningAlloc; what it accepts replays unchanged.
func FuzzReadOpening(f *testing.F) {
	login := &msg.Login{Version: "0.71.0", RunID: "alpha", Metas: map[string]string{"token": "a.b.c", "tether_routes": `["/=http://a:80"]`}}
	f.Add(v1Encode(f, login))
	f.Add(v1Encode(f, &msg.NewWorkConn{RunID: "alpha"}))
	f.Add(v2Encode(f, []byte(`{"capabilities":{"message":{"codecs":["json"]}}}`), login))
	f.Add(v2Encode(f, nil, &msg.NewVisitorConn{RunID: "alpha"}))
	for _, in := range headerOnly() {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var op *opening
		var err error
		if alloc := allocated(func() { op, err = readOpening(bytes.NewReader(in), MaxOpeningSize) }); alloc > maxOpeningAlloc {
			t.Fatalf("reading %d bytes allocated %d bytes, want at most %d", len(in), alloc, maxOpeningAlloc)
		}
		if err != nil {
			return
		}
		conn, err := op.replay(readerConn{r: bytes.NewReader(nil)})
		if err != nil {
			return // a message frp cannot encode back (frp would not read it either)
		}
		replayed, err := io.ReadAll(conn)
		if err != nil {
			t.Fatal(err)
		}
		again, err := readOpening(bytes.NewReader(replayed), wire.DefaultMaxFramePayloadSize) // frp's bound
		if err != nil {
			t.Fatalf("the replay of an opening does not read back: %v", err)
		}
		if reflect.TypeOf(again.Msg) != reflect.TypeOf(op.Msg) {
			t.Fatalf("the replay reads back as %T, want %T", again.Msg, op.Msg)
		}
	})
}
