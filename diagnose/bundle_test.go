package diagnose

import (
	"bytes"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
)

func TestBundle(t *testing.T) {
	const secret = "eyJhbGciOiJFZERTQSJ9.secret-token.sig"
	health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/status":
			_, _ = w.Write([]byte(`{"tunnel":"acme","ready":true}`))
		case "/metrics":
			_, _ = w.Write([]byte("tether_client_connected 1\n"))
		case "/debug/logs":
			// A log line that, against the rules, holds the token.
			_, _ = w.Write([]byte(`{"msg":"login failed","token":"` + secret + `"}` + "\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer health.Close()
	report := Report{OK: false, Checks: []Check{{Name: "tcp", Status: Fail, Detail: "refused", Hint: "start the server"}}}

	var buf bytes.Buffer
	err := WriteBundle(t.Context(), &buf, report, BundleOptions{
		Version:    "tether test",
		Settings:   []Setting{{Key: "server", Value: "127.0.0.1:1", Source: "flag --server"}},
		HealthAddr: strings.TrimPrefix(health.URL, "http://"),
		Secrets:    []string{secret},
	})
	if err != nil {
		t.Fatal(err)
	}
	files := testutil.UntarGz(t, bytes.NewReader(buf.Bytes()))
	for name, want := range map[string]string{
		"report.json": `"hint": "start the server"`,
		"report.txt":  "FAIL tcp",
		"version.txt": "tether test",
		"config.txt":  "server = 127.0.0.1:1 (flag --server)",
		"status.json": `"tunnel":"acme"`,
		"metrics.txt": "tether_client_connected 1",
		"logs.txt":    `"token":"[redacted]"`,
	} {
		if !strings.Contains(files[name], want) {
			t.Errorf("%s = %q, want it to hold %q", name, files[name], want)
		}
	}
	if strings.Contains(buf.String(), "secret-token") {
		t.Error("the compressed bundle still holds the token")
	}
	for name, data := range files {
		if strings.Contains(data, secret) {
			t.Errorf("%s holds the token", name)
		}
	}

	// Without a reachable client, the bundle says what is missing and why.
	buf.Reset()
	if err := WriteBundle(t.Context(), &buf, report, BundleOptions{HealthAddr: testutil.ClosedAddr(t)}); err != nil {
		t.Fatal(err)
	}
	files = testutil.UntarGz(t, bytes.NewReader(buf.Bytes()))
	if _, ok := files["status.json"]; ok || !strings.Contains(files["missing.txt"], "status.json") {
		t.Errorf("bundle without a client: files %v, missing.txt %q", slices.Collect(maps.Keys(files)), files["missing.txt"])
	}
}
