package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server"
	"github.com/tether-dev/tether/tunnel/server/webhook"
)

// now is the clock of the printing tests.
var now = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return now }

// tunnels is what the test admin API lists, a session per entry,
// deliberately not in name order, and acme-prod's newer session before its
// older one.
var tunnels = []server.Info{
	{
		Name: "globex", Account: "globex-inc", Runtime: "staging", ClientAddress: "198.51.100.4:40112",
		ConnectedSince: now.Add(-(3*time.Hour + 12*time.Minute + 5*time.Second)), ClientVersion: "tether 1.2.0",
		BytesIn: 1536, BytesOut: 5 << 20, Transport: "wss", Route: "globex.3c1f0a9e-0",
		TokenExpires: now.Add(-5 * time.Minute), Requests: 17,
		Session: "9b2e4d1c0f3a5b6c7d8e9f0a1b2c3d4e", Replica: "tether-server-1", RunID: "globex.3c1f0a9e-0",
	},
	{
		Name: "acme-prod", Account: "acme", Runtime: "prod", ClientAddress: "203.0.113.7:51299",
		ConnectedSince: now.Add(-2 * time.Minute), ClientVersion: "tether 1.3.0",
		BytesIn: 2048, BytesOut: 1024, Transport: "tls", Route: "acme-prod.77c0e1d2-1",
		TokenExpires: now.Add(29 * 24 * time.Hour), Requests: 12,
		Session: "e0d1c2b3a4958677685a4b3c2d1e0f99", Replica: "tether-server-1", RunID: "acme-prod.77c0e1d2-1", Retired: true,
	},
	{
		Name: "acme-prod", Account: "acme", Runtime: "prod", ClientAddress: "203.0.113.7:51234",
		ConnectedSince: now.Add(-50 * time.Hour), ClientVersion: "tether 1.3.0",
		BytesIn: 3<<30 + 200<<20, BytesOut: 512, Transport: "tls", Route: "acme-prod.77c0e1d2-0",
		TokenExpires: now.Add(29 * 24 * time.Hour), Requests: 120345,
		Session: "5f0c6a7b8c9d0e1f2a3b4c5d6e7f8091", Replica: "tether-server-1", RunID: "acme-prod.77c0e1d2-0",
	},
	{
		Name: "acme-dev", ClientAddress: "203.0.113.8:40000",
		ConnectedSince: now.Add(-45 * time.Second), ClientVersion: "frp 0.71.0",
		Transport: "tls", Session: "0a1b2c3d4e5f60718293a4b5c6d7e8f9", Replica: "tether-server-1", RunID: "acme-dev.0123456789abcdef",
	},
}

// adminAPI serves list at /api/tunnels like a tether server, demanding
// token as a bearer token when it is not "". got receives the Authorization
// header of each request.
func adminAPI(t *testing.T, token string, list []server.Info, got chan<- string) string {
	t.Helper()
	body, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/tunnels", func(w http.ResponseWriter, r *http.Request) {
		if got != nil {
			got <- r.Header.Get("Authorization")
		}
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "missing or wrong admin token", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func writeTokenFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// adminAndFilter is what `tether status --admin URL [NAME...]` reads the
// server with, and filters what it prints by.
func adminAndFilter(t *testing.T, url, tokenFile string, names []string) (*Admin, Filter) {
	t.Helper()
	admin, err := NewAdmin(url, tokenFile)
	if err != nil {
		t.Fatalf("NewAdmin: %v", err)
	}
	filter, err := NewFilter(names)
	if err != nil {
		t.Fatalf("NewFilter: %v", err)
	}
	return admin, filter
}

// showTunnels runs what `tether status --admin` does and returns stdout.
func showTunnels(t *testing.T, url, tokenFile string, format Format, names ...string) (string, error) {
	t.Helper()
	admin, filter := adminAndFilter(t, url, tokenFile, names)
	list, err := admin.Tunnels(context.Background())
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	err = Printer{Out: &out, Format: format, Now: clock}.FilteredTunnels(list, filter)
	return out.String(), err
}

func TestTunnelsTable(t *testing.T) {
	url := adminAPI(t, "", tunnels, nil)
	out, err := showTunnels(t, url, "", Table)
	if err != nil {
		t.Fatal(err)
	}
	// A row per session, a tunnel's oldest first.
	want := `NAME        ACCOUNT      RUNTIME   CLIENT               CONNECTED   VERSION        IN       OUT
acme-dev    <none>       <none>    203.0.113.8:40000    45s         frp 0.71.0     0B       0B
acme-prod   acme         prod      203.0.113.7:51234    2d2h        tether 1.3.0   3.2GiB   512B
acme-prod   acme         prod      203.0.113.7:51299    2m          tether 1.3.0   2.0KiB   1.0KiB
globex      globex-inc   staging   198.51.100.4:40112   3h12m       tether 1.2.0   1.5KiB   5.0MiB
`
	if out != want {
		t.Errorf("table:\n%s\nwant:\n%s", out, want)
	}
}

// Tunnels with buffered webhooks follow the sessions in a table of their
// own, one with no session here included; in JSON they are as the server
// sent them.
func TestTunnelsBuffered(t *testing.T) {
	list := append(slices.Clone(tunnels),
		server.Info{Name: "acme-prod", Buffer: &webhook.Summary{Queued: 3, Bytes: 3 << 10, Oldest: now.Add(-5 * time.Minute)}},
		server.Info{Name: "initech", Buffer: &webhook.Summary{Queued: 1, Rejected: 2, Bytes: 700, Oldest: now.Add(-2 * time.Hour)}})
	list[0].Buffer = &webhook.Summary{Rejected: 1, Bytes: 10, Oldest: now.Add(-time.Minute)}
	out, err := showTunnels(t, adminAPI(t, "", list, nil), "", Table)
	if err != nil {
		t.Fatal(err)
	}
	want := `NAME        ACCOUNT      RUNTIME   CLIENT               CONNECTED   VERSION        IN       OUT
acme-dev    <none>       <none>    203.0.113.8:40000    45s         frp 0.71.0     0B       0B
acme-prod   acme         prod      203.0.113.7:51234    2d2h        tether 1.3.0   3.2GiB   512B
acme-prod   acme         prod      203.0.113.7:51299    2m          tether 1.3.0   2.0KiB   1.0KiB
globex      globex-inc   staging   198.51.100.4:40112   3h12m       tether 1.2.0   1.5KiB   5.0MiB

BUFFERED    QUEUED   REJECTED   BYTES    OLDEST
acme-prod   3        0          3.0KiB   5m
globex      0        1          10B      60s
initech     1        2          700B     120m
`
	if out != want {
		t.Errorf("table:\n%s\nwant:\n%s", out, want)
	}
	out, err = showTunnels(t, adminAPI(t, "", list[len(list)-1:], nil), "", Table)
	if want := "No tunnels connected.\n\nBUFFERED   QUEUED   REJECTED   BYTES   OLDEST\ninitech    1        2          700B    120m\n"; err != nil || out != want {
		t.Errorf("only a buffer: %v\n%s\nwant:\n%s", err, out, want)
	}
}

func TestTunnelsWide(t *testing.T) {
	url := adminAPI(t, "", tunnels, nil)
	out, err := showTunnels(t, url, "", Wide)
	if err != nil {
		t.Fatal(err)
	}
	// The session IDs are cut to 8 characters.
	want := `NAME        ACCOUNT      RUNTIME   CLIENT               CONNECTED   VERSION        IN       OUT      TRANSPORT   ROUTE                  TOKEN-EXPIRES    REQUESTS   SESSION    REPLICA
acme-dev    <none>       <none>    203.0.113.8:40000    45s         frp 0.71.0     0B       0B       tls         <none>                 <none>           0          0a1b2c3d   tether-server-1
acme-prod   acme         prod      203.0.113.7:51234    2d2h        tether 1.3.0   3.2GiB   512B     tls         acme-prod.77c0e1d2-0   29d              120345     5f0c6a7b   tether-server-1
acme-prod   acme         prod      203.0.113.7:51299    2m          tether 1.3.0   2.0KiB   1.0KiB   tls         acme-prod.77c0e1d2-1   29d              12         e0d1c2b3   tether-server-1
globex      globex-inc   staging   198.51.100.4:40112   3h12m       tether 1.2.0   1.5KiB   5.0MiB   wss         globex.3c1f0a9e-0      expired 5m ago   17         9b2e4d1c   tether-server-1
`
	if out != want {
		t.Errorf("wide:\n%s\nwant:\n%s", out, want)
	}
}

func TestTunnelsJSON(t *testing.T) {
	url := adminAPI(t, "", tunnels, nil)
	out, err := showTunnels(t, url, "", JSON, "acme-*")
	if err != nil {
		t.Fatal(err)
	}
	var got []server.Info
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("stdout is not a JSON list of tunnels: %v\n%s", err, out)
	}
	if dec.More() {
		t.Errorf("stdout has more than the JSON list:\n%s", out)
	}
	want := []server.Info{tunnels[3], tunnels[2], tunnels[1]} // acme-dev, acme-prod's older session, its newer one
	if !reflect.DeepEqual(got, want) {
		t.Errorf("JSON list %+v, want %+v", got, want)
	}
}

// hostileVersion is a client version as a hostile client could send it at
// login: it would clear the screen, forge a table line and overwrite it.
const hostileVersion = "1.0\x1b[2J\x1b[31m\nevil-tunnel   owned   0.0.0.0:1\rX\u009b1m\u202e"

// unsafeForTerminal reports the first character of out that a terminal
// would act on, other than the newlines that end lines.
func unsafeForTerminal(out string) (rune, bool) {
	for _, r := range out {
		if r != '\n' && !unicode.IsPrint(r) {
			return r, true
		}
	}
	return 0, false
}

// A value a client sent (its version, at login) reaches the terminal
// escaped: it cannot clear the screen, color it, forge a line or rewrite
// one, in any output format.
func TestTunnelsEscapeClientValues(t *testing.T) {
	hostile := []server.Info{{
		Name: "acme", Account: "acme\x1b]0;title\a", Runtime: "prod\tx", ClientAddress: "203.0.113.7:1",
		ConnectedSince: now.Add(-time.Minute), ClientVersion: hostileVersion, Transport: "tls\r", Route: "acme\n",
		Session: "\x1b[2J\n\u202eab", Replica: "r-1\x1b]0;x\a\n1   evil",
	}}
	url := adminAPI(t, "", hostile, nil)
	for _, format := range []Format{Table, Wide} {
		out, err := showTunnels(t, url, "", format)
		if err != nil {
			t.Fatal(err)
		}
		if r, ok := unsafeForTerminal(out); ok {
			t.Errorf("%q output holds %q:\n%q", format, r, out)
		}
		if n := strings.Count(out, "\n"); n != 2 {
			t.Errorf("%q output has %d lines, want the header and one tunnel:\n%s", format, n, out)
		}
		if want := `1.0\x1b[2J\x1b[31m\nevil-tunnel   owned   0.0.0.0:1\rX\u009b1m\u202e`; !strings.Contains(out, want) {
			t.Errorf("%q output does not show the version escaped as %s:\n%s", format, want, out)
		}
		if want := `\x1b[2J\n\u202eab   r-1\x1b]0;x\a\n1   evil`; format == Wide && !strings.HasSuffix(out, want+"\n") {
			t.Errorf("wide output does not end with the session and replica escaped as %s:\n%s", want, out)
		}
	}
	out, err := showTunnels(t, url, "", JSON)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := unsafeForTerminal(out); ok {
		t.Errorf("JSON output holds %q:\n%q", r, out)
	}
	var got []server.Info
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 || got[0].ClientVersion != hostileVersion {
		t.Errorf("JSON output decodes to %+v, %v; want the version as the server sent it", got, err)
	}
}

func TestFilter(t *testing.T) {
	url := adminAPI(t, "", tunnels, nil)
	tests := []struct {
		names   []string
		want    []string // names in the table
		missing string   // in the error, "" for none
	}{
		{nil, []string{"acme-dev", "acme-prod", "acme-prod", "globex"}, ""},
		{[]string{"globex"}, []string{"globex"}, ""},
		{[]string{"acme-*"}, []string{"acme-dev", "acme-prod", "acme-prod"}, ""},
		{[]string{"*-prod", "glob?x"}, []string{"acme-prod", "acme-prod", "globex"}, ""},
		{[]string{"acme-[dp]*"}, []string{"acme-dev", "acme-prod", "acme-prod"}, ""},
		{[]string{"acme"}, nil, `"acme"`},
		{[]string{"globex", "initech-*"}, []string{"globex"}, `"initech-*"`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			out, err := showTunnels(t, url, "", Table, tc.names...)
			var got []string
			for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
				if i > 0 {
					got = append(got, strings.Fields(line)[0])
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("rows %q, want %q\n%s", got, tc.want, out)
			}
			var noMatch *NoMatchError
			switch {
			case tc.missing == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.missing != "" && !errors.As(err, &noMatch):
				t.Errorf("error %v, want a NoMatchError", err)
			case tc.missing != "" && !contains(err.Error(), "no connected tunnel matches "+tc.missing, "(3 connected)"):
				t.Errorf("error %q, want it to name %s and how many tunnels (not sessions) are connected", err, tc.missing)
			}
		})
	}
}

func TestFilterBadPattern(t *testing.T) {
	if _, err := NewFilter([]string{"acme-[prod"}); err == nil || !contains(err.Error(), `"acme-[prod"`) {
		t.Errorf("NewFilter error %v; want one naming the pattern", err)
	}
}

func TestNoMatchPrintsNothingButJSON(t *testing.T) {
	url := adminAPI(t, "", tunnels, nil)
	if out, err := showTunnels(t, url, "", Table, "initech"); err == nil || out != "" {
		t.Errorf("table: stdout %q, error %v; want nothing and an error", out, err)
	}
	out, err := showTunnels(t, url, "", JSON, "initech")
	if err == nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("json: stdout %q, error %v; want [] and an error", out, err)
	}
}

func TestEmptyList(t *testing.T) {
	url := adminAPI(t, "", []server.Info{}, nil)
	if out, err := showTunnels(t, url, "", Table); err != nil || out != "No tunnels connected.\n" {
		t.Errorf("table: stdout %q, error %v; want the empty-list message", out, err)
	}
	if out, err := showTunnels(t, url, "", JSON); err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("json: stdout %q, error %v; want []", out, err)
	}
}

func TestAdminToken(t *testing.T) {
	const token = "s3cret-admin-token-0123456789"
	auth := make(chan string, 1)
	url := adminAPI(t, token, tunnels, auth)
	out, err := showTunnels(t, url, writeTokenFile(t, token+"\n"), Table, "globex")
	if err != nil {
		t.Fatal(err)
	}
	if got := <-auth; got != "Bearer "+token {
		t.Errorf("Authorization %q, want the file's token as a bearer token", got)
	}
	if !strings.Contains(out, "globex-inc") || strings.Contains(out, token) {
		t.Errorf("output:\n%s\nwant the tunnel and never the token", out)
	}

	wrong := writeTokenFile(t, "not-"+token)
	_, err = showTunnels(t, url, wrong, Table)
	<-auth
	if err == nil || !contains(err.Error(), "refused the token", "--admin-token-file", wrong) || strings.Contains(err.Error(), token) {
		t.Errorf("wrong token: error %v; want one naming --admin-token-file and the file, without the token", err)
	}
}

func TestTokenFileErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-token")
	empty := writeTokenFile(t, " \n")
	for name, tc := range map[string]struct {
		file string
		want []string
	}{
		"missing": {missing, []string{"--admin-token-file", missing}},
		"empty":   {empty, []string{"--admin-token-file", empty, "empty"}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := NewAdmin("http://127.0.0.1:7700", tc.file); err == nil || !contains(err.Error(), tc.want...) {
				t.Errorf("error %v; want one containing %q", err, tc.want)
			}
		})
	}
}

func TestAdminURL(t *testing.T) {
	for _, raw := range []string{"127.0.0.1:7700", "http://127.0.0.1:7700", "https://admin.example.com/"} {
		if _, err := NewAdmin(raw, ""); err != nil {
			t.Errorf("NewAdmin(%q): %v", raw, err)
		}
	}
	for _, raw := range []string{"ftp://127.0.0.1:7700", "http://", "http://[::1"} {
		if _, err := NewAdmin(raw, ""); err == nil || !contains(err.Error(), "--admin", "http://127.0.0.1:7700") {
			t.Errorf("NewAdmin(%q) error %v; want one naming --admin with an example", raw, err)
		}
	}
}

// An admin address without /api/tunnels or its JSON is not a tether server.
func TestNotAnAdminAPI(t *testing.T) {
	const token = "s3cret-admin-token-0123456789"
	mux := http.NewServeMux()
	mux.HandleFunc("GET /html/api/tunnels", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("<html>hello</html>"))
	})
	mux.HandleFunc("GET /object/api/tunnels", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"tunnel": "acme"}`))
	})
	mux.HandleFunc("GET /locked/api/tunnels", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusUnauthorized)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	tests := []struct {
		name, path, tokenFile string
		want                  []string
	}{
		{"404", "/elsewhere", "", []string{srv.URL + "/elsewhere does not look like a tether server admin address", "404", "--admin", "--admin-addr"}},
		{"HTML", "/html", "", []string{srv.URL + "/html does not look like a tether server admin address", "--admin"}},
		{"JSON object", "/object", "", []string{"does not look like a tether server admin address"}},
		{"401", "/locked", "", []string{"needs a token: pass --admin-token-file (the server's --admin-token-file)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := showTunnels(t, srv.URL+tc.path, tc.tokenFile, Table)
			if err == nil || !contains(err.Error(), tc.want...) || strings.Contains(err.Error(), token) {
				t.Errorf("error %v; want one containing %q", err, tc.want)
			}
		})
	}
}

func TestAdminRefused(t *testing.T) {
	url := "http://" + testutil.ClosedAddr(t)
	_, err := showTunnels(t, url, "", Table)
	if want := "no tether server admin API at " + url + ": check --admin (the server's --admin-addr)"; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
}

func TestAdminTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // answers only when the request gives up
	}))
	t.Cleanup(srv.Close)
	admin, err := NewAdmin(srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	admin.Timeout = 50 * time.Millisecond
	_, err = admin.Tunnels(context.Background())
	if err == nil || !contains(err.Error(), "no answer", srv.URL, "50ms", "--timeout", "--admin") {
		t.Errorf("error %v; want one saying no answer came within the timeout", err)
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
