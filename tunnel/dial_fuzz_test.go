package tunnel

import (
	"bytes"
	"encoding/binary"
	"io"
	"runtime"
	"testing"
)

// The dial protocol is read by the client from the server and by the server
// from the client: each end parses what the other sends. The fuzzers check,
// for any bytes, that reading never panics, never reads (and so never
// allocates for) more than one field's bound, and that a message read back
// writes the same bytes; and, for any address or message, that what is
// written reads back the same.

// endless yields 'x' forever: a peer that announces a long field and keeps
// sending.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// prefix is the first n bytes that readBounded's reader yields for data.
func prefix(data []byte, n int) []byte {
	if n <= len(data) {
		return data[:n]
	}
	return append(bytes.Clone(data), bytes.Repeat([]byte("x"), n-len(data))...)
}

// maxMessage is the most a read of one message may consume: header and field.
const maxMessage = 4 + maxDialField

// readBounded runs read over data followed by an endless peer and fails the
// test if it consumed more than one message or, when the header announces
// a field over the bound, allocated for it. It returns how many bytes the
// read consumed.
func readBounded(t *testing.T, data []byte, read func(io.Reader) error) (consumed int, err error) {
	t.Helper()
	r := &countingReader{r: io.MultiReader(bytes.NewReader(data), endless{})}
	err = read(r)
	if r.n > maxMessage {
		t.Fatalf("read consumed %d bytes, want at most %d", r.n, maxMessage)
	}
	if len(data) >= 4 && binary.BigEndian.Uint16(data[2:4]) > maxDialField {
		// A read that trusted the header would allocate the announced
		// length, over maxDialField. ReadMemStats stops the world, so it
		// runs only for such inputs, and the reads are repeated so that
		// the fuzzing engine's own allocations weigh little.
		const runs = 16
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			_ = read(io.MultiReader(bytes.NewReader(data), endless{}))
		}
		runtime.ReadMemStats(&after)
		if perRead := (after.TotalAlloc - before.TotalAlloc) / runs; perRead > maxDialField {
			t.Fatalf("a read of a header announcing %d bytes allocated %d bytes, want at most %d",
				binary.BigEndian.Uint16(data[2:4]), perRead, maxDialField)
		}
	}
	return r.n, err
}

func FuzzDialRequest(f *testing.F) {
	var seed bytes.Buffer
	_ = WriteDialRequest(&seed, "argocd-server.argocd.svc:80")
	f.Add(seed.Bytes())
	f.Add([]byte{'D', dialVersion, 0, 0})
	f.Add([]byte{'D', dialVersion, 0xff, 0xff})
	f.Add([]byte{'D', 2, 0, 1, 'a'})
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Reading any bytes.
		var addr string
		consumed, err := readBounded(t, data, func(r io.Reader) (err error) {
			addr, err = ReadDialRequest(r)
			return err
		})
		if err == nil {
			// What was read writes back as the bytes it was read from.
			var again bytes.Buffer
			if err := WriteDialRequest(&again, addr); err != nil {
				t.Fatalf("address %q read back but does not write: %v", addr, err)
			}
			if read, got := prefix(data, consumed), again.Bytes(); !bytes.Equal(got, read) {
				t.Fatalf("request %x read as %q writes as %x", read, addr, got)
			}
		}

		// Writing the bytes as an address, and reading it back.
		var buf bytes.Buffer
		err = WriteDialRequest(&buf, string(data))
		if len(data) > maxDialField {
			if err == nil || buf.Len() != 0 {
				t.Fatalf("an address of %d bytes was written (%d bytes, %v); want an error and nothing written", len(data), buf.Len(), err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := ReadDialRequest(&buf)
		if err != nil || got != string(data) || buf.Len() != 0 {
			t.Fatalf("address %q read back as %q, %v (%d bytes left)", data, got, err, buf.Len())
		}
	})
}

func FuzzDialReply(f *testing.F) {
	var seed bytes.Buffer
	_ = WriteDialReply(&seed, DialRefused, "dial tcp 10.0.0.7:80: connect: connection refused")
	f.Add(seed.Bytes(), byte(DialRefused))
	f.Add([]byte{'R', byte(DialOK), 0, 0}, byte(DialOK))
	f.Add([]byte{'R', 0xff, 0xff, 0xff}, byte(0xff))
	f.Add([]byte{'D', 1, 0, 0}, byte(DialFailed))
	f.Fuzz(func(t *testing.T, data []byte, code byte) {
		var (
			gotCode DialCode
			msg     string
		)
		consumed, err := readBounded(t, data, func(r io.Reader) (err error) {
			gotCode, msg, err = ReadDialReply(r)
			return err
		})
		if err == nil {
			var again bytes.Buffer
			if err := WriteDialReply(&again, gotCode, msg); err != nil {
				t.Fatal(err)
			}
			if read, got := prefix(data, consumed), again.Bytes(); !bytes.Equal(got, read) {
				t.Fatalf("reply %x read as %d %q writes as %x", read, gotCode, msg, got)
			}
		}

		// Any code and message are written and read back; a message over
		// the bound is cut to it.
		var buf bytes.Buffer
		if err := WriteDialReply(&buf, DialCode(code), string(data)); err != nil {
			t.Fatal(err)
		}
		want := string(data[:min(len(data), maxDialField)])
		if n := binary.BigEndian.Uint16(buf.Bytes()[2:4]); int(n) != len(want) {
			t.Fatalf("reply header says %d bytes, want %d", n, len(want))
		}
		gotCode, msg, err = ReadDialReply(&buf)
		if err != nil || gotCode != DialCode(code) || msg != want || buf.Len() != 0 {
			t.Fatalf("reply %d %q read back as %d %q, %v (%d bytes left)", code, want, gotCode, msg, err, buf.Len())
		}
	})
}
