package diagnose

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/client"
)

const day = 24 * time.Hour

// A token that expires within 7 days, or 1, with its renewal overdue is a
// warning that says what to do; one the servers would still renew in time
// passes, and an expired one fails.
func TestTokenExpiryWarnings(t *testing.T) {
	k := newKeys(t)
	now := time.Now()
	tests := []struct {
		name   string
		issued time.Time
		ttl    time.Duration
		status Status
		detail string
	}{
		{"30 days, 8 left", now.Add(-22 * day), 30 * day, Pass, "expires "},
		{"30 days, 6 left", now.Add(-24 * day), 30 * day, Warn, "the token expires within 7d and has not been renewed"},
		{"30 days, 12h left", now.Add(-30*day + 12*time.Hour), 30 * day, Warn, "the token expires within 24h and has not been renewed"},
		{"a day, just issued: a renewing server renews it in time", now, day, Pass, "expires "},
		{"expired", now.Add(-31 * day), 30 * day, Fail, "the token has expired"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Client: client.Config{
				Server: testutil.ClosedAddr(t), TokenFile: k.tokenFile(t, "acme", tc.issued, tc.ttl), Proxy: "direct",
				Routes: routes(t, "/="+backend(t)),
			}, Resolver: loopbackResolver(t)}
			hint := ""
			if tc.status == Warn {
				hint = "--token-renewal-key"
			}
			wantCheck(t, diagnoseWith(t, o), "token", tc.status, tc.detail, hint)
		})
	}
}

// With --renewed-token-file, diagnose judges the token the client logs in
// with: after a restart, the renewal kept there, although the token file's
// has expired; and the server accepts it.
func TestRenewedTokenInUse(t *testing.T) {
	srv := startServer(t)
	now := time.Now()
	first := &auth.Claims{Tunnel: "acme", ID: "first-jti", IssuedAt: now.Add(-40 * day).Truncate(time.Second), ExpiresAt: now.Add(-10 * day).Truncate(time.Second)}
	tokenFile := srv.keys.tokenFile(t, "acme", first.IssuedAt, 30*day)
	renewal, err := srv.keys.signer.Renew(first, now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cfg := srv.clientConfig(tokenFile, backend(t), t)
	cfg.RenewedTokenFile = writeFile(t, "renewed-token", renewal)

	report := diagnoseWith(t, Options{Client: cfg, Resolver: loopbackResolver(t)})
	wantCheck(t, report, "token", Pass, "in use: the renewal in --renewed-token-file "+cfg.RenewedTokenFile, "")
	wantCheck(t, report, "token", Pass, "renewing jti first-jti", "")
	wantCheck(t, report, "login", Warn, `the server (`, "start `tether client`")

	t.Run("an expired renewal is not used", func(t *testing.T) {
		old, err := srv.keys.signer.Renew(first, now.Add(-31*day))
		if err != nil {
			t.Fatal(err)
		}
		cfg.RenewedTokenFile = writeFile(t, "renewed-token", old)
		wantCheck(t, diagnoseWith(t, Options{Client: cfg, Resolver: loopbackResolver(t)}), "token", Fail, "holds a renewal that expired at", "issue a new token")
	})
	t.Run("no renewal yet", func(t *testing.T) {
		cfg.RenewedTokenFile = filepath.Join(t.TempDir(), "renewed-token")
		cfg.TokenFile = srv.keys.tokenFile(t, "acme", now, 30*day)
		wantCheck(t, diagnoseWith(t, Options{Client: cfg, Resolver: loopbackResolver(t)}), "token", Pass, "holds no renewal yet", "")
	})
}

// The login check says how many webhooks the server holds for the tunnel,
// waiting or refused by their upstream, and since when.
func TestBufferLines(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	oldest := now.Add(-90 * time.Minute)
	if got := bufferLines(&tunnel.ProbeReply{Tunnel: "acme"}, now); len(got) != 0 {
		t.Errorf("no buffer: %q", got)
	}
	got := bufferLines(&tunnel.ProbeReply{Tunnel: "acme", Buffered: 3, BufferRejected: 1, BufferedSince: &oldest}, now)
	want := []string{
		"3 webhooks stored while the tunnel was down wait for delivery, the oldest stored 2025-03-01T10:30:00Z (90m ago); they are delivered in order once a client serves it",
		"1 buffered webhooks were refused by their upstream (a 4xx); the operator lists and requeues them at GET /api/tunnels/acme/buffer",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
