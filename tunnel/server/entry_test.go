package server

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func TestTunnelName(t *testing.T) {
	tests := []struct {
		host, want string
		ok         bool
	}{
		{"acme.tunnels.test", "acme", true},
		{"acme.tunnels.test:8080", "acme", true},
		{"ACME.Tunnels.Test", "acme", true},
		{"acme.tunnels.test.", "acme", true},
		{"a-1.tunnels.test", "a-1", true},
		{"tunnels.test", "", false},
		{"x.acme.tunnels.test", "", false}, // one label only
		{"-acme.tunnels.test", "", false},
		{"acme.other.test", "", false},
		{"acmetunnels.test", "", false},
		{"[::1]:8080", "", false},
		{"", "", false},
		{strings.Repeat("a", 64) + ".tunnels.test", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			got, ok := tunnelName(tc.host, "tunnels.test")
			if got != tc.want || ok != tc.ok {
				t.Errorf("tunnelName(%q) = %q, %v; want %q, %v", tc.host, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestEntryAnswersForUnknownHostsAndDownTunnels(t *testing.T) {
	s := startServer(t)
	s.startClient(t, "alpha", backend(t, "alpha").URL)

	req, _ := http.NewRequest(http.MethodGet, s.entry+"/", nil)
	req.Host = "alpha.elsewhere.test"
	code, body, h := do(t, req)
	if code != http.StatusNotFound || h.Get("X-Tether-Error") != "unknown_host" || !strings.Contains(body, "alpha.elsewhere.test") {
		t.Errorf("unknown host: got %d %q (%s), want 404 unknown_host naming the host", code, body, h.Get("X-Tether-Error"))
	}
	code, body, h = s.get(t, "beta", "/")
	if code != http.StatusServiceUnavailable || h.Get("X-Tether-Error") != "tunnel_down" || !strings.Contains(body, `"beta"`) {
		t.Errorf("down tunnel: got %d %q (%s), want 503 tunnel_down naming the tunnel", code, body, h.Get("X-Tether-Error"))
	}
	if code, body, _ := s.get(t, "alpha", "/ok"); code != http.StatusOK || !strings.HasPrefix(body, "alpha /ok") {
		t.Errorf("alpha: got %d %q", code, body)
	}
}

func TestForwardedHeaders(t *testing.T) {
	tests := []struct {
		name    string
		trusted []netip.Prefix
		xff     string
		want    string
	}{
		{"spoofed value from an untrusted caller is replaced", nil, "1.2.3.4", "xff=127.0.0.1"},
		{"a trusted proxy's value is kept and extended", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "1.2.3.4", "xff=1.2.3.4, 127.0.0.1"},
		{"no value", nil, "", "xff=127.0.0.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, func(c *Config) { c.TrustedProxies = tc.trusted })
			s.startClient(t, "alpha", backend(t, "alpha").URL)
			req, _ := http.NewRequest(http.MethodGet, s.entry+"/", nil)
			req.Host = "alpha." + testDomain
			if tc.xff != "" {
				req.Header.Set("X-Forwarded-For", tc.xff)
			}
			_, body, _ := do(t, req)
			if !strings.HasSuffix(body, tc.want) {
				t.Errorf("backend saw %q, want it to end with %q", body, tc.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	base := Config{TunnelAddr: ":7000", HTTPAddr: ":8080", AdminAddr: "127.0.0.1:7700", Domain: "tunnels.example.com"}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // substring of the error; "" = valid
	}{
		{"valid", func(*Config) {}, ""},
		{"no domain", func(c *Config) { c.Domain = "" }, "--domain"},
		{"bad domain", func(c *Config) { c.Domain = "under_score.com" }, "--domain"},
		{"address without port", func(c *Config) { c.HTTPAddr = "0.0.0.0" }, "--http-addr"},
		{"public admin without token", func(c *Config) { c.AdminAddr = "0.0.0.0:7700" }, "--admin-token-file"},
		{"cert without key", func(c *Config) { c.TLSCertFile = "tls.crt" }, "--tls-key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.mutate(&cfg)
			cfg.setDefaults()
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

func TestAdminAPI(t *testing.T) {
	tokenFile := t.TempDir() + "/admin-token"
	writeFile(t, tokenFile, "s3cret-admin")
	s := startServer(t, func(c *Config) { c.AdminTokenFile = tokenFile })
	s.startClient(t, "alpha", backend(t, "alpha").URL)

	req, _ := http.NewRequest(http.MethodGet, s.admin+"/api/tunnels", nil)
	if code, _, _ := do(t, req); code != http.StatusUnauthorized {
		t.Errorf("/api/tunnels without token: %d, want 401", code)
	}
	req.Header.Set("Authorization", "Bearer s3cret-admin")
	code, body, _ := do(t, req)
	if code != http.StatusOK || !strings.Contains(body, `"name": "alpha"`) || !strings.Contains(body, `"account": "acct-alpha"`) {
		t.Errorf("/api/tunnels: %d %s", code, body)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		req, _ := http.NewRequest(http.MethodGet, s.admin+path, nil)
		if code, _, _ := do(t, req); code != http.StatusOK {
			t.Errorf("%s: %d, want 200 without a token", path, code)
		}
	}
	req, _ = http.NewRequest(http.MethodGet, s.admin+"/metrics", nil)
	_, metrics, _ := do(t, req)
	for _, want := range []string{"tether_tunnels_connected 1", `tether_tunnel_bytes_total{direction="in",tunnel="alpha"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
