// Package webhook stores the requests of buffered routes that cannot reach
// their tunnel, answers them 202 Accepted, and delivers them in order when
// the tunnel is back: store and forward, so that a Git provider's webhook
// is not lost while a customer's cluster is away (GitHub does not retry a
// failed delivery; GitLab disables a hook that keeps failing).
//
// A Forwarder sits on the buffer package's durable store (bbolt in
// --data-dir, or Redis shared by the replicas) and on the registry's
// remembered routes. Its interface to the server is three things the server
// hands in (the Backing, the Routes, a Sender) and six calls.
//
// # Wiring it into the server
//
// At start, after the registry and the data directory are open:
//
//	backing, err := registry.BackingFor(reg, store)     // store: registry.OpenStore(--data-dir), or nil
//	routes, err := registry.NewRoutes(registry.RoutesConfig{Retention: cfg.BufferRetention}, backing, log)
//	fw, err := webhook.New(webhook.Config{
//		Buffer: buffer.Config{
//			Retention:     cfg.BufferRetention,     // --buffer-retention (default 72h)
//			MaxRequests:   cfg.BufferMaxRequests,   // --buffer-max-requests (1000)
//			MaxBytes:      cfg.BufferMaxBytes,      // --buffer-max-bytes (64 MiB)
//			MaxTotalBytes: cfg.BufferMaxTotalBytes, // --buffer-max-total-bytes (1 GiB)
//		},
//		MaxBody:         cfg.BufferMaxBody,   // --buffer-max-body (10 MiB)
//		BodyIdleTimeout: cfg.BodyIdleTimeout, // --body-idle-timeout, as for every body
//	}, backing, routes, sender, log)
//
// New validates the configuration (every problem, naming the flags) and
// starts nothing. With neither --data-dir nor a Redis registry it fails
// with buffer.ErrDisabled, whose text the server logs once at Info; the
// server then keeps a nil *Forwarder, on which Offer, Kick and Summaries
// do nothing, and mounts no endpoints nor collector for it. Then, under
// the server's errgroup: routes.Run(ctx) and fw.Run(ctx); and
//
//	fw.Register(adminMux, s.requireAdminToken)  // GET/DELETE /api/tunnels/{name}/buffer, …/{id}, POST …/{id}/retry
//	s.metrics.reg.MustRegister(fw.Collector())
//
// On each login of a tunnel's session: routes.Remember(name, specs) with
// the route specs the login advertised (proxy.Route.String of each; none
// for a stock frpc); when the tunnel starts being served here (a route
// registered), fw.Kick(name). When the last session of the tunnel here
// ends: routes.Left(name). /api/tunnels and tether status take fw.Summaries(ctx)
// (one store round trip for all tunnels), and list the tunnels that have a
// queue but no session too.
//
// On the public entry, for a request from a caller (not one another replica
// forwarded: the replica that forwarded it offers it), inside the request's
// slot (so the entry's per-tunnel and per-caller caps bound the bodies
// being read), and with its body not yet read by anyone: where the entry
// would answer 503 tunnel_down or 502 tunnel_disconnected (no session
// took any of the request), and where a session's client answered 502
// upstream_unreachable before any of the body was sent, the entry calls
// fw.Offer(w, r, name) first and answers as today only when Offer returns
// false. The upstream_unreachable case is offered by the replica whose
// session found the upstream away, for a request another replica forwarded
// too (the store is shared; the 202 goes back through the replica the
// caller reached); a delivery from the buffer is never offered again.
//
// The Sender is the entry's own way through a session here, minus the
// public part: Serves is "a session here serves the tunnel" and does not
// block; Send picks a session here as the entry does, serves the request
// through its router (Host set to the tunnel's host, X-Forwarded-* left as
// stored), reads the answer's status and, from tether's own answers,
// X-Tether-Error, discards the answer's body, and returns ErrNotServed when
// no session here took the request before any of it was sent.
//
// On stop, after the public entry stopped taking requests: cancel Run's ctx
// (deliveries stop and give their leases back), wait for it, fw.Close();
// then the routes (Run, Close), then the data directory's store.
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
// Past a quota (--buffer-max-requests, --buffer-max-bytes of the tunnel,
// --buffer-max-total-bytes of all) or the pending bound it answers 503
// with X-Tether-Error: buffer_full and a sentence naming the tunnel and
// the flag to raise; in every other case it answers nothing, and the
// caller gives today's answer (with Connection: close when Offer read part
// of the body: a body that stalled ends with its connection). What is
// stored of the headers, credentials included, and why, is in Offer's doc.
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
