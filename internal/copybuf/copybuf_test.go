package copybuf

import "testing"

// TestBufferFollowsSource: reads that fill the small buffer move the copy to
// the large one, a read the small one could have held moves it back, and a
// read shorter than the small one says the source caught up.
func TestBufferFollowsSource(t *testing.T) {
	const small, large = 8, 64
	buf := New(small, large).Get()
	defer buf.Release()
	for i, step := range []struct {
		read         int // bytes the read into Bytes returned
		wantCaughtUp bool
		wantNext     int // len(Bytes()) after Adapt
	}{
		{read: 3, wantCaughtUp: true, wantNext: small},
		{read: small, wantCaughtUp: false, wantNext: large}, // more is waiting
		{read: large, wantCaughtUp: false, wantNext: large},
		{read: small + 1, wantCaughtUp: false, wantNext: large},
		{read: small, wantCaughtUp: false, wantNext: small}, // the small one would have done
		{read: small, wantCaughtUp: false, wantNext: large},
		{read: 0, wantCaughtUp: true, wantNext: small},
	} {
		if got := len(buf.Bytes()); i == 0 && got != small {
			t.Fatalf("first buffer holds %d bytes, want the small one (%d)", got, small)
		}
		if got := buf.Adapt(step.read); got != step.wantCaughtUp {
			t.Errorf("step %d: Adapt(%d) caught up = %v, want %v", i, step.read, got, step.wantCaughtUp)
		}
		if got := len(buf.Bytes()); got != step.wantNext {
			t.Errorf("step %d: after a read of %d, the next read gets %d bytes, want %d", i, step.read, got, step.wantNext)
		}
	}
}

// TestBufferReleasedWhileWaiting: a copy may give its buffers back while its
// source is quiet and read again afterwards; the Buffer borrows anew.
func TestBufferReleasedWhileWaiting(t *testing.T) {
	const small, large = 8, 64
	buf := New(small, large).Get()
	if buf.small != nil || buf.large != nil {
		t.Fatal("Get borrowed a buffer before the first read")
	}
	buf.Bytes()
	buf.Adapt(small) // now reading into the large one
	buf.Bytes()
	buf.Release()
	if buf.small != nil || buf.large != nil {
		t.Fatal("Release kept a buffer")
	}
	buf.Release() // a second Release is harmless
	if got := len(buf.Bytes()); got != small {
		t.Fatalf("after Release the next read gets %d bytes, want a small buffer (%d)", got, small)
	}
	buf.Release()
}
