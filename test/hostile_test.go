package test

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tether-dev/tether/internal/testutil"
)

// signToken signs claims with the private key in privPath (PKCS#8 PEM from
// `tether token keygen`), naming kid in the header when it is not empty. It
// makes tokens `tether token issue` will not: expired ones, bad subjects.
func signToken(t testing.TB, privPath, kid string, claims jwt.MapClaims) string {
	t.Helper()
	b, err := os.ReadFile(privPath)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM block", privPath)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// claimsFor are valid claims for tunnel, valid for an hour from now.
func claimsFor(tunnel string) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{
		"sub": tunnel, "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"jti": fmt.Sprintf("e2e-%d", now.UnixNano()),
	}
}

// TestHostileClients: clients that try to take what is not theirs, or log in
// with bad tokens, are refused with a reason they can read and that the
// server counts, while a healthy tunnel keeps being served before, during
// and after. No token appears in any log.
func TestHostileClients(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	alphaBackend := newBackend(t, "alpha", nil)
	gammaBackend := newBackend(t, "gamma", nil)
	attacker := newBackend(t, "attacker", nil)

	alphaToken := k.issue(t, "alpha", time.Hour, "--account", "acme")
	alpha := startClient(t, srv, clientOpts{tokenFile: writeToken(t, alphaToken), routes: []string{"/=" + alphaBackend.url()}})
	// gamma is a stock frpc tenant with a user and client ID of its own, for
	// a hostile client to collide with; frpc names its proxy "gamma.web".
	gammaToken := k.issue(t, "gamma", time.Hour)
	startFRPC(t, "frpc gamma", frpcConfig(srv, gammaToken, fmt.Sprintf(`
user = "gamma"
clientID = "gamma-1"
[[proxies]]
name = "web"
type = "http"
subdomain = "gamma"
localIP = "127.0.0.1"
localPort = %d
`, gammaBackend.port())))
	srv.waitServedBy(t, "gamma", "gamma", readyTimeout)
	before := srv.tunnels(t)

	watchAlpha := srv.watch("alpha", "alpha")
	defer watchAlpha.stop()
	watchGamma := srv.watch("gamma", "gamma")
	defer watchGamma.stop()
	watchAlpha.check(t, "before the hostile clients")
	watchGamma.check(t, "before the hostile clients")

	betaToken := k.issue(t, "beta", time.Hour)
	// Every token used, to be looked for in the logs at the end.
	var tokensMu sync.Mutex
	tokens := map[string]string{"alpha": alphaToken, "gamma": gammaToken, "beta": betaToken}
	addToken := func(name, token string) {
		tokensMu.Lock()
		defer tokensMu.Unlock()
		tokens[name] = token
	}

	// Route registrations a token for beta may not make. Each runs in its
	// own stock frpc, which logs in fine and reports the refusal.
	t.Run("routes", func(t *testing.T) {
		tcpPort, udpPort := freePort(t), freePort(t)
		// listensOn sees the server's own listeners.
		if port, _ := strconv.Atoi(srv.tunnelPort()); !listensOn(t, srv.proc, port) {
			t.Fatalf("listensOn does not see the server listening on its tunnel port %d", port)
		}
		routesRejected := srv.metric(t, "tether_routes_rejected_total", "reason", "proxy")
		cases := []struct {
			name    string
			proxy   string // the [[proxies]] table
			wantMsg string // in frpc's output
			noPort  int    // a port that must not be listening afterwards
		}{
			{name: "another tunnel's subdomain", wantMsg: `subdomain "alpha" is not allowed`,
				proxy: `name = "beta"` + "\n" + `type = "http"` + "\n" + `subdomain = "alpha"`},
			{name: "another tunnel's proxy name", wantMsg: `proxy name "alpha" is not allowed`,
				proxy: `name = "alpha"` + "\n" + `type = "http"` + "\n" + `subdomain = "beta"`},
			{name: "tcp proxy with a remote port", wantMsg: `proxy type "tcp" is not allowed`, noPort: tcpPort,
				proxy: fmt.Sprintf("name = \"beta\"\ntype = \"tcp\"\nremotePort = %d", tcpPort)},
			{name: "udp proxy", wantMsg: `proxy type "udp" is not allowed`,
				proxy: fmt.Sprintf("name = \"beta\"\ntype = \"udp\"\nremotePort = %d", udpPort)},
			{name: "stcp proxy", wantMsg: `proxy type "stcp" is not allowed`,
				proxy: "name = \"beta\"\ntype = \"stcp\"\nsecretKey = \"s\""},
			{name: "tcpmux proxy", wantMsg: `proxy type "tcpmux" is not allowed`,
				proxy: "name = \"beta\"\ntype = \"tcpmux\"\nmultiplexer = \"httpconnect\"\ncustomDomains = [\"alpha." + domain + "\"]"},
			{name: "custom domain of another tunnel", wantMsg: `custom_domains ["alpha.` + domain + `"] is not allowed`,
				proxy: "name = \"beta\"\ntype = \"http\"\nsubdomain = \"beta\"\ncustomDomains = [\"alpha." + domain + "\"]"},
			{name: "custom domain elsewhere", wantMsg: `custom_domains ["evil.example"] is not allowed`,
				proxy: "name = \"beta\"\ntype = \"http\"\ncustomDomains = [\"evil.example\"]"},
			{name: "load balancing group", wantMsg: `load balancing group "alpha" is not allowed`,
				proxy: "name = \"beta\"\ntype = \"http\"\nsubdomain = \"beta\"\nloadBalancer.group = \"alpha\"\nloadBalancer.groupKey = \"k\""},
			{name: "locations", wantMsg: `locations ["/admin"] is not allowed`,
				proxy: "name = \"beta\"\ntype = \"http\"\nsubdomain = \"beta\"\nlocations = [\"/admin\"]"},
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				// Each case has a tunnel of its own, so that the parallel
				// clients do not replace each other's sessions.
				tunnel := fmt.Sprintf("beta-%d", i)
				token := k.issue(t, tunnel, time.Hour)
				addToken(tunnel, token)
				proxy := strings.ReplaceAll(tc.proxy, `"beta"`, strconv.Quote(tunnel))
				cfg := frpcConfig(srv, token, fmt.Sprintf("[[proxies]]\n%s\nlocalIP = \"127.0.0.1\"\nlocalPort = %d\n", proxy, attacker.port()))
				p := startFRPC(t, "frpc "+tunnel, cfg)
				p.waitOutput("start error: proxy: ", 30*time.Second)
				if !strings.Contains(p.Output(), tc.wantMsg) {
					t.Errorf("frpc output does not say %q", tc.wantMsg)
				}
				// Another test's process may listen there meanwhile: what
				// matters is that the server does not.
				if tc.noPort != 0 && listensOn(t, srv.proc, tc.noPort) {
					t.Errorf("the server listens on port %d after the tcp proxy was refused", tc.noPort)
				}
				// The refused route serves nothing.
				if r := srv.mustGet(t, tunnel, "/"); r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != "tunnel_down" {
					t.Errorf("%s.%s: got %d %q, want 503 tunnel_down", tunnel, domain, r.code, r.header.Get("X-Tether-Error"))
				}
				req, _ := http.NewRequest(http.MethodGet, "http://"+srv.httpAddr+"/", nil)
				req.Host = "evil.example"
				if r, err := do(req); err != nil || r.code != http.StatusNotFound {
					t.Errorf("evil.example: got %d, %v; want 404", r.code, err)
				}
				p.stop()
			})
		}
		t.Cleanup(func() {
			got := srv.metric(t, "tether_routes_rejected_total", "reason", "proxy") - routesRejected
			if got < float64(len(cases)) {
				t.Errorf("tether_routes_rejected_total{reason=proxy} rose by %v, want at least %d", got, len(cases))
			}
		})
	})
	watchAlpha.check(t, "during the hostile route registrations")
	watchGamma.check(t, "during the hostile route registrations")

	// Logins with bad tokens: frpc exits (loginFailExit) with the reason.
	t.Run("logins", func(t *testing.T) {
		other := newKeys(t)
		trustedKid := str(jwtHeader(t, alphaToken)["kid"])
		expired := claimsFor("beta")
		expired["iat"], expired["nbf"], expired["exp"] = time.Now().Add(-2*time.Hour).Unix(), time.Now().Add(-2*time.Hour).Unix(), time.Now().Add(-time.Hour).Unix()
		noneToken := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." +
			base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"sub":"beta","exp":%d}`, time.Now().Add(time.Hour).Unix()))) + "."
		pub, err := os.ReadFile(k.pub)
		if err != nil {
			t.Fatal(err)
		}
		hsToken, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claimsFor("beta")).SignedString(pub)
		if err != nil {
			t.Fatal(err)
		}

		t.Run("tether token issue refuses a sub that is not a DNS label", func(t *testing.T) {
			code, stdout, stderr := runTether(t, nil, "token", "issue", "--key", k.priv, "--tunnel", "Bad_Name", "--ttl", "1h")
			if code != 2 || stdout != "" || !strings.Contains(stderr, "Bad_Name") {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit 2, no token, a message naming Bad_Name", code, stdout, stderr)
			}
		})

		cases := []struct {
			name, token string
			reason      string // the metric label and the start of the client-visible reason
			wantMsg     string
		}{
			{"expired token", signToken(t, k.priv, trustedKid, expired), "expired", "token expired at"},
			{"token of an unknown key", other.issue(t, "beta", time.Hour), "unknown_key", "which this server does not trust"},
			{"token signed by another key under the trusted kid", signToken(t, other.priv, trustedKid, claimsFor("beta")), "bad_signature", "signature does not verify"},
			{"token signed by another key without kid", signToken(t, other.priv, "", claimsFor("beta")), "bad_signature", "signature does not verify"},
			{"not a JWT", "not-a-jwt", "malformed", "dot-separated parts"},
			{"garbage JWT", "a.b.c", "malformed", "base64url"},
			{"alg none", noneToken, "algorithm", `alg "none" is not accepted`},
			{"HS256 keyed with the public key", hsToken, "algorithm", `alg "HS256"`},
			{"sub with upper case and underscore", signToken(t, k.priv, trustedKid, claimsFor("Bad_Name")), "subject", "not a valid tunnel name"},
			{"sub with a dot", signToken(t, k.priv, trustedKid, claimsFor("x.alpha")), "subject", "not a valid tunnel name"},
			{"no token", "", "missing_token", "metadatas.token"},
		}
		want := map[string]float64{}
		base := map[string]float64{}
		for _, tc := range cases {
			want[tc.reason]++
			base[tc.reason] = srv.metric(t, "tether_logins_rejected_total", "reason", tc.reason)
			if tc.token != "" {
				addToken(tc.name, tc.token)
			}
		}
		t.Run("stock frpc", func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					cfg := frpcConfig(srv, tc.token, frpcHTTPProxy("beta", attacker))
					if tc.token == "" {
						cfg = strings.Replace(cfg, `metadatas.token = ""`, "", 1)
					}
					p := startFRPC(t, "frpc "+tc.name, cfg)
					code, ok := p.wait(30 * time.Second)
					if !ok {
						t.Fatalf("frpc still runs; want it to exit on the refused login")
					}
					if code == 0 {
						t.Errorf("frpc exited 0; want a failure")
					}
					if want := "login to the server failed: " + tc.reason + ": "; !strings.Contains(p.Output(), want) {
						t.Errorf("frpc output does not contain %q", want)
					}
					if !strings.Contains(p.Output(), tc.wantMsg) {
						t.Errorf("frpc output does not contain %q", tc.wantMsg)
					}
				})
			}
		})
		for reason, n := range want {
			if got := srv.metric(t, "tether_logins_rejected_total", "reason", reason) - base[reason]; got != n {
				t.Errorf("tether_logins_rejected_total{reason=%q} rose by %v, want %v", reason, got, n)
			}
		}

		t.Run("tether client shows the reason and keeps trying", func(t *testing.T) {
			c := startClient(t, srv, clientOpts{
				tokenFile: writeToken(t, signToken(t, other.priv, trustedKid, claimsFor("beta"))),
				routes:    []string{"/=" + attacker.url()},
				noWait:    true,
			})
			testutil.WaitFor(t, 30*time.Second, func() error {
				st, err := c.status()
				if err != nil {
					return err
				}
				if !strings.Contains(st.LastError, "bad_signature") {
					return fmt.Errorf("/status last_error = %q, want the server's reason bad_signature", st.LastError)
				}
				return nil
			})
			code, body, err := c.readyz()
			if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "bad_signature") {
				t.Errorf("/readyz: %d %q %v; want 503 naming bad_signature", code, body, err)
			}
			if c.exited() {
				t.Errorf("client exited; want it to keep retrying")
			}
			assertNoSecret(t, "the token", alphaToken, c.proc)
		})
	})
	watchAlpha.check(t, "during the bad logins")
	watchGamma.check(t, "during the bad logins")

	// A client that claims another tenant's frp user and client ID gains
	// nothing from it: frps keys controls by (user, client ID), and tether
	// replaces both with the verified identity.
	t.Run("user and clientID of another tenant", func(t *testing.T) {
		for _, tc := range []struct{ name, settings string }{
			{"user and clientID", "user = \"gamma\"\nclientID = \"gamma-1\""},
			{"clientID", "clientID = \"gamma-1\""},
			{"user of alpha", "user = \"alpha\""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p := startFRPC(t, "frpc beta as gamma", frpcConfig(srv, betaToken, tc.settings+"\n"+frpcHTTPProxy("beta", attacker)))
				// Either its own route works or it is refused; it never
				// takes another tenant's session.
				testutil.WaitFor(t, 30*time.Second, func() error {
					out := p.Output()
					if strings.Contains(out, "start proxy success") || strings.Contains(out, "start error") || p.exited() {
						return nil
					}
					return fmt.Errorf("frpc has not reported its proxy's fate")
				})
				t.Logf("frpc beta with %s: login success: %v, proxy refused: %v", tc.name,
					strings.Contains(p.Output(), "login to server success"), strings.Contains(p.Output(), "start error"))
				p.stop()
			})
		}
		after := srv.tunnels(t)
		for _, name := range []string{"alpha", "gamma"} {
			if b, a := before[name], after[name]; a.ClientAddress != b.ClientAddress || !a.ConnectedSince.Equal(b.ConnectedSince) {
				t.Errorf("tunnel %s changed session: before %s since %v, after %s since %v",
					name, b.ClientAddress, b.ConnectedSince, a.ClientAddress, a.ConnectedSince)
			}
		}
	})
	watchAlpha.check(t, "after the hostile clients")
	watchGamma.check(t, "after the hostile clients")

	if n := attacker.hits.Load(); n != 0 {
		t.Errorf("the hostile clients' backend got %d requests; want none", n)
	}
	if got := srv.metric(t, "tether_sessions_replaced_total"); got != 0 {
		t.Errorf("tether_sessions_replaced_total = %v, want 0: a hostile login replaced a session", got)
	}
	for name, tok := range tokens {
		assertNoSecret(t, "token "+name, tok, srv.proc, alpha.proc)
	}
}
