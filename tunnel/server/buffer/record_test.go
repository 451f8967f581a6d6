package buffer

import (
	"net/http"
	"slices"
	"testing"
)

// TestNextID: IDs grow with the clock, order the requests of one
// millisecond, and never go back when the clock does.
func TestNextID(t *testing.T) {
	for _, tc := range []struct {
		name          string
		lastMS, nowMS int64
		lastSeq       uint32
		wantMS        int64
		wantSeq       uint32
	}{
		{"later", 1000, 1001, 7, 1001, 0},
		{"same millisecond", 1000, 1000, 7, 1000, 8},
		{"clock went back", 1000, 900, 7, 1000, 8},
		{"sequence full", 1000, 1000, maxSeq, 1001, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, seq := nextID(tc.lastMS, tc.lastSeq, tc.nowMS)
			if ms != tc.wantMS || seq != tc.wantSeq {
				t.Fatalf("got %d-%d, want %d-%d", ms, seq, tc.wantMS, tc.wantSeq)
			}
			if a, b := formatID(tc.lastMS, tc.lastSeq), formatID(ms, seq); a >= b {
				t.Errorf("ID %s does not sort after %s", b, a)
			}
		})
	}
	id := formatID(1764300000123, 5)
	if ms, seq, ok := parseID(id); !ok || ms != 1764300000123 || seq != 5 {
		t.Errorf("parseID(%s): got %d, %d, %v", id, ms, seq, ok)
	}
	ids := []string{idBefore(1764300000123), id, formatID(1764300000122, maxSeq), formatID(1764300000124, 0)}
	slices.Sort(ids)
	if want := []string{formatID(1764300000122, maxSeq), idBefore(1764300000123), id, formatID(1764300000124, 0)}; !slices.Equal(ids, want) {
		t.Errorf("idBefore does not sort between the milliseconds: %q", ids)
	}
	for _, bad := range []string{"", "x", "0000000003e8_000000", "0000000003e8-00000g"} {
		if _, _, ok := parseID(bad); ok {
			t.Errorf("parseID(%q) accepted it", bad)
		}
	}
}

func TestPayloadRoundTrip(t *testing.T) {
	h := http.Header{"A": {"1", ""}, "Empty": {}, "X-Hub-Signature-256": {"sha256=00"}}
	body := []byte("\x00\xff{\"a\":1}\r\n")
	uri, gotH, gotBody, err := decodePayload(encodePayload("/p?q=1", h, body))
	if err != nil {
		t.Fatal(err)
	}
	if uri != "/p?q=1" || string(gotBody) != string(body) || len(gotH) != 3 || !slices.Equal(gotH["A"], h["A"]) || len(gotH["Empty"]) != 0 {
		t.Errorf("got %q %v %q", uri, gotH, gotBody)
	}
}

// FuzzDecodePayload: a corrupt stored payload is an error, never a panic or
// a huge allocation.
func FuzzDecodePayload(f *testing.F) {
	f.Add(encodePayload("/webhooks?x=1", http.Header{"K": {"v"}}, []byte("body")))
	f.Add([]byte{payloadVersion, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		uri, h, body, err := decodePayload(b)
		if err != nil {
			return
		}
		uri2, h2, body2, err := decodePayload(encodePayload(uri, h, body))
		if err != nil || uri2 != uri || string(body2) != string(body) || len(h2) != len(h) {
			t.Errorf("decode(encode(decode(b))) differs from decode(b): %v", err)
		}
	})
}
