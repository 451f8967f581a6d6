package status

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/server/registry"
)

// revocationAPI answers every request with code and body, and records the
// method, path, Authorization and body of the last one.
type revocationAPI struct {
	url                     string
	method, path, auth, got string
}

func newRevocationAPI(t *testing.T, code int, contentType, body string) *revocationAPI {
	t.Helper()
	a := &revocationAPI{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		a.method, a.path, a.auth, a.got = r.Method, r.URL.EscapedPath(), r.Header.Get("Authorization"), string(b)
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

const secretAdminToken = "s3cret-admin-token"

func revocationAdmin(t *testing.T, url string) *Admin {
	t.Helper()
	a, err := NewAdmin(url, writeTokenFile(t, secretAdminToken))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The admin client speaks the revocation and disconnect API as documented:
// method, path, bearer token, JSON body, the status of success; and turns
// each refusal into a sentence that says what to do, with what the server
// wrote escaped and the token never in it.
func TestRevocationAPI(t *testing.T) {
	stored := registry.Revocation{ID: "0195a1b2c3d4e5f6", Tunnel: "acme", Reason: "offboarded", CreatedAt: now}
	body, _ := json.Marshal(stored)
	ctx := context.Background()

	t.Run("revoke", func(t *testing.T) {
		api := newRevocationAPI(t, http.StatusCreated, "application/json", string(body))
		rev, err := revocationAdmin(t, api.url).Revoke(ctx, RevokeRequest{Tunnel: "acme", Until: now.Add(time.Hour), Reason: "offboarded"})
		if err != nil || rev != stored {
			t.Fatalf("Revoke: %+v, %v; want %+v", rev, err, stored)
		}
		if api.method != http.MethodPost || api.path != "/api/revocations" || api.auth != "Bearer "+secretAdminToken ||
			api.got != `{"tunnel":"acme","until":"2025-03-01T13:00:00Z","reason":"offboarded"}` {
			t.Errorf("sent %s %s (%q) %s", api.method, api.path, api.auth, api.got)
		}
	})
	t.Run("unrevoke escapes the ID in the path", func(t *testing.T) {
		api := newRevocationAPI(t, http.StatusOK, "application/json", string(body))
		if _, err := revocationAdmin(t, api.url).Unrevoke(ctx, "a/b?c"); err != nil {
			t.Fatal(err)
		}
		if api.method != http.MethodDelete || api.path != "/api/revocations/a%2Fb%3Fc" {
			t.Errorf("sent %s %s", api.method, api.path)
		}
	})
	t.Run("disconnect", func(t *testing.T) {
		api := newRevocationAPI(t, http.StatusOK, "application/json", `{"tunnel":"acme","sessions_closed":3,"replicas":["a","b"]}`)
		d, err := revocationAdmin(t, api.url).Disconnect(ctx, "acme")
		if err != nil || d.SessionsClosed != 3 || strings.Join(d.Replicas, ",") != "a,b" {
			t.Fatalf("Disconnect: %+v, %v", d, err)
		}
		if api.method != http.MethodPost || api.path != "/api/tunnels/acme/disconnect" {
			t.Errorf("sent %s %s", api.method, api.path)
		}
	})

	for _, tc := range []struct {
		name        string
		code        int
		contentType string
		body        string
		call        func(*Admin) error
		want        string
	}{
		{"a field refused, escaped", http.StatusBadRequest, "text/plain", "--until is not in the future\x1b[2J\nsecond line", func(a *Admin) error {
			_, err := a.Revoke(ctx, RevokeRequest{Tunnel: "acme"})
			return err
		}, `the server refused the revocation: --until is not in the future\x1b[2J`},
		{"no such revocation", http.StatusNotFound, "text/plain", "no revocation", func(a *Admin) error {
			_, err := a.Unrevoke(ctx, "0195")
			return err
		}, `no revocation "0195" at `},
		{"a server without the API", http.StatusNotFound, "text/plain", "404 page not found", func(a *Admin) error {
			_, err := a.Revocations(ctx)
			return err
		}, "has no revocation API (GET "},
		{"a server without disconnect", http.StatusMethodNotAllowed, "text/plain", "", func(a *Admin) error {
			_, err := a.Disconnect(ctx, "acme")
			return err
		}, "has no disconnect API"},
		{"something else answers", http.StatusBadGateway, "text/html", "<html>", func(a *Admin) error {
			_, err := a.Revoke(ctx, RevokeRequest{Tunnel: "acme"})
			return err
		}, "does not look like a tether server admin address (POST "},
		{"an answer that is not a revocation", http.StatusCreated, "application/json", `{}`, func(a *Admin) error {
			_, err := a.Revoke(ctx, RevokeRequest{Tunnel: "acme"})
			return err
		}, "JSON without the revocation's id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newRevocationAPI(t, tc.code, tc.contentType, tc.body)
			err := tc.call(revocationAdmin(t, api.url))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q in it", err, tc.want)
			}
			if strings.Contains(err.Error(), secretAdminToken) || strings.Contains(err.Error(), "\x1b") || strings.Contains(err.Error(), "second line") {
				t.Errorf("error %q shows the token, a raw escape or more than the first line", err)
			}
		})
	}
}

// The revocations table: a row per revocation, the oldest first, with what
// came from the network escaped; and what a revoke or disconnect printed.
func TestRevocationsPrinted(t *testing.T) {
	list := []registry.Revocation{
		{ID: "0195a1b2c3d4e5f6", Tunnel: "acme-prod", Reason: "offboarded", CreatedAt: now.Add(-time.Hour)},
		{ID: "0195a1b2c3d4e5f7", JTI: "3f2a9c1e", Until: now.Add(24 * time.Hour), Reason: "leaked\x1b[31m", CreatedAt: now},
	}
	var out bytes.Buffer
	p := Printer{Out: &out, Now: clock}
	if err := p.Revocations(list); err != nil {
		t.Fatal(err)
	}
	want := `ID                 TUNNEL/JTI         UNTIL                  REASON           CREATED
0195a1b2c3d4e5f6   tunnel acme-prod   never                  offboarded       2025-03-01T11:00:00Z
0195a1b2c3d4e5f7   jti 3f2a9c1e       2025-03-02T12:00:00Z   leaked\x1b[31m   2025-03-01T12:00:00Z
`
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}

	for _, tc := range []struct {
		name  string
		print func(Printer) error
		want  string
	}{
		{"none", func(p Printer) error { return p.Revocations(nil) }, "No revocations.\n"},
		{"none, JSON", func(p Printer) error { p.Format = JSON; return p.Revocations(nil) }, "[]\n"},
		{"revoked", func(p Printer) error { return p.Revoked(list[1]) },
			"revocation 0195a1b2c3d4e5f7: token 3f2a9c1e and every renewal of it, until 2025-03-02T12:00:00Z (in 24h), reason \"leaked\\x1b[31m\"\n" +
				"the sessions it covers close on every replica, and their logins are refused; `tether token unrevoke 0195a1b2c3d4e5f7` takes it back\n"},
		{"unrevoked", func(p Printer) error { return p.Unrevoked(list[0]) },
			"deleted revocation 0195a1b2c3d4e5f6 (every token of tunnel acme-prod, for good, reason \"offboarded\"): its logins are accepted again\n"},
		{"one session closed", func(p Printer) error {
			return p.Disconnected(Disconnected{Tunnel: "acme", SessionsClosed: 1, Replicas: []string{"tether-0"}})
		}, "closed 1 session of tunnel acme, on tether-0; its clients may log in again (tether token revoke --tunnel acme keeps them out)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := tc.print(Printer{Out: &out, Now: clock}); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("printed %q, want %q", out.String(), tc.want)
			}
		})
	}
}
