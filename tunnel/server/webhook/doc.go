// Package webhook stores the requests of buffered routes that cannot reach
// their tunnel, answers them 202 Accepted, and delivers them in order when
// the tunnel is back: store and forward, so that a Git provider's webhook
// is not lost while a customer's cluster is away (GitHub does not retry a
// failed delivery; GitLab disables a hook that keeps failing).
//
// A Forwarder sits on the buffer package's durable store (bbolt in
// --data-dir, or Redis shared by the replicas) and on the registry's
// remembered routes. The server wires it in a few lines:
//
//	fw, err := webhook.New(cfg, backing, routes, server, log) // buffer.ErrDisabled: say "buffering off" once
//	go fw.Run(ctx)                  // deliveries, the sweep, expiry; returns when all stopped
//	fw.Offer(w, r, tunnel)          // on the way to 503 tunnel_down / 502: true if it answered
//	fw.Kick(tunnel)                 // a session of tunnel logged in here
//	fw.Register(adminMux, requireAdminToken)
//	metrics.MustRegister(fw.Collector())
//	fw.Summaries(ctx)               // per tunnel, for /api/tunnels and tether status
//
// # Accepting
//
// Offer takes a request that could not be delivered. It stores it only
// when everything says the tunnel's owner wants it stored: the tunnel was
// seen within the retention, the route its last login advertised for the
// path has the buffer option (proxy.Buffered), the method is POST, PUT or
// PATCH and the body at most Config.MaxBody. It then reads the body (each
// read within Config.BodyIdleTimeout, the bodies being read on this
// replica within Config.MaxPendingBytes, a tunnel's within a quarter of
// it), stores the request, and only once the store confirmed the write
// answers 202 with X-Tether-Buffered and {"id", "tunnel", "queued_at"}.
// Past a quota it answers 503 buffer_full; in every other case it answers
// nothing, and the caller gives today's answer. What is stored of the
// headers, and why, is in Offer's doc.
//
// # Delivering
//
// Kick, and a sweep every Config.SweepInterval, start a worker for each
// tunnel served on this replica whose queue waits, at most
// Config.MaxDeliveries at once. A worker takes the tunnel's lease (one
// deliverer per tunnel across the replicas), renews it while it works, and
// sends the queue oldest first, one request at a time, through the
// Sender: the request as stored, plus X-Tether-Delivery (its ID) and
// X-Tether-Attempt (the tries that reached the upstream or its client, this
// one included). The upstream's 2xx or 3xx delivers it (removed); a 4xx
// rejects it (kept aside, listed, requeued through the admin API); a 5xx,
// a failure of tether's own on the way (upstream unreachable, timeout,
// a session that died) retries after a backoff (Config.RetryFirst doubling
// to Config.RetryMax, jittered), holding back the newer requests, until
// the retention drops it. A worker stops when the queue is empty, the
// tunnel is no longer served here, the lease is lost, or Run's ctx ends;
// it gives the lease back as it stops. A replica that dies mid-delivery
// leaves its lease to expire (the buffer's lease TTL), and the next sweep
// of a replica that serves the tunnel takes over: at least once, the
// request in flight possibly twice.
//
// Deliveries run on the workers' goroutines, never on a public request's:
// normal traffic for the tunnel goes straight to it while its queue
// drains, and is not ordered with it.
//
// # What it does not do
//
// It does not decide that a request could not be delivered, nor route a
// delivery: the server does both (Sender). It does not hold bodies in
// logs, listings or metrics: the admin API lists IDs, methods, paths
// without query, sizes and delivery state only, and logs name the same.
// It keeps no order between a tunnel's buffered requests and the ones
// that reached it directly.
package webhook
