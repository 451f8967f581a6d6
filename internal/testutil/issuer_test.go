package testutil_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
)

func TestIssuer(t *testing.T) {
	iss := testutil.NewIssuer(t)
	c, err := iss.Verifier().Verify(iss.Token("acme", time.Hour))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if c.Tunnel != "acme" || c.Account != "acct-acme" || c.Runtime != "rt-acme" || c.KeyID != iss.KeyID() {
		t.Errorf("claims = %+v, want tunnel acme, account acct-acme, runtime rt-acme, kid %q", c, iss.KeyID())
	}

	past := time.Now().Add(-2 * time.Hour)
	iss.Now = func() time.Time { return past }
	_, err = iss.Verifier().Verify(iss.TokenWith(auth.IssueRequest{Tunnel: "acme", TTL: time.Hour}))
	if err != nil {
		t.Fatalf("Verify at the issuer's clock: %v", err)
	}
	iss.Now = nil
	var rej *auth.RejectError
	_, err = iss.Verifier().Verify(iss.TokenWith(auth.IssueRequest{Tunnel: "acme", TTL: time.Hour, NotBefore: past.Add(-time.Hour)}))
	if !errors.As(err, &rej) || rej.Reason != auth.ReasonExpired {
		t.Errorf("Verify of an expired token = %v, want reason %q", err, auth.ReasonExpired)
	}
}
