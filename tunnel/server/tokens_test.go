package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

// loginAs logs c in as a tether client (it advertises a route, so that it
// gets notices) and returns the server's answer.
func (c *rawClient) loginAs(token string) *msg.LoginResp {
	c.t.Helper()
	resp, _ := c.loginMetas(map[string]string{auth.TokenMetaKey: token, tunnel.RoutesMetaKey: `["/=http://127.0.0.1:9"]`},
		"run-"+time.Now().Format("150405.000000"))
	return resp
}

// revoke posts a revocation to s's admin API and returns it.
func (s *testServer) revoke(t testing.TB, body string) registry.Revocation {
	t.Helper()
	res, err := http.Post(s.admin+"/api/revocations", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /api/revocations %s: %s", body, res.Status)
	}
	var rev registry.Revocation
	if err := json.NewDecoder(res.Body).Decode(&rev); err != nil {
		t.Fatal(err)
	}
	return rev
}

func TestRevokedTunnelIsRefusedAndOthersAreNot(t *testing.T) {
	s := startServer(t)
	rev := s.revoke(t, `{"tunnel":"gone","reason":"offboarded"}`)
	resp := dialRaw(t, s.tunnel).loginAs(s.keys.token(t, "gone", time.Hour))
	if !strings.HasPrefix(resp.Error, "revoked: ") || !strings.Contains(resp.Error, `tunnel "gone"`) || !strings.Contains(resp.Error, rev.ID) {
		t.Errorf("login of a revoked tunnel answered %q; want reason revoked naming the tunnel and revocation %s", resp.Error, rev.ID)
	}
	if strings.Contains(resp.Error, "offboarded") {
		t.Errorf("the operator's reason reached the client: %q", resp.Error)
	}
	if resp := dialRaw(t, s.tunnel).loginAs(s.keys.token(t, "kept", time.Hour)); resp.Error != "" {
		t.Errorf("login of another tunnel refused: %q", resp.Error)
	}
}

// A revoked jti takes its renewals with it: a renewal names the token it
// renews.
func TestRevokedTokenTakesItsRenewals(t *testing.T) {
	s := startServer(t)
	original := s.keys.token(t, "lineage", time.Hour)
	claims, err := s.verifier.Verify(original)
	if err != nil {
		t.Fatal(err)
	}
	renewal, err := s.keys.signer.Renew(claims, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.revoke(t, `{"jti":"`+claims.ID+`"}`)
	for what, tok := range map[string]string{"the revoked token": original, "its renewal": renewal} {
		if resp := dialRaw(t, s.tunnel).loginAs(tok); !strings.HasPrefix(resp.Error, "revoked: ") {
			t.Errorf("login with %s answered %q; want reason revoked", what, resp.Error)
		}
	}
	if resp := dialRaw(t, s.tunnel).loginAs(s.keys.token(t, "lineage", time.Hour)); resp.Error != "" {
		t.Errorf("login with another token of the tunnel refused: %q", resp.Error)
	}
}

func TestRevocationClosesLiveSessions(t *testing.T) {
	s := startServer(t)
	gone, kept := dialRaw(t, s.tunnel), dialRaw(t, s.tunnel)
	for _, c := range []struct {
		raw  *rawClient
		name string
	}{{gone, "gone"}, {kept, "kept"}} {
		if resp := c.raw.loginAs(s.keys.token(t, c.name, time.Hour)); resp.Error != "" {
			t.Fatalf("login %s: %s", c.name, resp.Error)
		}
	}
	s.revoke(t, `{"tunnel":"gone"}`)
	testutil.WaitFor(t, 5*time.Second, func() error {
		if !gone.mux.IsClosed() {
			return errString("the revoked tunnel's session is still open")
		}
		return nil
	})
	if kept.mux.IsClosed() {
		t.Error("the session of a tunnel nobody revoked closed")
	}
}

func TestRevocationAPIRefusesBadRequests(t *testing.T) {
	s := startServer(t)
	for body, want := range map[string]string{
		`{}`:                       "neither a tunnel nor a token ID",
		`{"tunnel":"a","jti":"b"}`: "both a tunnel and a token ID",
		`{"tunnel":"Not A Name"}`:  "--tunnel",
		`{"tunnel":"a","until":"2001-01-01T00:00:00Z"}`: "not in the future",
		`{"tunnel":"a","extra":1}`:                      "unknown field",
		`not json`:                                      "not a revocation",
	} {
		res, err := http.Post(s.admin+"/api/revocations", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var text bytes.Buffer
		_, _ = text.ReadFrom(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(text.String(), want) {
			t.Errorf("POST %s: %s %q; want 400 saying %q", body, res.Status, text.String(), want)
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, s.admin+"/api/revocations/nope", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("DELETE of an unknown revocation: %s; want 404", res.Status)
	}
}

func TestRevocationAPINeedsTheAdminToken(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	writeFile(t, tokenFile, "0123456789abcdef0123456789abcdef")
	s := startServer(t, func(c *Config) { c.AdminTokenFile = tokenFile })
	for _, r := range []struct{ method, path string }{
		{http.MethodPost, "/api/revocations"}, {http.MethodGet, "/api/revocations"},
		{http.MethodDelete, "/api/revocations/x"}, {http.MethodPost, "/api/tunnels/a/disconnect"},
	} {
		req, _ := http.NewRequest(r.method, s.admin+r.path, strings.NewReader(`{"tunnel":"a"}`))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s without the admin token: %s; want 401", r.method, r.path, res.Status)
		}
	}
}

// A tether client's token is renewed when a third of its lifetime is
// left: the client gets the renewal in a notice, and its session lives by
// the renewal.
func TestRenewalNoticeExtendsTheSession(t *testing.T) {
	k := newKeys(t)
	keyFile := filepath.Join(t.TempDir(), "renewal.pem")
	pub := filepath.Join(t.TempDir(), "renewal.pub.pem")
	if err := auth.GenerateKeyPair(auth.EdDSA, keyFile, pub); err != nil {
		t.Fatal(err)
	}
	// The servers trust both keys: the platform's, and the renewal key.
	both := filepath.Join(t.TempDir(), "trusted.pem")
	writeFile(t, both, readFile(t, k.pubPath)+readFile(t, pub))

	k.pubPath = both
	s := startServerWith(t, serverSetup{keys: k, log: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))}, func(c *Config) { c.TokenRenewalKeyFile = keyFile })

	// Issued 40 s ago for a minute: 20 s are left, less than a third, so
	// the renewal is due at once.
	issued := time.Now().Add(-40 * time.Second)
	tok, err := k.signer.Issue(auth.IssueRequest{Tunnel: "renewed", Account: "acct", TTL: time.Minute}, issued)
	if err != nil {
		t.Fatal(err)
	}
	old, err := s.verifier.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	raw := dialRaw(t, s.tunnel)
	if resp := raw.loginAs(tok); resp.Error != "" {
		t.Fatal(resp.Error)
	}
	n := waitNotice(t, raw.mux, tunnel.NoticeToken)
	renewed, err := s.verifier.Verify(n.Token)
	if err != nil {
		t.Fatalf("the renewal does not verify: %v", err)
	}
	if renewed.Tunnel != "renewed" || renewed.Account != "acct" || renewed.Renews != old.ID || renewed.ID == old.ID ||
		auth.Lifetime(renewed) != time.Minute || !renewed.ExpiresAt.After(old.ExpiresAt) {
		t.Errorf("renewal %+v of %+v; want the same tunnel, account and lifetime, a later exp, a new jti, renews the old jti", renewed, old)
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		for _, info := range s.members.list() {
			if c := info.sess.Claims(); c != nil && c.ID == renewed.ID {
				return nil
			}
		}
		return errString("the session does not live by the renewal")
	})
	const key = `tether_tunnel_token_expiry_timestamp_seconds{tunnel="renewed"}`
	if got, want := series(t, s.metrics.reg)[key], float64(renewed.ExpiresAt.Unix()); got != want {
		t.Errorf("%s = %v after the renewal; want the renewal's exp %v", key, got, want)
	}
}

// waitNotice accepts streams from the server until one carries a notice of
// kind.
func waitNotice(t testing.TB, mux *yamux.Session, kind string) tunnel.Notice {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		stream, err := mux.AcceptStreamWithContext(ctx)
		cancel()
		if err != nil {
			t.Fatalf("no %s notice: %v", kind, err)
		}
		n, err := tunnel.ReadNotice(stream)
		_ = stream.Close()
		if err == nil && n.Kind == kind {
			return n
		}
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type errString string

func (e errString) Error() string { return string(e) }
