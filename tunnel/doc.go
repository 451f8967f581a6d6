// Package tunnel holds what both ends of a tether tunnel share, the server
// (tunnel/server) and the client (tunnel/client):
//
//   - the session: yamux's configuration, the client's keep-alive and the
//     pings both ends send (MuxConfig, KeepAlive, PingWithin), the coalescing
//     of small frames into one write (CoalesceFrames), and ConnListener, which
//     hands streams to the embedded frp as a listener (mux.go);
//   - the dial protocol on the streams the server opens to reach one of the
//     client's upstreams (dial.go), and the copy that moves bulk bodies over
//     streams in frames of MaxBulkWrite (copy.go);
//   - the notices the server sends a client about its session: hello, move,
//     token (notice.go);
//   - the login's metadata keys, frp's message and frame sizes, the reply to
//     a login probe (`tether diagnose`) and certificate fingerprints
//     (shared.go);
//   - the bridge of frp's process-wide logger into zap, which main sets once
//     (frplog.go).
package tunnel
