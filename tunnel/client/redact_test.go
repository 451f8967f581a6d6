package client

import (
	"slices"
	"strings"
	"testing"
)

func TestRedactProxy(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"direct", "direct", "direct"},
		{"no user info", "http://proxy.corp:3128", "http://proxy.corp:3128"},
		{"no user info, no scheme", "proxy.corp:3128", "proxy.corp:3128"},
		{"path kept", "https://proxy.corp:443/", "https://proxy.corp:443/"},
		{"user and password", "http://alice:s3cret@proxy.corp:3128", "http://[redacted]@proxy.corp:3128"},
		{"user only", "http://apikey123@proxy.corp:3128", "http://[redacted]@proxy.corp:3128"},
		{"socks5h", "socks5h://alice:s3cret@socks.corp:1080", "socks5h://[redacted]@socks.corp:1080"},
		{"no scheme", "alice:s3cret@proxy.corp:3128", "[redacted]@proxy.corp:3128"},
		{"percent-encoded", "http://alice:s%40cr%2Fet@proxy.corp:3128", "http://[redacted]@proxy.corp:3128"},
		{"raw @ in the password", "http://alice:s3@cret@proxy.corp:3128", "http://[redacted]@proxy.corp:3128"},
		{"raw / in the password", "http://alice:s3/cret@proxy.corp:3128", "http://[redacted]@proxy.corp:3128"},
		{"raw # in the password", "http://alice:s3#cret@proxy.corp:3128", "http://[redacted]@proxy.corp:3128"},
		{"raw ? in the password", "http://alice:s3?cret@proxy.corp:3128", "http://[redacted]@proxy.corp:3128"},
		{"space in the password", "http://alice:s3 cret@proxy.corp:3128", "http://[redacted]@proxy.corp:3128"},
		{":// in the password", "alice:s3://cret@proxy.corp:3128", "[redacted]@proxy.corp:3128"},
		{"no host", "http://alice:s3cret@", "http://[redacted]@"},
		{"host forgotten", "http://alice:s3cret", "http://alice:[redacted]"},
		{"host forgotten, / in the password", "http://alice:s3/cret", "http://alice:[redacted]"},
		{"host forgotten, no scheme", "alice:s3cret", "alice:[redacted]"},
		{"bad scheme", "1http://alice:s3cret@proxy.corp", "[redacted]@proxy.corp"},
		{"IPv6 host", "http://alice:s3cret@[fd00::1]:3128", "http://[redacted]@[fd00::1]:3128"},
		{"IPv6 host without port", "http://[fd00::1]", "http://[fd00::1]"},
		{"control characters", "http://alice:s3\ncret\x1b@proxy.corp:3128", "http://[redacted]@proxy.corp:3128"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := RedactProxy(tc.in); got != tc.want {
				t.Errorf("RedactProxy(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestProxySecrets(t *testing.T) {
	env := map[string]string{
		"HTTPS_PROXY": "http://alice:s%40cret@proxy.corp:3128",
		"all_proxy":   "socks5://bob:hunter2@socks.corp:1080",
	}
	cfg := Config{Proxy: "carol:pa/ss@proxy.corp:1", Getenv: func(k string) string { return env[k] }}
	got := ProxySecrets(cfg)
	for _, want := range []string{"alice:s%40cret", "s%40cret", "s@cret", "bob:hunter2", "hunter2", "carol:pa/ss", "pa/ss"} {
		if !slices.Contains(got, want) {
			t.Errorf("ProxySecrets = %q, want it to hold %q", got, want)
		}
	}
	for _, s := range got {
		if strings.Contains(s, "proxy.corp") || s == "" {
			t.Errorf("ProxySecrets holds %q, which is not a secret", s)
		}
	}
	for i := 1; i < len(got); i++ {
		if len(got[i]) > len(got[i-1]) {
			t.Errorf("ProxySecrets = %q, want the longest first", got)
		}
	}
	same := func(string) string { return "http://bob:hunter2@socks.corp:1080" }
	if got := ProxySecrets(Config{Proxy: "http://bob:hunter2@other:1", Getenv: same}); !slices.Equal(got, []string{"bob:hunter2", "hunter2"}) {
		t.Errorf("ProxySecrets of one password in every variable = %q, want each secret once", got)
	}
	if got := ProxySecrets(Config{Proxy: "http://proxy.corp:3128", Getenv: func(string) string { return "" }}); len(got) != 0 {
		t.Errorf("ProxySecrets without credentials = %q, want none", got)
	}
}
