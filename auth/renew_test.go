package auth_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
)

func TestRenew(t *testing.T) {
	for _, alg := range []auth.Algorithm{auth.EdDSA, auth.ES256, auth.RS256} {
		t.Run(string(alg), func(t *testing.T) {
			platform := newKeyPair(t, auth.EdDSA, 0)
			renewer := newKeyPair(t, alg, 1)
			v := verifier(t, auth.NewStaticKeySource(keySet(t, platform.pubPEM, renewer.pubPEM)), func(c *auth.VerifierConfig) {
				c.Issuer, c.Audience = "platform", "tether"
			})
			issued, err := platform.signer.Issue(auth.IssueRequest{Tunnel: "acme", Account: "acct", Runtime: "rt",
				Issuer: "platform", Audience: []string{"tether"}, TTL: 30 * time.Minute}, now.Add(-20*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			first, err := v.Verify(issued)
			if err != nil {
				t.Fatal(err)
			}
			if first.Renews != "" || first.Lineage() != first.ID {
				t.Fatalf("an issued token's renews = %q, lineage %q; want none, and its own jti %q", first.Renews, first.Lineage(), first.ID)
			}

			renewed, err := renewer.signer.Renew(first, now)
			if err != nil {
				t.Fatal(err)
			}
			second, err := v.Verify(renewed)
			if err != nil {
				t.Fatalf("the renewal does not verify: %v", err)
			}
			if second.Tunnel != "acme" || second.Account != "acct" || second.Runtime != "rt" ||
				second.Issuer != "platform" || strings.Join(second.Audience, ",") != "tether" {
				t.Errorf("renewal claims = %+v; want those of %+v", second, first)
			}
			if !second.IssuedAt.Equal(now) || !second.ExpiresAt.Equal(now.Add(30*time.Minute)) {
				t.Errorf("renewal iat/exp = %v/%v; want %v and the same 30m lifetime", second.IssuedAt, second.ExpiresAt, now)
			}
			if second.ID == first.ID || second.Renews != first.ID || second.Lineage() != first.ID {
				t.Errorf("renewal jti %q renews %q; want a new jti renewing %q", second.ID, second.Renews, first.ID)
			}

			// The renewal of a renewal keeps the first token's jti, so
			// that revoking it still covers the whole line.
			third, err := renewer.signer.Renew(second, now.Add(25*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			later := verifier(t, auth.NewStaticKeySource(keySet(t, platform.pubPEM, renewer.pubPEM)), func(c *auth.VerifierConfig) {
				c.Now = func() time.Time { return now.Add(26 * time.Minute) }
			})
			c, err := later.Verify(third)
			if err != nil {
				t.Fatal(err)
			}
			if c.Renews != first.ID {
				t.Errorf("second renewal renews %q; want the first token's jti %q", c.Renews, first.ID)
			}
		})
	}
}

func TestRenewAt(t *testing.T) {
	c := &auth.Claims{Tunnel: "acme", IssuedAt: now, NotBefore: now, ExpiresAt: now.Add(90 * time.Minute)}
	if got, want := auth.RenewAt(c), now.Add(60*time.Minute); !got.Equal(want) {
		t.Errorf("RenewAt = %v, want %v: a third of the lifetime before exp", got, want)
	}
	c.NotBefore = time.Time{} // iat stands in
	if got, want := auth.RenewAt(c), now.Add(60*time.Minute); !got.Equal(want) {
		t.Errorf("RenewAt without nbf = %v, want %v", got, want)
	}
}

func TestRenewRefuses(t *testing.T) {
	k := newKeyPair(t, auth.EdDSA, 0)
	for _, tc := range []struct {
		name string
		c    auth.Claims
	}{
		{"no iat or nbf", auth.Claims{Tunnel: "acme", ExpiresAt: now.Add(time.Hour)}},
		{"too short", auth.Claims{Tunnel: "acme", IssuedAt: now, ExpiresAt: now.Add(10 * time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := k.signer.Renew(&tc.c, now)
			if !errors.Is(err, auth.ErrNotRenewable) || !strings.Contains(err.Error(), `"acme"`) {
				t.Errorf("Renew = %v; want ErrNotRenewable naming the tunnel", err)
			}
		})
	}
}

func TestCheckRenewalKey(t *testing.T) {
	platform := newKeyPair(t, auth.EdDSA, 0)
	renewer := newKeyPair(t, auth.ES256, 0)
	trusting := verifier(t, auth.NewStaticKeySource(keySet(t, platform.pubPEM, renewer.pubPEM)), func(c *auth.VerifierConfig) {
		c.Issuer, c.Audience = "platform", "tether"
	})
	if err := auth.CheckRenewalKey(renewer.signer, trusting); err != nil {
		t.Errorf("a trusted renewal key: %v", err)
	}
	other := verifier(t, auth.NewStaticKeySource(keySet(t, platform.pubPEM)), nil)
	err := auth.CheckRenewalKey(renewer.signer, other)
	if err == nil || !strings.Contains(err.Error(), "--jwt-public-key") || !strings.Contains(err.Error(), renewer.kid()) {
		t.Errorf("an untrusted renewal key: %v; want an error naming its kid and --jwt-public-key", err)
	}
}
