// Package registry tells the replicas of `tether server` that sit behind one
// L4 load balancer which of them hold sessions of a tunnel, so that any
// replica can forward a request for a tunnel it does not hold to one that
// does; and it keeps the other state the replicas share: revocations and
// the routes each tunnel last advertised.
//
// It knows tunnel names, token IDs and replicas only: which replica holds at
// least one session of tunnel N, at which peer address, since which epoch;
// which tunnels and tokens are revoked; which routes a tunnel advertised.
// Sessions, logins, forwarding and HTTP are the server's business: it calls
// Revoked at each login and closes the sessions a change covers (Changed).
//
//	reg, err := registry.Open(registry.Config{
//		URL:     "redis://redis.tether.svc:6379/0", // or "memory" (the default)
//		Replica: "tether-server-0",
//		Addr:    "10.0.3.7:7443", // where the other replicas forward to
//	}, password, log) // password: ReadPassword(--registry-password-file), or ""
//	metrics.MustRegister(registry.NewCollector(reg))
//	go reg.Run(ctx)                // until ctx ends; then releases what it holds
//	reg.Hold("acme")               // the first session of tunnel acme here
//	peers := reg.Holders("acme")   // the other replicas holding acme: a map lookup
//	err = reg.Wait(reqCtx, "acme") // nobody holds it: wait briefly for a client to reconnect
//	reg.Release("acme")            // the last session of acme here is gone
//
// Two implementations share the Registry interface. Memory is the default
// for a single replica: it knows only itself. Redis shares the holds of every
// replica through one Redis server (a standalone server, or the primary of a
// failover pair behind one address; Redis Cluster is not supported).
//
// # The request path never waits on Redis
//
// Hold and Release change local state and wake a background loop that
// writes to Redis; they never block, so a login never waits on Redis.
// Holders, Wait and Snapshot read a local cache that a pub/sub subscription
// keeps current, and that is rebuilt by a full SCAN whenever the subscription
// (re)connects.
//
// # Failures
//
// Each replica refreshes its entries every Config.Refresh, with a TTL of
// Config.TTL, and publishes a liveness beat after each refresh. A replica
// that dies leaves nothing behind: its keys expire in Redis, and the other
// replicas drop it from their caches when no beat came for a TTL while Redis
// kept answering them (a ping proves that when the channel is quiet); a
// Redis that stops answering says nothing of the others. So while Redis is
// away, every replica keeps the last view it had of the others, keeps the
// state it wants to write, and retries in the background. When Redis
// returns, even empty (a restart without persistence, a failover to a fresh
// server), each replica writes again every entry it holds and announces it,
// and the caches resync. Redis errors are logged at Warn once per outage,
// the recovery at Info.
//
// # Keys and messages
//
// Every key and the channel start with Config.Prefix (default "tether:"),
// so deployments with different prefixes share one Redis without seeing
// each other:
//
//	{prefix}tunnel:{tunnel}:{replica}   string "{epoch} {addr}", PX TTL: replica holds tunnel
//	{prefix}events                      pub/sub channel of JSON events
//
// A replica ID contains no ':', so the last ':' of a key separates the
// tunnel from the replica. Events are {"op":"hold"|"release", "tunnel",
// "replica", "addr", "epoch", "ttl_ms"} and the beat {"op":"beat",
// "replica", "addr", "ttl_ms", "tunnels"}, whose count of held tunnels lets
// a cache that missed an event notice it and resync. A Lua script writes the
// holds: it renews a key that already holds the value, and otherwise sets it
// and publishes the hold event in the same step. A release is a Lua
// compare-and-delete on the epoch, so a release that arrives late never
// erases a newer hold of the same tunnel by the same replica ID (a client
// that reconnected at once, a pod restarted under the same name). A replica
// deletes the keys that an earlier process left under its ID. Two live
// processes must not share a replica ID: each would overwrite the other's
// entries.
//
// # Shared state: revocations and remembered routes
//
// Backing says where they live: with a Redis registry in its Redis (its
// RedisConn), on a single replica with --data-dir in the Store (one bbolt
// file, DIR/tether.db, 0600, a bucket per kind, each write fsynced before
// the call returns; the webhook buffer keeps its bucket there too), and
// otherwise in memory, lost with the process (Backing.Durable says so, for
// the server to warn at start).
//
//	store, err := registry.OpenStore(dataDir) // only with --data-dir
//	b, err := registry.BackingFor(reg, store)  // Redis, the store, or memory
//	revs, err := registry.NewRevocations(b, log)
//	go revs.Run(ctx)                               // follows the other replicas; prunes ended revocations
//	rev, ok := revs.Revoked(tunnel, jti, original) // at every login: a map lookup, no lock
//	routes, err := registry.NewRoutes(registry.RoutesConfig{Retention: 72 * time.Hour}, b, log)
//	go routes.Run(ctx)                             // writes behind Remember and Left
//	routes.Remember("acme", specs)                 // at each login
//	rem, ok, err := routes.Lookup(ctx, "acme")     // may a request for acme be buffered?
//
// Revocations live in every replica's memory as an immutable set that a
// change replaces. In Redis a revocation is a field of a hash; each change is
// one Lua script that writes, increments a version and publishes it, and
// each replica reloads the hash when it hears of a new version or, every
// second, finds one (a missed message, a reconnect): a replica learns a
// change within about a second while Redis answers it. If Redis comes back
// without the version (restarted without persistence), the first replica to
// notice writes its copy back, so a revoked tunnel does not come back; run
// Redis with AOF all the same.
//
// Remembered routes are written behind Remember (each login) and Left (the
// tunnel's last session here ended) by Run, and rewritten while the tunnel
// has a session here, so that a tunnel served for longer than the retention
// is still known when it goes down. In Redis each is a key that expires with
// the retention; Lookup reads it (one round trip, only on the path of a
// request for a tunnel that is down).
//
//	{prefix}revocations           hash: ID → JSON revocation
//	{prefix}revocations:version   integer: incremented by every change
//	{prefix}revocations:events    pub/sub channel: the new version
//	{prefix}routes:{tunnel}       string: JSON routes and times, PX the retention
//
// With Redis ACLs, the registry's user needs the keys {prefix}*, the channels
// {prefix}events and {prefix}revocations:events, and the commands GET, SET,
// PEXPIRE, DEL, PTTL, SCAN, HGETALL, MULTI, EXEC, PUBLISH, SUBSCRIBE, PING,
// EVAL, EVALSHA, HELLO and CLIENT SETNAME.
package registry
