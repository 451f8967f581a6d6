package client

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/golang-jwt/jwt/v5"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
)

const day = 24 * time.Hour

// mint makes a token for tunnel, with jti, issued at iat and valid for
// ttl, renewing the token renews ("" for a first token). The client never
// verifies a token, so any key signs it.
func mint(t *testing.T, tunnel, jti string, iat time.Time, ttl time.Duration, renews string) string {
	t.Helper()
	c := unverifiedClaims{RegisteredClaims: jwt.RegisteredClaims{
		Subject: tunnel, ID: jti, IssuedAt: jwt.NewNumericDate(iat), NotBefore: jwt.NewNumericDate(iat),
		ExpiresAt: jwt.NewNumericDate(iat.Add(ttl)),
	}, Renews: renews}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte("test"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func parsed(t *testing.T, raw, source string) *Token {
	t.Helper()
	tok, err := ParseToken(raw, source)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// newTokenClient makes a client of the token in file tokenFile, keeping
// renewals in renewedFile ("" for none).
func newTokenClient(t *testing.T, tokenFile, renewedFile string, log *zap.Logger) *Client {
	t.Helper()
	if log == nil {
		log = zaptest.NewLogger(t)
	}
	c, err := New(Config{
		Server: "tunnels.example.com:443", TokenFile: tokenFile, RenewedTokenFile: renewedFile, Proxy: "direct", Connections: 1,
		Routes: []proxy.Route{mustRoute(t, "/=http://app:8080")},
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// loginToken is the token the client's next login uses.
func loginToken(t *testing.T, c *Client) *Token {
	t.Helper()
	tok, _, err := c.tokens.forLogin()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// The client logs in with the newest token it has: a renewal beats the
// older token of the file, a token written into the file after the renewal
// beats it, and an expired token loses to one that has not expired.
func TestPreferToken(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	file := parsed(t, mint(t, "acme", "first", now.Add(-20*day), 30*day, ""), TokenFromFile)
	renewed := parsed(t, mint(t, "acme", "second", now.Add(-time.Hour), 30*day, "first"), TokenRenewed)
	newerFile := parsed(t, mint(t, "acme", "reissued", now.Add(-time.Minute), 7*day, ""), TokenFromFile)
	expiredRenewal := parsed(t, mint(t, "acme", "old", now.Add(-40*day), 30*day, "first"), TokenRenewed)
	expiredNewerFile := parsed(t, mint(t, "acme", "short", now.Add(-time.Minute), time.Second, ""), TokenFromFile)
	tests := []struct {
		name          string
		file, renewed *Token
		want          *Token
	}{
		{"no renewal", file, nil, file},
		{"a renewal beats an older file token", file, renewed, renewed},
		{"a newer file token beats the renewal", newerFile, renewed, newerFile},
		{"an expired renewal loses", file, expiredRenewal, file},
		{"a newer file token that expired loses", expiredNewerFile, renewed, renewed},
		{"an unusable file leaves the renewal", nil, renewed, renewed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := PreferToken(tc.file, tc.renewed, now); got != tc.want {
				t.Errorf("PreferToken chose %v, want %v", got, tc.want)
			}
		})
	}
}

// A renewal is taken only when it is a token of the client's tunnel that
// has not expired and expires later than the token in use; the others are
// ignored, and the client goes on with what it had.
func TestRenewalIsChecked(t *testing.T) {
	now := time.Now()
	fileRaw := mint(t, "acme", "first", now.Add(-20*day), 30*day, "")
	tokenFile := writeTestFile(t, "token", fileRaw)
	c := newTokenClient(t, tokenFile, "", nil)

	for _, tc := range []struct {
		name, raw, want string
	}{
		{"not a JWT", "renewed-token", "not a JWT"},
		{"another tunnel's", mint(t, "globex", "g", now, 30*day, "x"), `a token for tunnel "globex", and this client serves "acme"`},
		{"expired", mint(t, "acme", "e", now.Add(-31*day), 30*day, "first"), "it expired at"},
		{"older than the token in use", mint(t, "acme", "o", now.Add(-25*day), 30*day, "first"), errNotNewer.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.tokens.onRenewal(tc.raw); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("renewal taken with error %v, want it ignored with %q", err, tc.want)
			}
			if got := loginToken(t, c); got.Raw() != fileRaw {
				t.Errorf("the next login uses the %v, want the file's", got)
			}
			if strings.Contains(errString(c.tokens.onRenewal(tc.raw)), tc.raw) {
				t.Error("the error names the token itself")
			}
		})
	}

	renewal := mint(t, "acme", "second", now, 30*day, "first")
	if _, err := c.tokens.onRenewal(renewal); err != nil {
		t.Fatalf("renewal ignored: %v", err)
	}
	if got := loginToken(t, c); got.Raw() != renewal || got.Source != TokenRenewed {
		t.Fatalf("the next login uses the %v, want the renewal", got)
	}
	// A renewal that expires before the one in hand brings nothing.
	if _, err := c.tokens.onRenewal(mint(t, "acme", "third", now.Add(-time.Minute), 30*day, "first")); !errors.Is(err, errNotNewer) {
		t.Errorf("an earlier renewal after a later one: %v, want %v", err, errNotNewer)
	}
	if got := loginToken(t, c); got.Raw() != renewal {
		t.Errorf("the next login uses the %v, want the latest renewal", got)
	}

	// The platform writes a new token into the Secret: it wins.
	reissued := mint(t, "acme", "reissued", now.Add(time.Second), 7*day, "")
	if err := os.WriteFile(tokenFile, []byte(reissued+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := loginToken(t, c); got.Raw() != reissued || got.Source != TokenFromFile {
		t.Errorf("after the token file changed the next login uses the %v, want the file's new token", got)
	}

	// A file that holds no token of the tunnel any more leaves the renewal
	// in use, and says what is wrong with the file.
	if err := os.WriteFile(tokenFile, []byte(mint(t, "globex", "g", now, time.Hour, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, problem, err := c.tokens.forLogin()
	if err != nil || tok.Raw() != renewal || problem == nil || !strings.Contains(problem.Error(), "restart the client to switch tunnels") {
		t.Errorf("forLogin with a token of another tunnel in the file: %v, %v, %v; want the renewal and the file's problem", tok, problem, err)
	}
}

func errString(_ *Token, err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// --renewed-token-file keeps the newest renewal (mode 0600, nothing else
// left in the directory), and a client that starts again reads it, when it
// is a usable renewal newer than the token file's.
func TestRenewedTokenFile(t *testing.T) {
	now := time.Now()
	// The file's token expired while the renewals kept the tunnel up.
	fileRaw := mint(t, "acme", "first", now.Add(-40*day), 30*day, "")
	tokenFile := writeTestFile(t, "token", fileRaw)
	dir := t.TempDir()
	kept := filepath.Join(dir, "renewed-token")

	first := newTokenClient(t, tokenFile, kept, nil)
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Fatalf("the renewed token file exists before a renewal: %v", err)
	}
	older := mint(t, "acme", "second", now.Add(-11*day), 30*day, "first")
	renewal := mint(t, "acme", "third", now.Add(-time.Minute), 30*day, "first")
	for _, raw := range []string{older, renewal} {
		if _, err := first.tokens.onRenewal(raw); err != nil {
			t.Fatal(err)
		}
		if err := first.tokens.keep(); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(kept)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("renewed token file mode %v, want 0600", fi.Mode().Perm())
	}
	if b, _ := os.ReadFile(kept); strings.TrimSpace(string(b)) != renewal {
		t.Errorf("the renewed token file does not hold the newest renewal")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in the renewed token file's directory, want it alone", len(entries))
	}

	// The client starts again, in the same pod.
	again := newTokenClient(t, tokenFile, kept, nil)
	if got := loginToken(t, again); got.Raw() != renewal || got.Source != TokenRenewed {
		t.Errorf("after a restart the first login uses the %v, want the kept renewal", got)
	}
	if s := again.tokens.snapshot(now); s.Source != TokenRenewed || s.JTI != "third" || s.Renews != "first" || s.Renewals != 0 {
		t.Errorf("/status token after a restart %+v, want the kept renewal", s)
	}

	for _, tc := range []struct {
		name, kept, file string
	}{
		{"an expired renewal", mint(t, "acme", "old", now.Add(-31*day), 30*day, "first"), mint(t, "acme", "a", now.Add(-time.Hour), 30*day, "")},
		{"another tunnel's renewal", mint(t, "globex", "g", now, 30*day, "x"), mint(t, "acme", "a", now.Add(-time.Hour), 30*day, "")},
		{"a renewal older than the file's token", renewal, mint(t, "acme", "reissued", now, 30*day, "")},
		{"not a token", "garbage", mint(t, "acme", "a", now.Add(-time.Hour), 30*day, "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keptFile := writeTestFile(t, "renewed-token", tc.kept)
			c := newTokenClient(t, writeTestFile(t, "token", tc.file), keptFile, nil)
			if got := loginToken(t, c); got.Raw() != tc.file {
				t.Errorf("the first login uses the %v, want the token file's", got)
			}
		})
	}

	t.Run("the renewed token file is the token file", func(t *testing.T) {
		_, err := New(Config{Server: "tunnels.example.com:443", TokenFile: tokenFile, RenewedTokenFile: tokenFile}, zaptest.NewLogger(t))
		if err == nil || !strings.Contains(err.Error(), "--renewed-token-file "+tokenFile+" is the --token-file") {
			t.Errorf("New: %v, want the two files named", err)
		}
	})
	t.Run("no directory for the renewed token file", func(t *testing.T) {
		missing := filepath.Join(dir, "no-such-dir", "renewed-token")
		_, err := New(Config{Server: "tunnels.example.com:443", TokenFile: tokenFile, RenewedTokenFile: missing}, zaptest.NewLogger(t))
		if err == nil || !strings.Contains(err.Error(), "mount a writable volume") {
			t.Errorf("New: %v, want the missing directory named", err)
		}
	})
}

// startRenewed starts a client with n slots against a fake server, as
// startFake does, and has the server send slot 0's session a renewal. It
// returns the token file's token and the renewal.
func startRenewed(t *testing.T, n int) (c *Client, f *fakeServer, first []*fakeSession, fileToken, renewal string) {
	t.Helper()
	c, f, first = startFake(t, n)
	renewal = mint(t, "acme", "second", time.Now(), 30*day, "first")
	first[0].notice(t, tunnel.Notice{Kind: tunnel.NoticeToken, Token: renewal})
	return c, f, first, first[0].token, renewal
}

// A renewal that arrives on one session is used by every later login: a
// slot that reconnects, and the process's other slots.
func TestLaterLoginsUseTheRenewedToken(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		c, f, first, fileToken, renewal := startRenewed(t, 2)
		for _, s := range first {
			_ = s.mux.Close()
		}
		time.Sleep(time.Second)
		synctest.Wait()
		for range 2 {
			if s := f.next(); s.token != renewal {
				t.Errorf("slot %d logged in again with the %s, want the renewal", slotOf(t, c, s), tokenName(s.token, fileToken))
			}
		}
		if s := c.tokens.snapshot(time.Now()); s.Source != TokenRenewed || s.JTI != "second" || s.Renewals != 1 || s.RenewedAt == nil {
			t.Errorf("/status token %+v, want the renewal", s)
		}
		if n := promtest.ToFloat64(c.tokens.collectors()[1]); n != 1 {
			t.Errorf("tether_client_token_renewals_total %v, want 1", n)
		}
	})
}

func tokenName(raw, fileToken string) string {
	if raw == fileToken {
		return "token file's token"
	}
	return "wrong token"
}

// A renewal the servers refuse as not their own (their renewal key is no
// longer trusted) is dropped: the next login uses the token file's again.
func TestRefusedRenewalIsDropped(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		_, f, first, fileToken, renewal := startRenewed(t, 1)
		f.mu.Lock()
		f.refuse = func(token string) string {
			if token == renewal {
				return "unknown_key: the token names a key this server does not trust"
			}
			return ""
		}
		f.logins = nil
		f.mu.Unlock()
		_ = first[0].mux.Close()
		s, _ := f.nextWithin(time.Minute)
		if s.token != fileToken {
			t.Errorf("logged in with the %s after the renewal was refused, want the token file's", tokenName(s.token, fileToken))
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.logins) != 2 || f.logins[0] != renewal {
			t.Errorf("%d logins since the renewal, the first with the renewal: %v; want the renewal refused once, then the file's token", len(f.logins), f.logins[0] == renewal)
		}
	})
}

// Without renewals the client warns, once each, 7 days and 1 day before
// its token expires, in its log, in /status and in its metrics' expiry;
// a renewal ends the warnings.
func TestExpiryWarnings(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		start := time.Now()
		// Issued 22 days ago for 30: its renewal is overdue, 7 days are
		// left in a day.
		exp := start.Add(8 * day)
		tokenFile := writeTestFile(t, "token", mint(t, "acme", "first", exp.Add(-30*day), 30*day, ""))
		core, logs := observer.New(zap.WarnLevel)
		// Connected through the week (a ping every 32 hours, not to spend
		// the test on them), as a client that no server renews.
		c, err := New(Config{
			Server: "tunnels.example.com:443", TokenFile: tokenFile, Proxy: "direct", Connections: 1, HeartbeatTimeout: 48 * time.Hour,
			Routes: []proxy.Route{mustRoute(t, "/=http://app:8080")},
		}, zap.New(core))
		if err != nil {
			t.Fatal(err)
		}
		f := newFakeServer(t, c)
		serve(t, c, nil)
		synctest.Wait()
		f.next()
		warnings := func() []string {
			var out []string
			for _, e := range logs.FilterMessage("tunnel token expires soon and no renewal came").All() {
				out = append(out, e.ContextMap()["within"].(string))
			}
			return out
		}
		status := func() string {
			rec := httptest.NewRecorder()
			c.healthHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status", nil))
			return rec.Body.String()
		}
		if got := promtest.ToFloat64(c.tokens.collectors()[0]); got != float64(exp.Unix()) {
			t.Errorf("tether_client_token_expiry_timestamp_seconds %v, want %d", got, exp.Unix())
		}

		time.Sleep(day - time.Second)
		synctest.Wait()
		if w := warnings(); len(w) != 0 || strings.Contains(status(), `"warning"`) {
			t.Errorf("warnings %q with more than 7 days left; want none", w)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if w := warnings(); len(w) != 1 || w[0] != "7d" {
			t.Errorf("warnings %q with 7 days left; want one, within 7d", w)
		}
		if s := status(); !strings.Contains(s, `"warning": "the token expires in 6d23h`) || !strings.Contains(s, "tether token issue --tunnel acme") {
			t.Errorf("/status with 7 days left: %s; want a warning and what to do", s)
		}
		time.Sleep(6*day - 2*time.Second)
		synctest.Wait()
		if w := warnings(); len(w) != 1 {
			t.Errorf("warnings %q with a day and a second left; want still one", w)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if w := warnings(); len(w) != 2 || w[1] != "24h" {
			t.Errorf("warnings %q with a day left; want a second, within 24h", w)
		}
		time.Sleep(12 * time.Hour)
		synctest.Wait()
		if w := warnings(); len(w) != 2 {
			t.Errorf("warnings %q; want each threshold warned once", w)
		}

		renewal := mint(t, "acme", "second", time.Now(), 30*day, "first")
		if _, err := c.tokens.onRenewal(renewal); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if s := status(); strings.Contains(s, `"warning"`) {
			t.Errorf("/status after a renewal: %s; want no warning", s)
		}
		if got, want := promtest.ToFloat64(c.tokens.collectors()[0]), float64(time.Now().Add(30*day-time.Second).Unix()); got != want {
			t.Errorf("tether_client_token_expiry_timestamp_seconds after a renewal %v, want %v", got, want)
		}
	})
}

// A warning comes when a token expires within 7 days or 1 day and no
// renewal came although one is overdue: a token the servers renew draws
// none, however short its lifetime.
func TestExpiryWarning(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	claims := func(iat time.Time, ttl time.Duration) *Token {
		return parsed(t, mint(t, "acme", "j", iat, ttl, ""), TokenFromFile)
	}
	tests := []struct {
		name string
		tok  *Token
		want time.Duration
	}{
		{"30 days, 8 left", claims(now.Add(-22*day), 30*day), 0},
		{"30 days, 6 left", claims(now.Add(-24*day), 30*day), 7 * day},
		{"30 days, 12h left", claims(now.Add(-30*day+12*time.Hour), 30*day), day},
		{"expired", claims(now.Add(-31*day), 30*day), day},
		{"a day, just issued", claims(now, day), 0},
		{"a day, renewal due, not yet overdue", claims(now.Add(-16*time.Hour-30*time.Minute), day), 0},
		{"a day, renewal overdue", claims(now.Add(-18*time.Hour), day), day},
		{"10 days, renewal due at 3d8h left: not yet", claims(now.Add(-6*day), 10*day), 0},
		{"10 days, renewal overdue", claims(now.Add(-7*day), 10*day), 7 * day},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExpiryWarning(&tc.tok.Claims, now); got != tc.want {
				t.Errorf("ExpiryWarning %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("a token without a known lifetime", func(t *testing.T) {
		raw, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "acme", ExpiresAt: jwt.NewNumericDate(now.Add(6 * day))}).SignedString([]byte("k"))
		if err != nil {
			t.Fatal(err)
		}
		if got := ExpiryWarning(&parsed(t, raw, TokenFromFile).Claims, now); got != 7*day {
			t.Errorf("ExpiryWarning %v, want 7 days: no server renews it", got)
		}
	})
	t.Run("a token without exp", func(t *testing.T) {
		raw := strings.TrimSpace(readFile(t, tokenFile(t)))
		if got := ExpiryWarning(&parsed(t, raw, TokenFromFile).Claims, now); got != 0 {
			t.Errorf("ExpiryWarning %v, want none", got)
		}
	})
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
