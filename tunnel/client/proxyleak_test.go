package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tether-dev/tether/internal/testutil"
)

// password is the egress proxy's password in these tests; it must never be
// shown.
const password = "s3cret-Pw"

// tokenFile writes a token for tunnel acme. The client reads its sub
// without verifying it, so any key signs it.
func tokenFile(t *testing.T) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "acme"}).SignedString([]byte("test key"))
	if err != nil {
		t.Fatal(err)
	}
	return writeTestFile(t, "token", tok)
}

func writeTestFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// authProxy is an HTTP proxy that answers every CONNECT with 407.
func authProxy(t *testing.T) string {
	t.Helper()
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Proxy-Authenticate", `Basic realm="corp"`)
		w.WriteHeader(http.StatusProxyAuthRequired)
	}))
	t.Cleanup(p.Close)
	return p.Listener.Addr().String()
}

// A proxy value with a password, well formed or not, never shows the
// password: not in the error of a bad --proxy, not in /status, not in
// /debug/logs, not in the client's own log.
func TestProxyPasswordNeverShown(t *testing.T) {
	closed := testutil.ClosedAddr(t)
	tests := []struct {
		name    string
		flag    string
		env     map[string]string
		invalid bool   // New refuses the configuration
		shown   string // what the error, status or logs say instead
	}{
		{name: "--proxy without a host", flag: "http://alice:" + password + "@", invalid: true, shown: `--proxy "http://[redacted]@"`},
		{name: "--proxy without a scheme", flag: "alice:" + password + " @proxy.corp:3128", invalid: true, shown: `--proxy "[redacted]@proxy.corp:3128"`},
		{name: "--proxy with the host forgotten", flag: "http://alice:" + password, invalid: true, shown: `--proxy "http://alice:[redacted]"`},
		{
			name:  "HTTPS_PROXY that does not parse",
			env:   map[string]string{"HTTPS_PROXY": "http://alice:" + password + " x@proxy.corp:3128"},
			shown: "HTTPS_PROXY=http://[redacted]@proxy.corp:3128",
		},
		{
			name:  "ALL_PROXY with an unsupported scheme",
			env:   map[string]string{"ALL_PROXY": "ftp://alice:" + password + "@proxy.corp:21"},
			shown: "ALL_PROXY=ftp://[redacted]@proxy.corp:21: proxy scheme",
		},
		{
			name:  "HTTPS_PROXY that does not answer",
			env:   map[string]string{"HTTPS_PROXY": "http://alice:" + password + "@" + closed},
			shown: "dial egress proxy http://[redacted]@" + closed,
		},
		{
			name:  "--proxy that does not answer, percent-encoded",
			flag:  "http://alice:" + strings.ReplaceAll(password, "-", "%2D") + "@" + closed,
			shown: "dial egress proxy http://[redacted]@" + closed,
		},
		{
			name:  "--proxy that refuses the login",
			flag:  "http://alice:" + password + "@" + authProxy(t),
			shown: "egress proxy http://[redacted]@127.0.0.1:",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core, observed := observer.New(zapcore.DebugLevel)
			cfg := Config{
				Server: "tunnels.example.invalid:443", TokenFile: tokenFile(t), Proxy: tc.flag,
				Getenv: func(k string) string { return tc.env[k] }, MaxReconnectDelay: time.Second,
			}
			c, err := New(cfg, zap.New(core))
			if tc.invalid {
				if err == nil || !strings.Contains(err.Error(), tc.shown) || strings.Contains(err.Error(), password) {
					t.Errorf("New: %v; want an error saying %q without the password", err, tc.shown)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			status, logs := runUntilFailed(t, c, "connect to tunnel server failed")
			if !strings.Contains(status, tc.shown) {
				t.Errorf("/status does not say %q:\n%s", tc.shown, status)
			}
			for what, text := range map[string]string{"/status": status, "/debug/logs": logs, "the log": fmt.Sprint(observed.All())} {
				if strings.Contains(text, password) {
					t.Errorf("%s shows the proxy password:\n%s", what, text)
				}
			}
		})
	}
}

// runUntilFailed runs c until its /status reports a failed connection and
// its /debug/logs has logged, and returns its /status and /debug/logs.
func runUntilFailed(t *testing.T, c *Client, logged string) (status, logs string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	serve(t, c, ln)
	// The failure is recorded in the status, then logged.
	testutil.WaitFor(t, 10*time.Second, func() error {
		body, err := get(base + "/status")
		if err != nil {
			return err
		}
		var snap Snapshot
		if err := json.Unmarshal(body, &snap); err != nil {
			return err
		}
		if snap.LastError == "" {
			return fmt.Errorf("no connection failure yet: %s", body)
		}
		status = string(body)
		if body, err = get(base + "/debug/logs"); err != nil {
			return err
		}
		if !bytes.Contains(body, []byte(logged)) {
			return fmt.Errorf("/debug/logs lacks the failure:\n%s", body)
		}
		logs = string(body)
		return nil
	})
	return status, logs
}

func get(url string) ([]byte, error) {
	resp, err := http.Get(url) //nolint:noctx // a loopback test request
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
