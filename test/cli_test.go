package test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCLIBadInput: a wrong invocation or configuration ends with exit status
// 2 and a message that names what is wrong.
func TestCLIBadInput(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	dir := t.TempDir()
	token := writeToken(t, k.issue(t, "alpha", time.Hour))
	badSubToken := writeToken(t, signToken(t, k.priv, "", claimsFor("Not_A_Label")))
	unknownKey := writeFile(t, dir, "unknown-key.yaml", fmt.Sprintf(
		"server: 127.0.0.1:7000\ntoken-file: %s\nheartbeat-timout: 5s\n", token))
	wrongType := writeFile(t, dir, "wrong-type.yaml", fmt.Sprintf(
		"server: 127.0.0.1:7000\ntoken-file: %s\nheartbeat-timeout: [1, 2]\n", token))
	wrongValue := writeFile(t, dir, "wrong-value.yaml", fmt.Sprintf(
		"server: 127.0.0.1:7000\ntoken-file: %s\nheartbeat-timeout: soon\n", token))
	missing := filepath.Join(dir, "no-such-token")
	client := func(extra ...string) []string {
		return append([]string{"client", "--server", "127.0.0.1:7000", "--token-file", token,
			"--route", "/=http://127.0.0.1:1", "--health-addr", "127.0.0.1:0"}, extra...)
	}

	cases := []struct {
		name string
		args []string
		env  []string
		want []string // every one appears in stderr
	}{
		{name: "missing token file",
			args: []string{"client", "--server", "127.0.0.1:7000", "--token-file", missing, "--route", "/=http://127.0.0.1:1"},
			want: []string{"--token-file", missing}},
		{name: "token whose sub is not a tunnel name",
			args: []string{"client", "--server", "127.0.0.1:7000", "--token-file", badSubToken, "--route", "/=http://127.0.0.1:1"},
			want: []string{"--token-file", "Not_A_Label"}},
		{name: "route without =", args: client("--route", "/api"), want: []string{"/api", "PREFIX=URL"}},
		{name: "route with a non-http upstream", args: client("--route", "/x=ftp://files.example"), want: []string{"ftp://files.example"}},
		{name: "route with a bad timeout", args: client("--route", "/x=http://127.0.0.1:1;timeout=soon"), want: []string{"timeout", "soon"}},
		{name: "config file with an unknown key", args: []string{"client", "--config", unknownKey},
			want: []string{`"heartbeat-timout"`, unknownKey, "line 3"}},
		{name: "config file with a list for a duration", args: []string{"client", "--config", wrongType},
			want: []string{`"heartbeat-timeout"`, wrongType, "line 3"}},
		{name: "config file with a bad duration", args: []string{"client", "--config", wrongValue},
			want: []string{`"heartbeat-timeout"`, wrongValue, "soon"}},
		{name: "server without port",
			args: []string{"client", "--server", "127.0.0.1", "--token-file", token, "--route", "/=http://127.0.0.1:1"},
			want: []string{"--server", `"127.0.0.1"`, "HOST:PORT"}},
		{name: "environment variable with a bad value", args: client(), env: []string{"TETHER_HEARTBEAT_TIMEOUT=soon"},
			want: []string{"TETHER_HEARTBEAT_TIMEOUT", "soon"}},
		{name: "unknown flag", args: client("--frobnicate"), want: []string{"frobnicate"}},
		{name: "unknown transport", args: client("--transport", "quic"), want: []string{"--transport", "quic"}},
		{name: "server without domain",
			args: []string{"server", "--jwt-public-key", k.pub, "--tunnel-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"},
			want: []string{"--domain"}},
		{name: "server with a missing key file",
			args: []string{"server", "--domain", domain, "--jwt-public-key", filepath.Join(dir, "no-such-key.pem"),
				"--tunnel-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"},
			want: []string{"no-such-key.pem"}},
		{name: "server with a public admin address and no admin token",
			args: []string{"server", "--domain", domain, "--jwt-public-key", k.pub,
				"--tunnel-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "0.0.0.0:0"},
			want: []string{"--admin-addr", "--admin-token-file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runTether(t, tc.env, tc.args...)
			if code != 2 {
				t.Errorf("exit status %d, want 2; stderr:\n%s", code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not name %q:\n%s", w, stderr)
				}
			}
		})
	}

	t.Run("address in use", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		taken := ln.Addr().String()
		// inUse runs tether with an address that is taken and checks that it
		// fails naming the flag and the address.
		inUse := func(flag string, args ...string) {
			t.Helper()
			code, _, stderr := runTether(t, nil, args...)
			t.Logf("%s with %s %s in use: exit status %d", args[0], flag, taken, code)
			if code != 1 && code != 2 {
				t.Errorf("%s: exit status %d, want 1 or 2", args[0], code)
			}
			for _, w := range []string{flag, taken} {
				if !strings.Contains(stderr, w) {
					t.Errorf("%s: stderr does not name %q:\n%s", args[0], w, stderr)
				}
			}
		}
		inUse("--http-addr", "server", "--domain", domain, "--jwt-public-key", k.pub,
			"--tunnel-addr", "127.0.0.1:0", "--http-addr", taken, "--admin-addr", "127.0.0.1:0")
		inUse("--health-addr", client("--health-addr", taken)...)
	})
}

// TestConfigPrecedence: every flag can come from the config file or the
// environment; a flag beats the environment, which beats the file.
func TestConfigPrecedence(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	dir := t.TempDir()
	token := writeToken(t, k.issue(t, "alpha", time.Hour))
	cfg := writeFile(t, dir, "client.yaml", fmt.Sprintf(`server: file.invalid:1
token-file: %s
route:
  - /=http://127.0.0.1:1
  - /api=http://127.0.0.1:2/v1
health-addr: 127.0.0.1:0
dial-timeout: 1s
`, token))
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"file", nil, nil, "file.invalid:1"},
		{"environment over file", nil, []string{"TETHER_SERVER=env.invalid:2"}, "env.invalid:2"},
		{"flag over environment", []string{"--server", "flag.invalid:3"}, []string{"TETHER_SERVER=env.invalid:2"}, "flag.invalid:3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startProc(t, "tether client", tc.env, tetherBin, append([]string{"client", "--config", cfg}, tc.args...)...)
			started := p.waitLog("tether client started", startTimeout)
			c := &client{proc: p, healthAddr: str(started["health_addr"])}
			testutil.WaitFor(t, 10*time.Second, func() error {
				st, err := c.status()
				if err != nil {
					return err
				}
				if st.Server != tc.want {
					t.Fatalf("client uses server %q, want %q", st.Server, tc.want)
				}
				prefixes := []string{}
				for _, r := range st.Routes {
					prefixes = append(prefixes, r.Prefix)
				}
				if !slices.Contains(prefixes, "/") || !slices.Contains(prefixes, "/api") || len(prefixes) != 2 {
					t.Fatalf("client routes %+v, want the two of the config file", st.Routes)
				}
				return nil
			})
		})
	}
}

// TestMemoryLimit: --memory-limit, given as a flag or in the environment,
// is logged by the server and the client as they start, and is the Go
// runtime's limit (the server's /metrics shows the runtime's; the client's
// shows only the tunnel's).
func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	s := startServer(t, k, serverOpts{args: []string{"--memory-limit", "1GiB"}})
	c := startClient(t, s, clientOpts{
		tokenFile: writeToken(t, k.issue(t, "mem", time.Hour)),
		routes:    []string{"/=http://127.0.0.1:1"},
		env:       []string{"TETHER_MEMORY_LIMIT=48MiB"},
		noWait:    true,
	})
	for p, want := range map[*proc]string{s.proc: "1.0GiB (--memory-limit)", c.proc: "48MiB (--memory-limit)"} {
		if got := str(p.waitLog("memory limit", startTimeout)["limit"]); got != want {
			t.Errorf("%s logged memory limit %q, want %q", p.name, got, want)
		}
	}
	if got := s.metric(t, "go_gc_gomemlimit_bytes"); got != 1<<30 {
		t.Errorf("server go_gc_gomemlimit_bytes = %v, want %v", got, 1<<30)
	}
}
