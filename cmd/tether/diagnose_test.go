package main

import (
	"encoding/json"
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
	code, stdout, _ := runTether(t, map[string]string{"TETHER_TRANSPORT": "quic"}, runners{},
		"diagnose", "--config", cfg, "--token-file", writeFile(t, "token", "x"), "--timeout", "1s", "--route", "/=http://127.0.0.1:1")
	if code != exitFail {
		t.Errorf("exit %d, want %d", code, exitFail)
	}
	for _, want := range []string{
		"FAIL config",
		"transprot",                           // the misspelt key
		"transport from env TETHER_TRANSPORT", // where the bad value came from
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
