package client

import (
	"strings"
	"testing"
)

func TestEgressProxySelection(t *testing.T) {
	tests := []struct {
		name   string
		flag   string
		env    map[string]string
		server string
		want   string // "" = direct
	}{
		{"nothing set", "", nil, "tunnels.example.com:443", ""},
		{"HTTPS_PROXY", "", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"}, "tunnels.example.com:443", "http://proxy.corp:3128"},
		{"lower case https_proxy", "", map[string]string{"https_proxy": "http://proxy.corp:3128"}, "tunnels.example.com:443", "http://proxy.corp:3128"},
		{"ALL_PROXY when no HTTPS_PROXY", "", map[string]string{"ALL_PROXY": "socks5://socks.corp:1080"}, "tunnels.example.com:443", "socks5://socks.corp:1080"},
		{"HTTPS_PROXY wins over ALL_PROXY", "", map[string]string{"HTTPS_PROXY": "http://a:1", "ALL_PROXY": "socks5://b:2"}, "tunnels.example.com:443", "http://a:1"},
		{"HTTP_PROXY alone does not apply to a TLS tunnel", "", map[string]string{"HTTP_PROXY": "http://proxy.corp:3128"}, "tunnels.example.com:443", ""},
		{"NO_PROXY exempts the domain", "", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": ".example.com"}, "tunnels.example.com:443", ""},
		{"no_proxy lower case", "", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "no_proxy": "tunnels.example.com"}, "tunnels.example.com:443", ""},
		{"NO_PROXY for another host", "", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "other.com"}, "tunnels.example.com:443", "http://proxy.corp:3128"},
		{"loopback is never proxied from the environment", "", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"}, "127.0.0.1:7000", ""},
		{"flag overrides the environment", "socks5h://s:1080", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"}, "tunnels.example.com:443", "socks5h://s:1080"},
		{"flag applies even to loopback", "http://p:3128", nil, "127.0.0.1:7000", "http://p:3128"},
		{"direct ignores the environment", "direct", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"}, "tunnels.example.com:443", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &dialer{cfg: Config{Server: tc.server, Proxy: tc.flag, Getenv: func(k string) string { return tc.env[k] }}}
			u, _, err := d.egressProxy()
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if u != nil {
				got = u.String()
			}
			if got != tc.want {
				t.Errorf("proxy = %q, want %q", got, tc.want)
			}
		})
	}
}

// A proxy variable that does not parse is an error naming the variable (not
// a silent direct connection), unless NO_PROXY exempts the server anyway.
func TestEgressProxyFromBadEnvironment(t *testing.T) {
	const bad = "http://alice:pa ss@proxy.corp:3128"
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string // "" = direct, no error
	}{
		{"HTTPS_PROXY", map[string]string{"HTTPS_PROXY": bad}, "HTTPS_PROXY=http://[redacted]@proxy.corp:3128: not a proxy URL"},
		{"all_proxy", map[string]string{"all_proxy": "alice:pa ss@proxy.corp:3128"}, "all_proxy=[redacted]@proxy.corp:3128: not a proxy URL"},
		{"unsupported scheme", map[string]string{"HTTPS_PROXY": "ftp://proxy.corp:21"}, `proxy scheme "ftp" not supported`},
		{"exempted by NO_PROXY", map[string]string{"HTTPS_PROXY": bad, "NO_PROXY": ".example.com"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &dialer{cfg: Config{Server: "tunnels.example.com:443", Getenv: func(k string) string { return tc.env[k] }}}
			u, _, err := d.egressProxy()
			switch {
			case tc.wantErr == "" && (err != nil || u != nil):
				t.Errorf("egressProxy = %v, %v; want direct", u, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("egressProxy error %v, want one saying %q", err, tc.wantErr)
			case err != nil && strings.Contains(err.Error(), "pa ss"):
				t.Errorf("egressProxy error %q shows the password", err)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	base := Config{Server: "tunnels.example.com:443", TokenFile: "/var/run/token"}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"valid", func(*Config) {}, ""},
		{"server without port", func(c *Config) { c.Server = "tunnels.example.com" }, "--server"},
		{"no token file", func(c *Config) { c.TokenFile = "" }, "--token-file"},
		{"bad transport", func(c *Config) { c.Transport = "quic" }, "--transport"},
		{"insecure with a CA", func(c *Config) { c.TLSInsecureSkipVerify, c.TLSCAFile = true, "ca.pem" }, "--tls-insecure-skip-verify"},
		{"bad fingerprint", func(c *Config) { c.TLSFingerprint = "abc" }, "--tls-fingerprint"},
		{"bad proxy scheme", func(c *Config) { c.Proxy = "ftp://p:21" }, "--proxy"},
		{"short heartbeat", func(c *Config) { c.HeartbeatTimeout = 1 }, "--heartbeat-timeout"},
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

func TestParseFingerprint(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	colons := strings.TrimSuffix(strings.Repeat("AB:", 32), ":")
	for _, ok := range []string{hex, colons} {
		if _, err := parseFingerprint(ok); err != nil {
			t.Errorf("parseFingerprint(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "ab", hex + "00", strings.Repeat("zz", 32)} {
		if _, err := parseFingerprint(bad); err == nil {
			t.Errorf("parseFingerprint(%q) accepted", bad)
		}
	}
}
