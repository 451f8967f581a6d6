package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/tunnel/client"
)

// runTether runs one command line in-process with the given environment.
func runTether(t *testing.T, env map[string]string, r runners, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	f := &Factory{Out: &out, ErrOut: &errOut, LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	code = run(context.Background(), args, f, r)
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Flags win over the environment, the environment over the config file.
func TestServerOptionsPrecedence(t *testing.T) {
	cfg := writeFile(t, "server.yaml", "domain: from-file.example.com\nhttp-addr: 127.0.0.1:1111\ntunnel-addr: 127.0.0.1:2222\n")
	env := map[string]string{"TETHER_HTTP_ADDR": "127.0.0.1:3333", "TETHER_TUNNEL_ADDR": "127.0.0.1:4444"}
	var got *ServerOptions
	code, _, stderr := runTether(t, env, runners{server: func(o *ServerOptions) error { got = o; return nil }},
		"server", "--config", cfg, "--tunnel-addr", "127.0.0.1:5555")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, c := range []struct{ name, got, want string }{
		{"domain (file)", got.Domain, "from-file.example.com"},
		{"http-addr (env over file)", got.HTTPAddr, "127.0.0.1:3333"},
		{"tunnel-addr (flag over env)", got.TunnelAddr, "127.0.0.1:5555"},
		{"admin-addr (default)", got.AdminAddr, "127.0.0.1:7700"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if got.HeartbeatTimeout != 60*time.Second {
		t.Errorf("heartbeat-timeout = %v, want the 60s default", got.HeartbeatTimeout)
	}
	if got.MaxAnonymousPerIP != 64 {
		t.Errorf("max-anonymous-per-ip = %d, want the default 64", got.MaxAnonymousPerIP)
	}
}

// A negative --max-anonymous-per-ip is refused with a message naming it.
func TestServerRefusesANegativeAnonymousCap(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub.pem")
	if err := auth.GenerateKeyPair(auth.EdDSA, priv, pub); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runTether(t, map[string]string{"TETHER_MAX_ANONYMOUS_PER_IP": "-1"}, runners{},
		"server", "--domain", "tunnels.example.com", "--jwt-public-key", pub, "--tunnel-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0")
	if code != exitUsage || !strings.Contains(stderr, "--max-anonymous-per-ip -1") {
		t.Errorf("exit %d, stderr %q; want exit %d naming --max-anonymous-per-ip -1", code, stderr, exitUsage)
	}
}

// The fair-share flags come from the file, the environment and the
// command line like every flag; --max-requests-per-caller defaults to 0,
// which the server reads as a quarter of --max-requests-per-tunnel.
func TestServerFairShareFlags(t *testing.T) {
	cfg := writeFile(t, "server.yaml", "max-http-connections-per-ip: 100\nbody-idle-timeout: 10s\n")
	env := map[string]string{"TETHER_MAX_REQUESTS_PER_CALLER": "64"}
	var got *ServerOptions
	run := runners{server: func(o *ServerOptions) error { got = o; return nil }}
	if code, _, stderr := runTether(t, nil, run, "server"); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if got.MaxHTTPConnectionsPerIP != 1024 || got.MaxRequestsPerCaller != 0 || got.BodyIdleTimeout != 30*time.Second {
		t.Errorf("defaults: per-ip %d, per-caller %d, body-idle-timeout %v; want 1024, 0, 30s", got.MaxHTTPConnectionsPerIP, got.MaxRequestsPerCaller, got.BodyIdleTimeout)
	}
	if code, _, stderr := runTether(t, env, run, "server", "--config", cfg, "--body-idle-timeout", "5s"); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if got.MaxHTTPConnectionsPerIP != 100 || got.MaxRequestsPerCaller != 64 || got.BodyIdleTimeout != 5*time.Second {
		t.Errorf("per-ip %d (file), per-caller %d (env), body-idle-timeout %v (flag over file); want 100, 64, 5s",
			got.MaxHTTPConnectionsPerIP, got.MaxRequestsPerCaller, got.BodyIdleTimeout)
	}
}

// The webhook buffer's flags default to their packages' defaults and come
// from the file, the environment and the command line; a bad one is
// refused naming it.
func TestServerBufferFlags(t *testing.T) {
	var got *ServerOptions
	run := runners{server: func(o *ServerOptions) error { got = o; return nil }}
	if code, _, stderr := runTether(t, nil, run, "server"); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if got.BufferRetention != 72*time.Hour || got.BufferMaxBody != 10<<20 || got.BufferMaxRequests != 1000 ||
		got.BufferMaxBytes != 64<<20 || got.BufferMaxTotalBytes != 1<<30 {
		t.Errorf("defaults: %v %d %d %d %d; want 72h, 10 MiB, 1000, 64 MiB, 1 GiB",
			got.BufferRetention, got.BufferMaxBody, got.BufferMaxRequests, got.BufferMaxBytes, got.BufferMaxTotalBytes)
	}
	cfg := writeFile(t, "server.yaml", "buffer-retention: 1h\nbuffer-max-requests: 5\n")
	env := map[string]string{"TETHER_BUFFER_MAX_BODY": "1024", "TETHER_BUFFER_MAX_TOTAL_BYTES": "4096"}
	if code, _, stderr := runTether(t, env, run, "server", "--config", cfg, "--buffer-max-bytes", "2048"); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if got.BufferRetention != time.Hour || got.BufferMaxRequests != 5 || got.BufferMaxBody != 1024 ||
		got.BufferMaxTotalBytes != 4096 || got.BufferMaxBytes != 2048 {
		t.Errorf("got %v %d %d %d %d; want 1h, 5 (file), 1024, 4096 (env), 2048 (flag)",
			got.BufferRetention, got.BufferMaxRequests, got.BufferMaxBody, got.BufferMaxTotalBytes, got.BufferMaxBytes)
	}

	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub.pem")
	if err := auth.GenerateKeyPair(auth.EdDSA, priv, pub); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runTether(t, nil, runners{},
		"server", "--domain", "tunnels.example.com", "--jwt-public-key", pub, "--tunnel-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir", dir,
		"--buffer-max-body", "2048", "--buffer-max-bytes", "1024")
	if code != exitUsage || !strings.Contains(stderr, "--buffer-max-body 2048 is above --buffer-max-bytes 1024") {
		t.Errorf("exit %d, stderr %q; want exit %d naming --buffer-max-body", code, stderr, exitUsage)
	}
}

func TestClientRoutesFromFileAndEnv(t *testing.T) {
	cfg := writeFile(t, "client.yaml", "server: tunnels.example.com:7000\nroute:\n  - /=http://a:80\n  - /x=http://b:80/;timeout=0\n")
	var got *ClientOptions
	code, _, stderr := runTether(t, map[string]string{"TETHER_TOKEN_FILE": "/var/run/token"},
		runners{client: func(o *ClientOptions) error { got = o; return nil }}, "client", "--config", cfg)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if got.Server != "tunnels.example.com:7000" || got.TokenFile != "/var/run/token" {
		t.Errorf("server %q token-file %q", got.Server, got.TokenFile)
	}
	if want := []string{"/=http://a:80", "/x=http://b:80/;timeout=0"}; strings.Join(got.Routes, " ") != strings.Join(want, " ") {
		t.Errorf("routes %q, want %q", got.Routes, want)
	}
}

// --connections defaults to 2, comes from the file and the environment like
// every flag, and outside 1..16 is an invalid invocation naming the flag.
func TestClientConnections(t *testing.T) {
	base := []string{"client", "--server", "t.example.com:7000", "--token-file", "/x"}
	cfg := writeFile(t, "client.yaml", "connections: 4\n")
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want int
	}{
		{name: "default", want: 2},
		{name: "file", args: []string{"--config", cfg}, want: 4},
		{name: "env over file", env: map[string]string{"TETHER_CONNECTIONS": "8"}, args: []string{"--config", cfg}, want: 8},
		{name: "flag", env: map[string]string{"TETHER_CONNECTIONS": "8"}, args: []string{"--connections", "1"}, want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got client.Config
			code, _, stderr := runTether(t, tc.env, runners{client: func(o *ClientOptions) error {
				var err error
				got, err = o.config(&Factory{})
				return err
			}}, append(base, tc.args...)...)
			if code != exitOK || got.Connections != tc.want {
				t.Errorf("exit %d (%s), connections %d; want %d", code, stderr, got.Connections, tc.want)
			}
		})
	}
	for _, bad := range []string{"0", "17", "-1"} {
		code, _, stderr := runTether(t, nil, runners{}, append(base, "--connections", bad)...)
		if want := "--connections " + bad + ": want 1 to 16"; code != exitUsage || !strings.Contains(stderr, want) {
			t.Errorf("--connections %s: exit %d, stderr %q; want exit %d and %q", bad, code, stderr, exitUsage, want)
		}
	}
}

func TestExitCodes(t *testing.T) {
	badCfg := writeFile(t, "bad.yaml", "domian: x.example.com\n")
	tests := []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"unknown flag", []string{"server", "--no-such-flag"}, exitUsage, "--no-such-flag"},
		{"unknown config key", []string{"server", "--config", badCfg}, exitUsage, `"domian"`},
		{"missing domain", []string{"server", "--jwt-public-key", "/nonexistent.pem"}, exitUsage, "--jwt-public-key"},
		{"client without token file", []string{"client", "--server", "t.example.com:7000"}, exitUsage, "--token-file"},
		{"invalid route", []string{"client", "--server", "t.example.com:7000", "--token-file", "/x", "--route", "argo=http://a"}, exitUsage, `"argo=http://a"`},
		{"issue without key", []string{"token", "issue", "--tunnel", "acme", "--ttl", "1h"}, exitUsage, "--key"},
		{"client memory limit", []string{"client", "--server", "t.example.com:7000", "--token-file", "/x", "--memory-limit", "lots"}, exitUsage, `--memory-limit: size "lots"`},
		{"server memory limit", []string{"server", "--memory-limit", "0"}, exitUsage, "--memory-limit 0"},
		{"version", []string{"version"}, exitOK, ""},
		{"version as yaml", []string{"version", "-o", "yaml"}, exitUsage, `--output "yaml"`},
		{"no command", nil, exitOK, ""},
		{"unknown command", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate" for "tether"`},
		{"unknown command, suggested", []string{"serve"}, exitUsage, "Did you mean 'tether server'?"},
		{"unknown token command", []string{"token", "revoke-all"}, exitUsage, `unknown command "revoke-all" for "tether token"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runTether(t, nil, runners{}, tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and a message containing %q", code, stderr, tc.code, tc.want)
			}
		})
	}
}

// The exit codes are documented once, in exitCodesHelp: tether --help
// prints it, and the operations guide quotes it as it is.
func TestExitCodesDocumented(t *testing.T) {
	_, stdout, _ := runTether(t, nil, runners{}, "--help")
	if !strings.Contains(stdout, exitCodesHelp) {
		t.Errorf("tether --help does not list the exit codes:\n%s", stdout)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), exitCodesHelp) {
		t.Errorf("docs/operations.md does not quote the exit codes of tether --help:\n%s", exitCodesHelp)
	}
}

// tether version -o json prints one object with the stable keys.
func TestVersionJSON(t *testing.T) {
	code, stdout, stderr := runTether(t, nil, runners{}, "version", "-o", "json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got map[string]any
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Fatalf("stdout is not one JSON object (%v):\n%s", err, stdout)
	}
	for _, k := range []string{"version", "frp_version", "go_version", "platform"} {
		if s, _ := got[k].(string); s == "" {
			t.Errorf("key %q is %v; want a non-empty string", k, got[k])
		}
	}
	if v, _ := got["frp_version"].(string); !strings.HasPrefix(v, "v") {
		t.Errorf("frp_version %q; want the module version of frp from the build information", v)
	}
}

// keygen and issue make a token the server's verifier accepts.
func TestTokenKeygenAndIssue(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub.pem")
	if code, out, stderr := runTether(t, nil, runners{}, "token", "keygen", "--private-key", priv, "--public-key", pub); code != exitOK {
		t.Fatalf("keygen: exit %d: %s", code, stderr)
	} else if !strings.Contains(out, "EdDSA") {
		t.Errorf("keygen output %q does not name the algorithm", out)
	}
	code, out, stderr := runTether(t, nil, runners{}, "token", "issue", "--key", priv, "--tunnel", "acme", "--account", "a1", "--ttl", "1h")
	if code != exitOK {
		t.Fatalf("issue: exit %d: %s", code, stderr)
	}
	keys, err := auth.NewFileKeySource(pub)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewVerifier(auth.VerifierConfig{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	claims, err := v.Verify(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("the issued token does not verify: %v", err)
	}
	if claims.Tunnel != "acme" || claims.Account != "a1" {
		t.Errorf("claims %+v", claims)
	}
	if code, _, stderr := runTether(t, nil, runners{}, "token", "keygen", "--private-key", priv, "--public-key", pub); code == exitOK {
		t.Errorf("keygen overwrote existing files; stderr %q", stderr)
	}
}

// --memory-limit comes from the flag, the environment or the file, for the
// client and the server alike.
func TestMemoryLimitOption(t *testing.T) {
	var client *ClientOptions
	var server *ServerOptions
	r := runners{
		client: func(o *ClientOptions) error { client = o; return nil },
		server: func(o *ServerOptions) error { server = o; return nil },
	}
	env := map[string]string{"TETHER_MEMORY_LIMIT": "64MiB"}
	if code, _, stderr := runTether(t, env, r, "client", "--server", "t.example.com:7000", "--token-file", "/x"); code != exitOK || client.MemoryLimit != "64MiB" {
		t.Errorf("client: exit %d (%s), memory limit %q; want 64MiB from TETHER_MEMORY_LIMIT", code, stderr, client.MemoryLimit)
	}
	cfg := writeFile(t, "server.yaml", "memory-limit: 1GiB\n")
	if code, _, stderr := runTether(t, nil, r, "server", "--config", cfg); code != exitOK || server.MemoryLimit != "1GiB" {
		t.Errorf("server: exit %d (%s), memory limit %q; want 1GiB from the file", code, stderr, server.MemoryLimit)
	}
}

// --access-log comes from the file, the environment and the command line
// like every flag, and is off by default.
func TestServerAccessLogFlag(t *testing.T) {
	var got *ServerOptions
	run := runners{server: func(o *ServerOptions) error { got = o; return nil }}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want bool
	}{
		{"default", nil, nil, false},
		{"file", nil, []string{"--config", writeFile(t, "server.yaml", "access-log: true\n")}, true},
		{"env", map[string]string{"TETHER_ACCESS_LOG": "true"}, nil, true},
		{"flag", nil, []string{"--access-log"}, true},
	} {
		if code, _, stderr := runTether(t, tc.env, run, append([]string{"server"}, tc.args...)...); code != exitOK {
			t.Fatalf("%s: exit %d: %s", tc.name, code, stderr)
		}
		if got.AccessLog != tc.want {
			t.Errorf("%s: AccessLog %v, want %v", tc.name, got.AccessLog, tc.want)
		}
	}
}
