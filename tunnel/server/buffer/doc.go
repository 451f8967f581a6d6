// Package buffer stores webhooks that could not reach their tunnel, so that
// the server can answer 202 Accepted and deliver them, in order, when the
// tunnel is back.
//
// It is a durable per-tunnel FIFO of requests (method, request URI, headers,
// body) with their delivery state, in one of two stores that
// registry.Backing names:
//
//   - on a single replica with --data-dir, the embedded bbolt file
//     (registry.Store), in the bucket "buffer"; Append returns after the
//     transaction is fsynced;
//   - with a Redis registry, Redis, shared by the replicas; Append returns
//     after Redis ran the write. Redis keeps it across its own restart only
//     with AOF (appendonly yes; appendfsync always loses nothing, everysec
//     at most the last second), and keeps it at all only with
//     maxmemory-policy noeviction: bodies live in Redis's memory, up to
//     Config.MaxTotalBytes.
//
// With neither, Open returns ErrDisabled: buffering is off.
//
//	buf, err := buffer.Open(buffer.Config{}, backing, log) // defaults: 72h, 1000 requests, 64 MiB a tunnel
//	go buf.Run(ctx)                                      // drops what outlived the retention
//	e, err := buf.Append(ctx, &buffer.Request{...})      // errors.Is(err, buffer.ErrFull) → 503 buffer_full
//	lease, err := buf.Acquire(ctx, "acme")               // one deliverer per tunnel, across replicas
//	req, err := lease.Next(ctx)                          // the oldest queued request, body included
//	err = lease.Ack(ctx, req.ID)                         // delivered: gone
//
// # Order, IDs and states
//
// IDs sort in the order the store accepted the requests: the store's clock
// in milliseconds (12 hex digits), a dash, and a sequence (6 hex digits)
// that orders requests within one millisecond and never goes back, even if
// the clock does. A request is queued until delivered (Ack: removed),
// retried later (Retry: Attempts and LastError kept, NextAttemptAt set) or
// refused by its upstream (Reject: moved to the tunnel's rejected list,
// where it stays visible until dropped, requeued or expired). Next returns
// the oldest queued request: a request waiting for its retry holds back the
// newer ones, so that a tunnel's webhooks arrive in order. Requeue puts a
// rejected request back at its place by ID.
//
// # One deliverer per tunnel
//
// Acquire takes a tunnel's lease for Config.LeaseTTL (Redis: SET NX PX),
// which its holder renews; another replica takes it over once the holder
// stopped renewing. Each lease has a fencing number, and every change a
// holder makes (Ack, Retry, Reject) checks in the same atomic step that it
// still holds that lease: a holder that lost it can no longer change the
// queue, though the request it was delivering may be delivered again by the
// next holder (at least once; the ID lets the receiver drop duplicates).
//
// # Bounds
//
// Per tunnel at most Config.MaxRequests requests and Config.MaxBytes bytes,
// queued and rejected together, and at most Config.MaxTotalBytes for all
// tunnels (with Redis: all replicas); past them Append fails with an error
// that matches ErrFull, checked and written in one atomic step. A request's
// size counts its method, URI, header names and values, and body. Requests
// older than Config.Retention are dropped by Run, and counted.
//
// # What it does not do
//
// It does not decide which requests to buffer (the server does, from the
// route's buffer option and registry.Routes), does not deliver them (the
// server's deliverer does, holding the lease), and keeps no metrics of its
// own beyond Counts. Bodies, headers and query strings are tenant data: it
// never logs them, and List and Stats return neither.
//
// # Keys in Redis
//
// Under the registry's prefix P (default "tether:"):
//
//	P buffer:tunnels                 set of the tunnels with stored requests
//	P buffer:bytes                   bytes stored for all tunnels
//	P buffer:last                    "MS SEQ" of the last ID
//	P buffer:fence                   counter of lease fencing numbers
//	P buffer:{tunnel}:queued         sorted set (score 0, by ID) of queued IDs
//	P buffer:{tunnel}:rejected       sorted set of rejected IDs
//	P buffer:{tunnel}:meta           hash ID → JSON metadata (no body)
//	P buffer:{tunnel}:payload        hash ID → URI, headers and body
//	P buffer:{tunnel}:stats          hash: n, bytes
//	P buffer:{tunnel}:lease          "FENCE REPLICA", PX the lease TTL
//
// Every change is one Lua script, so a quota check and its write, or a
// lease check and its change, are one atomic step. (Redis streams, the
// obvious structure, cannot change an entry's attempts nor put a requeued
// request back in its place.) With ACLs the user needs these keys and
// EVAL, EVALSHA, ZRANGE, ZCARD, HGET, HGETALL, SMEMBERS, MULTI and EXEC.
package buffer
