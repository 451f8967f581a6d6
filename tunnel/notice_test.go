package tunnel

import (
	"bytes"
	"strings"
	"testing"
)

func TestNoticeRoundTrip(t *testing.T) {
	for _, n := range []Notice{
		{Kind: NoticeHello, Replica: "tether-server-0", Session: "0123abcd"},
		{Kind: NoticeMove, Replica: "r", Session: "s"},
		// A token notice carries the longest token a server accepts.
		{Kind: NoticeToken, Replica: "r", Session: "s", Token: strings.Repeat("t", 8<<10)},
	} {
		var buf bytes.Buffer
		if err := WriteNotice(&buf, n); err != nil {
			t.Fatal(err)
		}
		if !IsNotice(buf.Bytes()[0]) {
			t.Errorf("first byte %q is not a notice's", buf.Bytes()[0])
		}
		got, err := ReadNotice(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if got != n {
			t.Errorf("got %+v, want %+v", got, n)
		}
	}
}

func TestNoticeRefusesWhatIsNotOne(t *testing.T) {
	var dial bytes.Buffer
	if err := WriteDialRequest(&dial, "app:80"); err != nil {
		t.Fatal(err)
	}
	if IsNotice(dial.Bytes()[0]) {
		t.Fatal("a dial request reads as a notice")
	}
	if _, err := ReadNotice(&dial); err == nil || !strings.Contains(err.Error(), "not a tether notice") {
		t.Errorf("reading a dial request as a notice: %v, want 'not a tether notice'", err)
	}
	long := []byte{'N', 1, 0xff, 0xff}
	if _, err := ReadNotice(bytes.NewReader(long)); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Errorf("an oversized notice: %v, want 'too long'", err)
	}
	if err := WriteNotice(&bytes.Buffer{}, Notice{Kind: strings.Repeat("x", maxNotice)}); err == nil {
		t.Error("an oversized notice was written")
	}
}
