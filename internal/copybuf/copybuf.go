// Package copybuf lends copy buffers that follow what the source has ready.
// A copy reads into a small buffer, into a large one while its reads fill
// the small one, and back into the small one once a read the small one
// could have held says the source has caught up (its next read may wait):
// a copy that idles (a kept-alive connection) or trickles (an event stream
// open for hours) holds only the small buffer, and a bulk one reads and
// writes in large pieces. A copy whose source can wait for bytes without a
// buffer holds none while it waits: it releases its Buffer when the source
// caught up, and the Buffer borrows again at the next read.
package copybuf

import "sync"

// Pools lends the buffers of one pair of sizes.
type Pools struct {
	smallSize    int
	small, large sync.Pool // of *[]byte, so that Put does not allocate
}

// New returns pools of small and large buffers of the given sizes.
func New(small, large int) *Pools {
	p := &Pools{smallSize: small}
	p.small.New = func() any { b := make([]byte, small); return &b }
	p.large.New = func() any { b := make([]byte, large); return &b }
	return p
}

// Get lends a Buffer, small to begin with. It borrows from the pools at its
// first Bytes; Release gives back what it holds.
func (p *Pools) Get() Buffer { return Buffer{pools: p} }

// Buffer is one copy's buffer.
type Buffer struct {
	pools        *Pools
	small, large *[]byte
}

// Bytes is the buffer to read into next.
func (b *Buffer) Bytes() []byte {
	if b.large != nil {
		return *b.large
	}
	if b.small == nil {
		b.small = b.pools.small.Get().(*[]byte)
	}
	return *b.small
}

// Adapt takes the size of the read into Bytes just done and picks the
// buffer for the next one. It reports whether the source has caught up: it
// had less ready than the small buffer holds, so the next read may wait.
func (b *Buffer) Adapt(n int) (caughtUp bool) {
	switch {
	case b.large == nil && n == b.pools.smallSize:
		b.large = b.pools.large.Get().(*[]byte)
	case b.large != nil && n <= b.pools.smallSize:
		b.pools.large.Put(b.large)
		b.large = nil
	}
	return n < b.pools.smallSize
}

// Release gives the buffers back to their pools. The Buffer may be used
// again: it borrows anew at its next Bytes.
func (b *Buffer) Release() {
	if b.large != nil {
		b.pools.large.Put(b.large)
		b.large = nil
	}
	if b.small != nil {
		b.pools.small.Put(b.small)
		b.small = nil
	}
}
