package tunnel

import (
	"errors"
	"io"

	"github.com/tether-dev/tether/internal/copybuf"
)

// MaxBulkWrite is the most Copy writes to a stream at once, and so the
// largest yamux data frame a bulk transfer makes. A frame costs, whatever
// its size, a hand-over to the session's send loop, a TCP write and a
// wake-up of the peer's reader, so larger frames cost less per byte; but
// hashicorp/yamux (v0.1.2) copies each frame's body into a buffer of the
// session's send loop, which keeps the size of the largest frame for the
// session's life.
const MaxBulkWrite = 512 << 10

// Copy buffers: Copy reads into a large one (MaxBulkWrite) while its source
// has more ready than a small one holds, and into the small one otherwise,
// so that a stream that idles (a kept-alive connection) or trickles
// (server-sent events) holds only the small one.
const smallCopyBuffer = 32 << 10

var copyBuffers = copybuf.New(smallCopyBuffer, MaxBulkWrite)

// Copy copies src to dst until src ends, as io.Copy does, in writes as
// large as what src has ready, up to MaxBulkWrite: a read that fills the
// small buffer says more is waiting, and the next reads go to a large one,
// until a read the small one could have held says src has caught up (its
// next read may wait) and the large one goes back to its pool.
//
// It never hands the copy to src's WriteTo or dst's ReadFrom: between a TCP
// connection and a stream, which cannot splice, those copy through a
// 32 KiB buffer allocated per call.
func Copy(dst io.Writer, src io.Reader) (int64, error) {
	buf := copyBuffers.Get()
	defer buf.Release()
	var written int64
	for {
		b := buf.Bytes()
		n, err := src.Read(b)
		if n > 0 {
			w, werr := dst.Write(b[:n])
			written += int64(w)
			if werr == nil && w < n {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				return written, werr
			}
		}
		if errors.Is(err, io.EOF) {
			return written, nil
		}
		if err != nil {
			return written, err
		}
		buf.Adapt(n)
	}
}
