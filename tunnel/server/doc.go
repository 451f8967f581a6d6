// Package server is tether's tunnel server: it accepts tunnel clients,
// verifies who they are, and serves each tunnel's HTTP route at
// <tunnel>.<domain>.
//
// The engine is an embedded frp server (frp.go). In front of it sits the
// tunnel port, package gate (TLS or wss, yamux, one identity per
// connection, and limits on what a connection may cost before it has
// logged in), behind it the auth plugin (package auth: JWT logins, route
// rules), and beside it the public HTTP entry (entry.go, with its own caps
// on connections, request heads and bodies, entrylimits.go and
// bodywatch.go, and fair shares of each tunnel's requests,
// requestslots.go) and the admin endpoints (admin.go).
//
//	srv, err := server.New(server.Config{
//		TunnelAddr: ":7000", HTTPAddr: ":8080", AdminAddr: "127.0.0.1:7700",
//		Domain: "tunnels.example.com",
//	}, verifier, log)
//	err = srv.Run(ctx) // until ctx ends; then drains
//
// Server is the configuration and the wiring, static after New; Serve
// builds a replica (server.go), what exists while it serves, and drains it
// when ctx ends (drain.go).
//
// A tunnel client's login, in the order it runs, one package after the
// other:
//
//  1. The gate admits: it reads the frp Login on a connection's first
//     stream. A probe is answered there, with what Probe says (probe.go). A
//     login is admitted once per connection, stamped with the session's ID
//     and handed to frp (gate.Host's HandOver, host.go).
//  2. The auth plugin verifies: frp asks it (auth.Plugin) over loopback; it
//     verifies the token, scopes the client's run ID to the tunnel
//     (auth.ScopedRunID) and calls members.Login (members.go).
//  3. members binds and joins: Login binds the session to the tunnel
//     (gate.Session.Bind) and makes it a member of the tunnel here: its
//     routes checked, its handler made (it builds the router at the first
//     request, reach.go), the tunnel's members joined (a live session with
//     the same run ID is the client's own stale one, and is replaced), its
//     life bounded by its token, and a tether client told which replica it
//     reached (a hello notice).
//  4. The route serves: frp accepts the login, and the client registers its
//     route. The plugin checks it and puts it in the tunnel's group;
//     members.AddRoute makes the member serve requests, and the registry
//     learns that this replica serves the tunnel. The entry now picks it
//     (members.pick) and delivers requests through its handler.
//  5. The gate reports the end: the session ends with its connection, and
//     the gate tells the host once (gate.Host's Ended).
//  6. members forget: the member leaves, and the registry learns when the
//     tunnel's last member here is gone.
//
// A tunnel may have several sessions (several client processes, or one
// client's --connections), and several replicas may serve one domain behind
// an L4 load balancer: they share a registry of which replica serves which
// tunnel (package registry: in memory for one replica, Redis for several),
// and each forwards a request for a tunnel it does not serve to one that
// does, over its peer listener: TLS between replicas, each authenticated by
// a certificate made from the shared peer secret (peer.go, peertls.go). On
// shutdown a replica drains: its clients move to other replicas before
// their sessions here close.
//
// It does not terminate TLS for the public HTTP entry (put an ingress or load
// balancer in front).
package server
