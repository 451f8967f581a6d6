package auth_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fatedier/frp/pkg/msg"
	plugin "github.com/fatedier/frp/pkg/plugin/server"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tether-dev/tether/auth"
)

// testClient bounds every test request, so that a broken handler fails the
// test instead of hanging it.
var testClient = &http.Client{Timeout: 10 * time.Second}

type routeCall struct{ session, proxy string }

type loginCall struct {
	claims *auth.Claims
	runID  string
}

// fakeTunnels records the plugin's calls and fails on demand.
type fakeTunnels struct {
	mu       sync.Mutex
	logins   map[string]loginCall
	routes   []routeCall
	removed  []routeCall
	loginErr error
	routeErr error
}

func newFakeTunnels() *fakeTunnels { return &fakeTunnels{logins: map[string]loginCall{}} }

func (f *fakeTunnels) Login(sessionID string, c *auth.Claims, runID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loginErr != nil {
		return f.loginErr
	}
	f.logins[sessionID] = loginCall{c, runID}
	return nil
}

func (f *fakeTunnels) AddRoute(sessionID, proxyName string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.routeErr != nil {
		return f.routeErr
	}
	f.routes = append(f.routes, routeCall{sessionID, proxyName})
	return nil
}

func (f *fakeTunnels) RemoveRoute(sessionID, proxyName string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, routeCall{sessionID, proxyName})
}

// fakeObserver records decisions.
type fakeObserver struct {
	mu       sync.Mutex
	accepted []string
	logins   []auth.Reason
	routes   []auth.Reason
}

func (o *fakeObserver) LoginAccepted(c *auth.Claims) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.accepted = append(o.accepted, c.Tunnel)
}

func (o *fakeObserver) LoginRejected(r auth.Reason) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.logins = append(o.logins, r)
}

func (o *fakeObserver) RouteRejected(r auth.Reason) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.routes = append(o.routes, r)
}

// pluginEnv is a Plugin served over HTTP with fakes around it.
type pluginEnv struct {
	key     *keyPair
	tunnels *fakeTunnels
	obs     *fakeObserver
	logs    *observer.ObservedLogs
	plugin  *auth.Plugin
	url     string
}

func newPluginEnv(t *testing.T) *pluginEnv {
	t.Helper()
	k := newKeyPair(t, auth.EdDSA, 0)
	v := verifier(t, auth.NewStaticKeySource(keySet(t, k.pubPEM)), nil)
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	e := &pluginEnv{key: k, tunnels: newFakeTunnels(), obs: &fakeObserver{}, logs: logs}
	e.plugin = auth.NewPlugin(v, e.tunnels, log, e.obs)
	mux := http.NewServeMux()
	mux.Handle("/frp", e.plugin)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	e.url = srv.URL + "/frp"
	return e
}

// token mints a valid token for tunnel.
func (e *pluginEnv) token(t *testing.T, tunnel string) string {
	t.Helper()
	return mint(t, e.key, with("sub", tunnel), nil)
}

// wireResponse is frp's plugin response with the content left raw.
type wireResponse struct {
	Reject       bool            `json:"reject"`
	RejectReason string          `json:"reject_reason"`
	Unchange     bool            `json:"unchange"`
	Content      json.RawMessage `json:"content"`
}

// call posts one plugin request as frps does and decodes the answer.
func (e *pluginEnv) call(t *testing.T, op string, content any) wireResponse {
	t.Helper()
	status, body := e.post(t, op, mustJSON(t, plugin.Request{Version: plugin.APIVersion, Op: op, Content: content}))
	if status != http.StatusOK {
		t.Fatalf("%s: HTTP %d: %s", op, status, body)
	}
	var res wireResponse
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatalf("%s: decode response %s: %v", op, body, err)
	}
	return res
}

func (e *pluginEnv) post(t *testing.T, op string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.url+"?version=0.1.0&op="+op, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// assertNoToken fails if any log entry mentions tok.
func (e *pluginEnv) assertNoToken(t *testing.T, tok string) {
	t.Helper()
	for _, entry := range e.logs.All() {
		line := fmt.Sprint(entry.Message, entry.ContextMap())
		if tok != "" && strings.Contains(line, tok) {
			t.Errorf("log entry %q contains the token", entry.Message)
		}
	}
}

func loginContent(metas map[string]string) plugin.LoginContent {
	return plugin.LoginContent{
		Login: msg.Login{
			Version: "0.71.0", Hostname: "runtime-pod", Os: "linux", Arch: "amd64",
			User: "someone-else", ClientID: "client-1", PrivilegeKey: "pk", Timestamp: 1,
			Metas: metas, PoolCount: 1,
		},
		ClientAddress: "203.0.113.7:40000",
	}
}

func TestPluginLoginAccepted(t *testing.T) {
	for _, tc := range []struct{ runID, want string }{
		{"0f3a9c21-1", "acme.0f3a9c21-1"}, // a tether client's connection
		{"acme.5e1d", "acme.5e1d"},        // a stock frpc reconnecting with the ID it was given
		{"globex.5e1d", "acme.globex.5e1d"},
	} {
		t.Run("run ID "+tc.runID, func(t *testing.T) {
			e := newPluginEnv(t)
			tok := e.token(t, "acme")
			in := loginContent(map[string]string{auth.TokenMetaKey: tok, auth.SessionMetaKey: "s1", "region": "eu"})
			in.RunID = tc.runID
			res := e.call(t, plugin.OpLogin, in)
			if res.Reject || res.Unchange {
				t.Fatalf("response = %+v, want accepted with changed content", res)
			}
			var out plugin.LoginContent
			if err := json.Unmarshal(res.Content, &out); err != nil {
				t.Fatal(err)
			}
			if out.RunID != tc.want || out.User != "acme" || out.ClientID != "" {
				t.Errorf("run ID/user/client ID = %q/%q/%q, want %s/acme/empty", out.RunID, out.User, out.ClientID, tc.want)
			}
			if got := e.tunnels.logins["s1"].runID; got != tc.want {
				t.Errorf("Tunnels.Login got run ID %q, want %q", got, tc.want)
			}
			if want := map[string]string{auth.SessionMetaKey: "s1", "region": "eu"}; !maps.Equal(out.Metas, want) {
				t.Errorf("Metas = %v, want %v (token removed, the rest kept)", out.Metas, want)
			}
			if out.PrivilegeKey != "pk" || out.Hostname != "runtime-pod" || out.ClientAddress != in.ClientAddress || out.PoolCount != 1 {
				t.Errorf("content changed beyond identity: %+v", out)
			}
			if c := e.tunnels.logins["s1"].claims; c == nil || c.Tunnel != "acme" || c.Account != "acct-1" {
				t.Errorf("Tunnels.Login got %+v for session s1, want tunnel acme", c)
			}
			if !slices.Equal(e.obs.accepted, []string{"acme"}) {
				t.Errorf("observer accepted %v, want [acme]", e.obs.accepted)
			}
			accepts := e.logs.FilterMessage("tunnel login accepted").All()
			// Debug: the server's session layer logs the connected tunnel at info.
			if len(accepts) != 1 || accepts[0].Level != zapcore.DebugLevel {
				t.Fatalf("want one debug log of the accept, got %v", accepts)
			}
			fields := accepts[0].ContextMap()
			for _, key := range []string{"tunnel", "account", "runtime", "kid", "expires", "client_address"} {
				if _, ok := fields[key]; !ok {
					t.Errorf("accept log lacks field %q: %v", key, fields)
				}
			}
			e.assertNoToken(t, tok)
		})
	}
}

func TestPluginLoginRejected(t *testing.T) {
	tests := []struct {
		name     string
		metas    func(tok string) map[string]string
		runID    string
		tunnels  func(*fakeTunnels)
		token    func(e *pluginEnv, t *testing.T) string
		want     auth.Reason
		contains string
		hidden   string // must not reach the client
	}{
		{name: "no metadata", metas: func(string) map[string]string { return nil }, want: auth.ReasonMissingToken, contains: "metadatas.token"},
		{name: "empty token", metas: func(string) map[string]string {
			return map[string]string{auth.TokenMetaKey: "", auth.SessionMetaKey: "s1"}
		}, want: auth.ReasonMissingToken},
		{name: "garbage token", token: func(*pluginEnv, *testing.T) string { return "garbage-token-value" }, want: auth.ReasonMalformed},
		{name: "expired token", token: func(e *pluginEnv, t *testing.T) string {
			return mint(t, e.key, with("exp", now.Add(-time.Hour).Unix()), nil)
		}, want: auth.ReasonExpired, contains: "token expired at 2026-11-23T02:00:00Z"},
		{name: "foreign key", token: func(e *pluginEnv, t *testing.T) string {
			return mint(t, newKeyPair(t, auth.EdDSA, 0), claims(), nil)
		}, want: auth.ReasonUnknownKey},
		{name: "no session", metas: func(tok string) map[string]string { return map[string]string{auth.TokenMetaKey: tok} },
			want: auth.ReasonSession, contains: "tether session layer"},
		{name: "registry refuses", tunnels: func(f *fakeTunnels) {
			f.loginErr = &auth.RejectError{Reason: auth.ReasonSession, Detail: "session s1 is closed; reconnect"}
		}, want: auth.ReasonSession, contains: "session s1 is closed"},
		{name: "registry fails", tunnels: func(f *fakeTunnels) {
			f.loginErr = errors.New("redis: dial tcp 10.1.2.3:6379: connection refused")
		}, want: auth.ReasonInternal, contains: "retry later", hidden: "10.1.2.3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newPluginEnv(t)
			if tc.tunnels != nil {
				tc.tunnels(e.tunnels)
			}
			tok := e.token(t, "acme")
			if tc.token != nil {
				tok = tc.token(e, t)
			}
			metas := map[string]string{auth.TokenMetaKey: tok, auth.SessionMetaKey: "s1"}
			if tc.metas != nil {
				metas = tc.metas(tok)
			}
			in := loginContent(metas)
			in.RunID = tc.runID
			res := e.call(t, plugin.OpLogin, in)
			if !res.Reject {
				t.Fatalf("response = %+v, want a rejection", res)
			}
			if want := string(tc.want) + ": "; !strings.HasPrefix(res.RejectReason, want) {
				t.Errorf("reject_reason = %q, want prefix %q", res.RejectReason, want)
			}
			if !strings.Contains(res.RejectReason, tc.contains) {
				t.Errorf("reject_reason = %q, want it to contain %q", res.RejectReason, tc.contains)
			}
			if tc.hidden != "" && strings.Contains(res.RejectReason, tc.hidden) {
				t.Errorf("reject_reason = %q leaks %q", res.RejectReason, tc.hidden)
			}
			if tok != "" && strings.Contains(res.RejectReason, tok) {
				t.Errorf("reject_reason contains the token")
			}
			if tc.tunnels == nil && len(e.tunnels.logins) != 0 {
				t.Errorf("Tunnels.Login called for a refused login: %v", e.tunnels.logins)
			}
			if !slices.Equal(e.obs.logins, []auth.Reason{tc.want}) || len(e.obs.accepted) != 0 {
				t.Errorf("observer rejected %v accepted %v, want [%s] and none", e.obs.logins, e.obs.accepted, tc.want)
			}
			warns := e.logs.FilterMessage("tunnel login rejected").FilterField(zap.String("reason", string(tc.want))).All()
			if len(warns) != 1 || warns[0].Level != zapcore.WarnLevel {
				t.Errorf("want one warn log with reason %q, got %v", tc.want, warns)
			}
			e.assertNoToken(t, tok)
		})
	}
}

// goodProxy is the one route a tunnel "acme" may register.
func goodProxy() plugin.NewProxyContent {
	return plugin.NewProxyContent{
		User: plugin.UserInfo{User: "acme", RunID: "acme.0f3a9c21-0", Metas: map[string]string{auth.SessionMetaKey: "s1"}},
		NewProxy: msg.NewProxy{
			ProxyName: "acme.web",
			ProxyType: "http",
			SubDomain: "acme",
		},
	}
}

func TestPluginNewProxy(t *testing.T) {
	tests := []struct {
		name     string
		mod      func(*plugin.NewProxyContent)
		tunnels  func(*fakeTunnels)
		want     auth.Reason // "" means allowed
		contains string
	}{
		{name: "http at its subdomain", mod: func(*plugin.NewProxyContent) {}},
		{name: "named like the tunnel", mod: func(c *plugin.NewProxyContent) { c.ProxyName = "acme" }},
		{name: "locations slash", mod: func(c *plugin.NewProxyContent) { c.Locations = []string{"/"} }},
		{name: "header rewrite", mod: func(c *plugin.NewProxyContent) {
			c.HostHeaderRewrite = "app-proxy.svc"
			c.Headers = map[string]string{"X-From": "tether"}
		}},

		{name: "tcp", mod: func(c *plugin.NewProxyContent) { c.ProxyType, c.RemotePort = "tcp", 6000 }, want: auth.ReasonProxy,
			contains: `proxy type "tcp" is not allowed: a tunnel serves exactly one http route with subdomain "acme"`},
		{name: "udp", mod: func(c *plugin.NewProxyContent) { c.ProxyType = "udp" }, want: auth.ReasonProxy, contains: `"udp"`},
		{name: "https", mod: func(c *plugin.NewProxyContent) { c.ProxyType = "https" }, want: auth.ReasonProxy, contains: `"https"`},
		{name: "tcpmux", mod: func(c *plugin.NewProxyContent) { c.ProxyType, c.Multiplexer = "tcpmux", "httpconnect" }, want: auth.ReasonProxy},
		{name: "stcp", mod: func(c *plugin.NewProxyContent) { c.ProxyType, c.Sk = "stcp", "secret" }, want: auth.ReasonProxy},
		{name: "xtcp", mod: func(c *plugin.NewProxyContent) { c.ProxyType = "xtcp" }, want: auth.ReasonProxy},
		{name: "sudp", mod: func(c *plugin.NewProxyContent) { c.ProxyType = "sudp" }, want: auth.ReasonProxy},
		{name: "empty type", mod: func(c *plugin.NewProxyContent) { c.ProxyType = "" }, want: auth.ReasonProxy},
		{name: "HTTP uppercase", mod: func(c *plugin.NewProxyContent) { c.ProxyType = "HTTP" }, want: auth.ReasonProxy},
		{name: "another tunnel's subdomain", mod: func(c *plugin.NewProxyContent) { c.SubDomain = "globex" }, want: auth.ReasonProxy,
			contains: `subdomain "globex" is not allowed: this token is for tunnel "acme"; set subdomain = "acme"`},
		{name: "no subdomain", mod: func(c *plugin.NewProxyContent) { c.SubDomain = "" }, want: auth.ReasonProxy, contains: `subdomain ""`},
		{name: "custom domain", mod: func(c *plugin.NewProxyContent) { c.CustomDomains = []string{"evil.example"} }, want: auth.ReasonProxy,
			contains: `custom_domains ["evil.example"] is not allowed`},
		{name: "custom domain instead of subdomain", mod: func(c *plugin.NewProxyContent) {
			c.SubDomain, c.CustomDomains = "", []string{"globex.tunnels.example"}
		}, want: auth.ReasonProxy, contains: "custom_domains"},
		{name: "group", mod: func(c *plugin.NewProxyContent) { c.Group = "g" }, want: auth.ReasonProxy, contains: "group"},
		{name: "group key", mod: func(c *plugin.NewProxyContent) { c.GroupKey = "k" }, want: auth.ReasonProxy, contains: "group"},
		{name: "locations", mod: func(c *plugin.NewProxyContent) { c.Locations = []string{"/api"} }, want: auth.ReasonProxy, contains: `locations ["/api"]`},
		{name: "two locations", mod: func(c *plugin.NewProxyContent) { c.Locations = []string{"/", "/x"} }, want: auth.ReasonProxy},
		{name: "http user", mod: func(c *plugin.NewProxyContent) { c.HTTPUser = "u" }, want: auth.ReasonProxy, contains: "http_user"},
		{name: "http password", mod: func(c *plugin.NewProxyContent) { c.HTTPPwd = "p" }, want: auth.ReasonProxy, contains: "http_pwd"},
		{name: "route by http user", mod: func(c *plugin.NewProxyContent) { c.RouteByHTTPUser = "u" }, want: auth.ReasonProxy},
		{name: "remote port on http", mod: func(c *plugin.NewProxyContent) { c.RemotePort = 80 }, want: auth.ReasonProxy, contains: "remote_port 80"},
		{name: "allow users", mod: func(c *plugin.NewProxyContent) { c.AllowUsers = []string{"*"} }, want: auth.ReasonProxy, contains: "allow_users"},
		{name: "multiplexer", mod: func(c *plugin.NewProxyContent) { c.Multiplexer = "httpconnect" }, want: auth.ReasonProxy, contains: "multiplexer"},
		{name: "encryption", mod: func(c *plugin.NewProxyContent) { c.UseEncryption = true }, want: auth.ReasonProxy,
			contains: "transport.useEncryption and transport.useCompression are not allowed: the tunnel is TLS already"},
		{name: "compression", mod: func(c *plugin.NewProxyContent) { c.UseCompression = true }, want: auth.ReasonProxy,
			contains: "remove them from the proxy"},
		{name: "foreign proxy name", mod: func(c *plugin.NewProxyContent) { c.ProxyName = "web" }, want: auth.ReasonProxy,
			contains: `proxy name "web" is not allowed: name the proxy "acme" or "acme.<name>"`},
		{name: "another tunnel's proxy name", mod: func(c *plugin.NewProxyContent) { c.ProxyName = "globex.web" }, want: auth.ReasonProxy},
		{name: "prefix without dot", mod: func(c *plugin.NewProxyContent) { c.ProxyName = "acmeweb" }, want: auth.ReasonProxy},
		{name: "bare prefix", mod: func(c *plugin.NewProxyContent) { c.ProxyName = "acme." }, want: auth.ReasonProxy},
		{name: "several problems at once", mod: func(c *plugin.NewProxyContent) {
			c.SubDomain, c.CustomDomains = "globex", []string{"x.example"}
		}, want: auth.ReasonProxy, contains: `subdomain "globex" is not allowed: this token is for tunnel "acme"; set subdomain = "acme"; custom_domains`},

		{name: "no session", mod: func(c *plugin.NewProxyContent) { delete(c.User.Metas, auth.SessionMetaKey) }, want: auth.ReasonSession},
		{name: "no run ID", mod: func(c *plugin.NewProxyContent) { c.User.RunID = "" }, want: auth.ReasonSession},
		{name: "no user", mod: func(c *plugin.NewProxyContent) { c.User.User = "" }, want: auth.ReasonSession},
		{name: "registry refuses", mod: func(*plugin.NewProxyContent) {}, tunnels: func(f *fakeTunnels) {
			f.routeErr = &auth.RejectError{Reason: auth.ReasonSession, Detail: "session s1 is not the current session of tunnel \"acme\""}
		}, want: auth.ReasonSession, contains: "not the current session"},
		{name: "registry fails", mod: func(*plugin.NewProxyContent) {}, tunnels: func(f *fakeTunnels) {
			f.routeErr = errors.New("redis timeout")
		}, want: auth.ReasonInternal, contains: "retry later"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newPluginEnv(t)
			if tc.tunnels != nil {
				tc.tunnels(e.tunnels)
			}
			in := goodProxy()
			tc.mod(&in)
			res := e.call(t, plugin.OpNewProxy, in)
			if tc.want == "" {
				if res.Reject || res.Unchange {
					t.Fatalf("response = %+v, want allowed, with the group set", res)
				}
				var out plugin.NewProxyContent
				if err := json.Unmarshal(res.Content, &out); err != nil {
					t.Fatal(err)
				}
				if out.Group != "acme" || len(out.GroupKey) < 32 {
					t.Errorf("group %q, key %q: want the tunnel's group with the plugin's key", out.Group, out.GroupKey)
				}
				out.Group, out.GroupKey = "", ""
				if gotJSON, wantJSON := mustJSON(t, out.NewProxy), mustJSON(t, in.NewProxy); !bytes.Equal(gotJSON, wantJSON) {
					t.Errorf("NewProxy changed beyond the group:\n got %s\nwant %s", gotJSON, wantJSON)
				}
				if want := []routeCall{{"s1", in.ProxyName}}; !slices.Equal(e.tunnels.routes, want) {
					t.Errorf("AddRoute calls = %v, want %v", e.tunnels.routes, want)
				}
				return
			}
			if !res.Reject {
				t.Fatalf("response = %+v, want a rejection", res)
			}
			if want := string(tc.want) + ": "; !strings.HasPrefix(res.RejectReason, want) {
				t.Errorf("reject_reason = %q, want prefix %q", res.RejectReason, want)
			}
			if !strings.Contains(res.RejectReason, tc.contains) {
				t.Errorf("reject_reason = %q, want it to contain %q", res.RejectReason, tc.contains)
			}
			if strings.Contains(res.RejectReason, "redis") {
				t.Errorf("reject_reason = %q leaks an internal error", res.RejectReason)
			}
			if len(e.tunnels.routes) != 0 {
				t.Errorf("AddRoute called for a refused proxy: %v", e.tunnels.routes)
			}
			if !slices.Equal(e.obs.routes, []auth.Reason{tc.want}) {
				t.Errorf("observer route rejections = %v, want [%s]", e.obs.routes, tc.want)
			}
		})
	}
}

// Every route of a tunnel lands in the tunnel's group, with one key that no
// client chose: two sessions of a tunnel share its subdomain, and no other
// tunnel can join them.
func TestPluginGroupsEveryRouteOfATunnel(t *testing.T) {
	e := newPluginEnv(t)
	groups := map[string]string{}
	for _, c := range []struct{ tunnel, proxy string }{{"acme", "acme.a-0"}, {"acme", "acme.b-1"}, {"globex", "globex.c-0"}} {
		in := goodProxy()
		in.User.User, in.ProxyName, in.SubDomain = c.tunnel, c.proxy, c.tunnel
		res := e.call(t, plugin.OpNewProxy, in)
		var out plugin.NewProxyContent
		if err := json.Unmarshal(res.Content, &out); err != nil || res.Reject {
			t.Fatalf("%s: response %+v (%v)", c.proxy, res, err)
		}
		if out.Group != c.tunnel {
			t.Errorf("%s: group %q, want %q", c.proxy, out.Group, c.tunnel)
		}
		groups[c.proxy] = out.GroupKey
	}
	if groups["acme.a-0"] != groups["acme.b-1"] {
		t.Error("two sessions of one tunnel got different group keys: frp would refuse the second")
	}
}

func TestPluginCloseProxy(t *testing.T) {
	e := newPluginEnv(t)
	in := plugin.CloseProxyContent{User: goodProxy().User, CloseProxy: msg.CloseProxy{ProxyName: "acme.web"}}
	res := e.call(t, plugin.OpCloseProxy, in)
	if res.Reject || !res.Unchange {
		t.Errorf("response = %+v, want unchanged", res)
	}
	if want := []routeCall{{"s1", "acme.web"}}; !slices.Equal(e.tunnels.removed, want) {
		t.Errorf("RemoveRoute calls = %v, want %v", e.tunnels.removed, want)
	}
}

func TestPluginHTTP(t *testing.T) {
	e := newPluginEnv(t)

	t.Run("unknown op", func(t *testing.T) {
		res := e.call(t, plugin.OpPing, plugin.PingContent{User: goodProxy().User})
		if res.Reject || !res.Unchange {
			t.Errorf("response = %+v, want reject false, unchange true", res)
		}
	})
	t.Run("op only in the query", func(t *testing.T) {
		status, body := e.post(t, plugin.OpCloseProxy, []byte(`{"version":"0.1.0","content":{"proxy_name":"acme.web","user":{"run_id":"acme","metas":{"tether_session":"s9"}}}}`))
		if status != http.StatusOK {
			t.Fatalf("HTTP %d: %s", status, body)
		}
		if !slices.Contains(e.tunnels.removed, routeCall{"s9", "acme.web"}) {
			t.Errorf("RemoveRoute not called: %v", e.tunnels.removed)
		}
	})
	for _, tc := range []struct {
		name string
		body string
		want int
	}{
		{"not JSON", "{", http.StatusBadRequest},
		{"no content", `{"version":"0.1.0","op":"Login"}`, http.StatusBadRequest},
		{"content of the wrong shape", `{"version":"0.1.0","op":"Login","content":[1]}`, http.StatusBadRequest},
		{"too large", `{"op":"Login","content":{"metas":{"x":"` + strings.Repeat("a", 70<<10) + `"}}}`, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.post(t, plugin.OpLogin, []byte(tc.body))
			if status != tc.want {
				t.Errorf("HTTP %d (%s), want %d", status, body, tc.want)
			}
		})
	}
	t.Run("GET", func(t *testing.T) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, e.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("HTTP %d, want 405", resp.StatusCode)
		}
	})
	if got, want := e.plugin.Ops(), []string{"Login", "NewProxy", "CloseProxy"}; !slices.Equal(got, want) {
		t.Errorf("Ops() = %v, want %v", got, want)
	}
}
