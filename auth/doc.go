// Package auth decides who may run a tunnel. It verifies and issues the JWTs
// that name a tunnel, and adapts that check to frp's server-plugin protocol,
// where the embedded frps asks it about every Login and NewProxy.
//
// A token's sub is the tunnel name, a DNS label (see [ValidTunnelName]); the
// tunnel named N is served at N.<domain> and only there. Tokens are signed
// with Ed25519 (EdDSA, the default), ES256 or RS256 keys, or with an HS256
// secret when configured explicitly. The key decides the algorithm: a token
// whose alg is "none", or is not the algorithm of the key it names, is
// refused before any signature is checked.
//
// Verifying, on the server:
//
//	keys, err := auth.NewFileKeySource("/etc/tether/jwt.pub") // PEM or JWKS; reloaded when it changes
//	if err != nil { ... }
//	v, err := auth.NewVerifier(auth.VerifierConfig{Keys: keys, Audience: "tether"})
//	if err != nil { ... }
//	claims, err := v.Verify(token) // err is a *auth.RejectError with a Reason
//
// Serving frps's plugin calls, on a loopback listener whose address is given
// to frps as an HTTP plugin with the ops of [Plugin.Ops]:
//
//	p := auth.NewPlugin(v, registry, log, metrics)
//	go http.Serve(ln, p)
//
// Issuing, on the platform or with "tether token":
//
//	err := auth.GenerateKeyPair(auth.EdDSA, "jwt.key", "jwt.pub")
//	s, err := auth.LoadSigner("jwt.key")
//	token, err := s.Issue(auth.IssueRequest{Tunnel: "acme", TTL: 24 * time.Hour}, time.Now())
//
// What it deliberately does not do: fetch keys over the network (a JWKS is a
// file, typically a mounted Kubernetes Secret or ConfigMap); keep a token
// revocation list (tokens are short-lived, and the registry ends a tunnel's
// older session when a new one logs in); accept any alg other than EdDSA,
// ES256, RS256 and HS256; or log. Verification is a pure function of the
// token, the keys and the clock, and every refusal is a [*RejectError] whose
// text is safe to send to the client; logging is left to the caller, and the
// [Plugin] logs its decisions, never a token.
//
// The verifier core (tokens, keys, issuing) does not depend on frp: only
// plugin.go touches frp's types, so the verifier is tested and fuzzed on its
// own.
package auth
