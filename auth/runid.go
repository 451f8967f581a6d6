package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
)

// maxRunIDLength is frp's bound on a run ID (validation.MaxRunIDLength).
const maxRunIDLength = 64

// ScopedRunID returns the frp run ID of a login of tunnel that asked for
// requested: one that only a login of the same tunnel can name.
//
// frp replaces a live control when a new login names its run ID, and
// admits work connections by run ID. So the run ID is what makes a
// reconnecting client take its own stale session over at once (a NAT
// dropped the old connection), while the sessions of other clients of the
// tunnel, with other run IDs, stay: a tether client names each of its
// connections ("<instance>-<slot>"), and a stock frpc sends back, when it
// reconnects, the run ID the server gave it at its first login. Scoping
// every run ID to the verified tunnel means no login can name, and so
// replace or feed, another tunnel's session.
//
// The result is "<tunnel>.<requested>" when that fits frp's 64 bytes and
// requested is made of letters, digits, '.', '-' and '_'; a run ID this
// function gave before (it already starts with "<tunnel>.") is kept as it
// is; an empty one (a stock frpc's first login) gets random hex; anything
// else is hashed into the room left.
func ScopedRunID(tunnel, requested string) string {
	prefix := tunnel + "."
	switch {
	case requested == "":
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		requested = hex.EncodeToString(b)
	case len(requested) > len(prefix) && requested[:len(prefix)] == prefix && runIDSafe(requested[len(prefix):]) &&
		len(requested) <= maxRunIDLength:
		return requested
	}
	if runIDSafe(requested) && len(prefix)+len(requested) <= maxRunIDLength {
		return prefix + requested
	}
	sum := sha256.Sum256([]byte(tunnel + "\x00" + requested))
	h := hex.EncodeToString(sum[:])
	if room := maxRunIDLength - len(prefix); room >= 16 {
		return prefix + h[:min(room, len(h))]
	}
	// A tunnel name too long to leave room for a suffix: the hash of both,
	// which is as unique, though not recognisable as the tunnel's.
	return h[:maxRunIDLength]
}

func runIDSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '-', c == '_':
		default:
			return false
		}
	}
	return s != ""
}
