package auth_test

import (
	"testing"

	"github.com/tether-dev/tether/auth"
)

// BenchmarkVerify measures checking one login's token, per signing
// algorithm tether accepts: the cost every login (and every reconnect
// after a replica's restart) pays on the server.
func BenchmarkVerify(b *testing.B) {
	for _, alg := range []auth.Algorithm{auth.EdDSA, auth.ES256, auth.RS256} {
		b.Run(string(alg), func(b *testing.B) {
			k := newKeyPair(b, alg, 0)
			v := verifier(b, auth.NewStaticKeySource(keySet(b, k.pubPEM)), nil)
			token := mint(b, k, claims(), map[string]any{"kid": k.kid()})
			if _, err := v.Verify(token); err != nil {
				b.Fatalf("a valid %s token: %v", alg, err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(token); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
