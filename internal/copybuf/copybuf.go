// Package copybuf lends copy buffers that follow what the source has ready.
// A copy reads into a small buffer, into a large one while its reads fill
// the small one, and back into the small one once a read the small one
// could have held says the source has caught up (its next read may wait):
// a copy that idles (a kept-alive connection) or trickles (an event stream
// open for hours) holds only the small buffer, and a bulk one reads and
// writes in large pieces.
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

// Get lends a Buffer, small to begin with; Release gives it back.
func (p *Pools) Get() Buffer {
	return Buffer{pools: p, small: p.small.Get().(*[]byte)}
}

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
	return *b.small
}

// Adapt takes the size of the read into Bytes just done and picks the
// buffer for the next one.
func (b *Buffer) Adapt(n int) {
	switch {
	case b.large == nil && n == len(*b.small):
		b.large = b.pools.large.Get().(*[]byte)
	case b.large != nil && n <= b.pools.smallSize:
		b.pools.large.Put(b.large)
		b.large = nil
	}
}

// Release gives the buffers back to their pools.
func (b *Buffer) Release() {
	if b.large != nil {
		b.pools.large.Put(b.large)
		b.large = nil
	}
	b.pools.small.Put(b.small)
	b.small = nil
}
