package registry

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want target
		str  string
	}{
		{"redis://redis:6379", target{addr: "redis:6379"}, "redis://redis:6379/0"},
		{"redis://redis", target{addr: "redis:6379"}, "redis://redis:6379/0"},
		{"redis://10.0.0.5:6380/3", target{addr: "10.0.0.5:6380", db: 3}, "redis://10.0.0.5:6380/3"},
		{"rediss://redis.example.com/", target{tls: true, addr: "redis.example.com:6379"}, "rediss://redis.example.com:6379/0"},
		{"redis://[::1]:7000/1", target{addr: "[::1]:7000", db: 1}, "redis://[::1]:7000/1"},
		{"redis://:s3cret@redis:6379/0", target{addr: "redis:6379", password: "s3cret"}, "redis://redis:6379/0"},
		{"redis://tether:s3cret@redis/2", target{addr: "redis:6379", db: 2, username: "tether", password: "s3cret"}, "redis://tether@redis:6379/2"},
	} {
		got, err := parseURL(tc.url)
		if err != nil {
			t.Errorf("parseURL(%q): %v", tc.url, err)
			continue
		}
		if got != tc.want {
			t.Errorf("parseURL(%q): got %+v, want %+v", tc.url, got, tc.want)
		}
		if got.String() != tc.str {
			t.Errorf("parseURL(%q).String(): got %q, want %q", tc.url, got.String(), tc.str)
		}
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, tc := range []struct {
		url, want string
	}{
		{"http://redis:6379", "want redis://HOST[:PORT][/DB]"},
		{"redis:6379", "want redis://HOST[:PORT][/DB]"},
		{"redis://", "has no host"},
		{"redis:///0", "has no host"},
		{"redis://redis:0", `port "0": want 1-65535`},
		{"redis://redis:6379/x", `database "x" is not a number`},
		{"redis://redis:6379/0/1", `database "0/1" is not a number`},
		{"redis://redis:6379/0?dial_timeout=3s", "options after '?' or '#' are not supported"},
		{"redis://:s3cret@redis:6379/x", `"redis://xxxxx@redis:6379/x"`},
		{"redis://:s3cret@redis:port", `"redis://xxxxx@redis:port" is not a URL`},
		{"redis://:s3/cret@redis:6379", `"redis://xxxxx@redis:6379" is not a URL`},
		{"redis://u:s3cret%zz@redis", `"redis://xxxxx@redis" is not a URL`},
	} {
		_, err := parseURL(tc.url)
		if err == nil {
			t.Errorf("parseURL(%q): no error, want one with %q", tc.url, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--registry") {
			t.Errorf("parseURL(%q): got %q, want it to name --registry and say %q", tc.url, err, tc.want)
		}
		for _, secret := range []string{"s3cret", "cret"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("parseURL(%q): the error shows the password: %q", tc.url, err)
			}
		}
	}
}

func TestConfigErrors(t *testing.T) {
	log := zaptest.NewLogger(t)
	_, err := NewRedis(Config{
		URL: "redis://redis", Replica: "pod:0", Addr: "7443", TTL: 500 * time.Millisecond, Prefix: "my prefix",
	}, "", log)
	if err == nil {
		t.Fatal("no error for a bad config")
	}
	for _, want := range []string{
		`--replica-id "pod:0" contains ':'`,
		`--peer-advertise-addr "7443": want HOST:PORT`,
		"registry TTL 500ms: want at least 1s",
		`registry key prefix "my prefix" contains white space`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("got %q, want it to say %q", err, want)
		}
	}

	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "redis://redis", Addr: "10.0.0.1:7443"}, "--replica-id is empty"},
		{Config{URL: "redis://redis", Replica: "a"}, "--peer-advertise-addr \"\": required with a Redis registry"},
		{Config{URL: "redis://redis", Replica: "a", Addr: ":7443"}, "not just a port"},
		{Config{URL: "redis://redis", Replica: "a", Addr: "10.0.0.1:7443", Refresh: 10 * time.Second}, "registry refresh 10s"},
	} {
		if _, err := NewRedis(tc.cfg, "", log); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewRedis(%+v): got %v, want an error with %q", tc.cfg, err, tc.want)
		}
	}

	_, err = NewRedis(Config{URL: "redis://:in-url@redis", Replica: "a", Addr: "10.0.0.1:7443"}, "in-file", log)
	if err == nil || !strings.Contains(err.Error(), "keep it in the file only") || strings.Contains(err.Error(), "in-url") || strings.Contains(err.Error(), "in-file") {
		t.Errorf("a password in both the URL and the file: got %v, want an error that names neither", err)
	}
}

func TestDefaults(t *testing.T) {
	r, err := NewRedis(Config{URL: "redis://redis", Replica: "a", Addr: "10.0.0.1:7443"}, "", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.cfg.Prefix != "tether:" || r.cfg.TTL != 15*time.Second || r.cfg.Refresh != 5*time.Second {
		t.Errorf("defaults: got prefix %q, TTL %v, refresh %v; want tether:, 15s, 5s", r.cfg.Prefix, r.cfg.TTL, r.cfg.Refresh)
	}
	if st := r.Status(); st.Up || st.Target != "redis://redis:6379/0" {
		t.Errorf("status before Run: got %+v, want down, target redis://redis:6379/0", st)
	}
}

func TestReadPassword(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		path, want string
	}{
		{write("plain", "pa ss"), "pa ss"},
		{write("newline", "pa ss\n"), "pa ss"},
		{write("crlf", "pa ss\r\n"), "pa ss"},
	} {
		if got, err := ReadPassword(tc.path); err != nil || got != tc.want {
			t.Errorf("ReadPassword(%s): got %q, %v; want %q", filepath.Base(tc.path), got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		path, want string
	}{
		{filepath.Join(dir, "missing"), "read --registry-password-file"},
		{write("empty", "\n"), "is empty: put the Redis password in it"},
		{write("big", strings.Repeat("secret", 1000)), "is over 4096 bytes"},
	} {
		_, err := ReadPassword(tc.path)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("ReadPassword(%s): got %v, want an error with %q and without the content", filepath.Base(tc.path), err, tc.want)
		}
	}
}

func TestSchema(t *testing.T) {
	s := newSchema("a*:")
	key := s.key("tun:nel", "pod-0")
	if tunnel, replica, ok := s.parseKey(key); !ok || tunnel != "tun:nel" || replica != "pod-0" {
		t.Errorf("parseKey(%q): got %q, %q, %v", key, tunnel, replica, ok)
	}
	for _, bad := range []string{"ab:tunnel:t:r", "a*:tunnel:t", "a*:tunnel::r", "a*:tunnel:t:"} {
		if _, _, ok := s.parseKey(bad); ok {
			t.Errorf("parseKey(%q) accepted a key that is not a tunnel key of prefix a*:", bad)
		}
	}
	if got, want := s.tunnelPattern(), `a\*:tunnel:*`; got != want {
		t.Errorf("pattern: got %q, want %q", got, want)
	}
	epoch, addr, err := parseValue(value(42, "10.0.0.1:7443"))
	if err != nil || epoch != 42 || addr != "10.0.0.1:7443" {
		t.Errorf("value round trip: got %d, %q, %v", epoch, addr, err)
	}
}
