package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
)

// contractReport is the JSON object DESIGN.md promises, decoded strictly.
type contractReport struct {
	OK     bool `json:"ok"`
	Checks []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
		Detail string `json:"detail"`
		Hint   string `json:"hint"`
	} `json:"checks"`
}

func TestDiagnoseJSONContract(t *testing.T) {
	token := writeFile(t, "token", "not-a-jwt")
	code, stdout, stderr := runTether(t, nil, runners{}, "diagnose", "--output", "json", "--timeout", "2s",
		"--server", testutil.ClosedAddr(t), "--token-file", token, "--route", "/="+"http://"+testutil.ClosedAddr(t), "--proxy", "direct")
	if code != exitFail {
		t.Errorf("exit %d, want %d (a check failed); stderr: %s", code, exitFail, stderr)
	}
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	var r contractReport
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("stdout is not the contract's JSON object: %v\n%s", err, stdout)
	}
	if dec.More() {
		t.Errorf("stdout holds more than one JSON value:\n%s", stdout)
	}
	if r.OK {
		t.Error(`"ok" is true with failing checks`)
	}
	var names []string
	statuses := map[string]string{}
	for _, c := range r.Checks {
		names = append(names, c.Name)
		statuses[c.Name] = c.Status
		if !slices.Contains([]string{"pass", "warn", "fail", "skip"}, c.Status) {
			t.Errorf("check %s has status %q", c.Name, c.Status)
		}
		if (c.Status == "fail" || c.Status == "warn") && c.Hint == "" {
			t.Errorf("check %s is %s without a hint", c.Name, c.Status)
		}
	}
	want := []string{"config", "proxy", "dns", "tcp", "tls", "clock", "token", "login", "upstream /", "end-to-end"}
	if !slices.Equal(names, want) {
		t.Errorf("checks %v, want %v in that order", names, want)
	}
	for name, status := range map[string]string{"tcp": "fail", "token": "fail", "upstream /": "fail", "tls": "skip", "login": "skip"} {
		if statuses[name] != status {
			t.Errorf("check %s = %s, want %s", name, statuses[name], status)
		}
	}
}

// A mistake in the config file is a failing check, named with its source,
// not an exit before the diagnosis.
func TestDiagnoseReportsConfigProblems(t *testing.T) {
	cfg := writeFile(t, "client.yaml", "server: 127.0.0.1:1\ntransprot: wss\n")
	env := map[string]string{"TETHER_TRANSPORT": "quic", "TETHER_MEMORY_LIMIT": "lots"}
	code, stdout, _ := runTether(t, env, runners{},
		"diagnose", "--config", cfg, "--token-file", writeFile(t, "token", "x"), "--timeout", "1s", "--route", "/=http://127.0.0.1:1")
	if code != exitFail {
		t.Errorf("exit %d, want %d", code, exitFail)
	}
	for _, want := range []string{
		"FAIL config",
		"transprot",                           // the misspelt key
		"transport from env TETHER_TRANSPORT", // where the bad value came from
		`--memory-limit: size "lots"`,
		"memory-limit from env TETHER_MEMORY_LIMIT",
		"server = 127.0.0.1:1 (file " + cfg + ")",
		"hint: fix the settings",
		"FAILED: config",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output does not mention %q:\n%s", want, stdout)
		}
	}
}

func TestDiagnoseBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"diagnose", "--output", "yaml"},
		{"diagnose", "--requests", "0"},
	} {
		code, _, stderr := runTether(t, nil, runners{}, args...)
		if code != exitUsage || !strings.Contains(stderr, args[1]) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d naming %s", args, code, stderr, exitUsage, args[1])
		}
	}
}

// The egress proxy's password is in no file of a support bundle: not in the
// settings, the checks, or what the client's health address serves, whether
// the proxy value is well formed (here percent-encoded) or not.
func TestDiagnoseBundleHidesProxyPassword(t *testing.T) {
	const password, encoded = "s3cret-Pw!", "s3cret%2DPw%21"
	closed := testutil.ClosedAddr(t)
	tests := []struct {
		name  string
		env   map[string]string
		flags []string
		leak  []string // what the client's log holds, against the rules
		shown string   // in the bundle's report or config instead
	}{
		{
			name:  "HTTPS_PROXY, percent-encoded",
			env:   map[string]string{"HTTPS_PROXY": "http://alice:" + encoded + "@" + closed},
			leak:  []string{"http://alice:" + encoded + "@" + closed, password},
			shown: "egress proxy http://[redacted]@" + closed,
		},
		{
			name:  "--proxy that does not parse",
			flags: []string{"--proxy", "http://alice:" + password + " @" + closed},
			leak:  []string{"http://alice:" + password + " @" + closed},
			shown: "proxy = http://[redacted]@" + closed,
		},
		{
			name:  "--proxy without a host",
			flags: []string{"--proxy", "http://alice:" + password},
			leak:  []string{"http://alice:" + password},
			shown: "proxy = http://alice:[redacted]",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/status":
					_, _ = w.Write([]byte(`{"tunnel":"acme","server":"tunnels.example.invalid:443"}`))
				case "/debug/logs":
					for _, l := range tc.leak {
						_, _ = fmt.Fprintf(w, "{\"msg\":\"dial\",\"proxy\":%q}\n", l)
					}
				default:
					http.NotFound(w, r)
				}
			}))
			defer health.Close()
			bundle := filepath.Join(t.TempDir(), "bundle.tar.gz")
			args := append([]string{"diagnose", "--bundle", bundle, "--timeout", "2s",
				"--server", "tunnels.example.invalid:443", "--token-file", writeFile(t, "token", "not-a-jwt-token"),
				"--route", "/=http://" + closed, "--health-addr", strings.TrimPrefix(health.URL, "http://")}, tc.flags...)
			_, stdout, stderr := runTether(t, tc.env, runners{}, args...)
			for what, text := range map[string]string{"stdout": stdout, "stderr": stderr} {
				if strings.Contains(text, password) || strings.Contains(text, encoded) {
					t.Errorf("%s shows the proxy password:\n%s", what, text)
				}
			}
			f, err := os.Open(bundle)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			files := testutil.UntarGz(t, f)
			if !strings.Contains(files["report.txt"]+files["config.txt"], tc.shown) {
				t.Errorf("the bundle does not say %q:\n%s\n%s", tc.shown, files["report.txt"], files["config.txt"])
			}
			if !strings.Contains(files["logs.txt"], "[redacted]") {
				t.Errorf("logs.txt = %q, want the password replaced", files["logs.txt"])
			}
			for name, data := range files {
				if strings.Contains(data, password) || strings.Contains(data, encoded) {
					t.Errorf("bundle file %s holds the proxy password:\n%s", name, data)
				}
			}
		})
	}
}

// --bundle - writes the support bundle to stdout, and nothing else: the
// report goes to stderr, so `kubectl exec ... -- tether diagnose --bundle -
// > bundle.tar.gz` works in a container whose root is read-only.
func TestDiagnoseBundleToStdout(t *testing.T) {
	for _, output := range []string{"text", "json"} {
		t.Run(output, func(t *testing.T) {
			token := "not-a-jwt-but-secret"
			code, stdout, stderr := runTether(t, nil, runners{}, "diagnose", "--bundle", "-", "--output", output, "--timeout", "1s",
				"--server", testutil.ClosedAddr(t), "--token-file", writeFile(t, "token", token),
				"--route", "/=http://"+testutil.ClosedAddr(t), "--proxy", "direct")
			if code != exitFail {
				t.Errorf("exit %d; want %d (checks failed)", code, exitFail)
			}
			files := testutil.UntarGz(t, strings.NewReader(stdout))
			for _, name := range []string{"report.json", "report.txt", "version.txt", "config.txt", "missing.txt"} {
				if _, ok := files[name]; !ok {
					t.Errorf("the archive on stdout has no %s; it has %v", name, slices.Sorted(maps.Keys(files)))
				}
			}
			if !strings.Contains(files["report.txt"], "FAIL tcp") {
				t.Errorf("report.txt in the archive:\n%s", files["report.txt"])
			}
			want := "FAIL tcp"
			if output == "json" {
				want = `"status": "fail"`
			}
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr does not carry the report (%q):\n%s", want, stderr)
			}
			if strings.Contains(stdout, token) || strings.Contains(stderr, token) {
				t.Error("the token is on stdout or stderr")
			}
		})
	}
}
