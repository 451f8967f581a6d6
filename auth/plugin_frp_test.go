package auth_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/fatedier/frp/pkg/config/v1"
	"github.com/fatedier/frp/pkg/msg"
	plugin "github.com/fatedier/frp/pkg/plugin/server"

	"github.com/tether-dev/tether/auth"
)

// TestPluginThroughFRP drives the handler with frp's own plugin client and
// manager, the code frps runs, so the wire format is proven against frp
// rather than against our reading of it.
func TestPluginThroughFRP(t *testing.T) {
	e := newPluginEnv(t)
	hp := plugin.NewHTTPPluginOptions(v1.HTTPPluginOptions{
		Name: "tether",
		Addr: strings.TrimPrefix(strings.TrimSuffix(e.url, "/frp"), "http://"),
		Path: "/frp",
		Ops:  e.plugin.Ops(),
	})
	if hp.IsSupport(plugin.OpPing) || !hp.IsSupport(plugin.OpNewProxy) {
		t.Fatalf("plugin ops = %v, want Login, NewProxy, CloseProxy only", e.plugin.Ops())
	}
	m := plugin.NewManager()
	m.Register(hp)

	t.Run("login accepted", func(t *testing.T) {
		tok := e.token(t, "acme")
		in := loginContent(map[string]string{auth.TokenMetaKey: tok, auth.SessionMetaKey: "s1"})
		in.RunID = "0f3a9c21-0"
		out, err := m.Login(&in)
		if err != nil {
			t.Fatalf("Login: %v", err)
		}
		if out.RunID != "acme.0f3a9c21-0" || out.User != "acme" || out.ClientID != "" {
			t.Errorf("run ID/user/client ID = %q/%q/%q, want acme.0f3a9c21-0/acme/empty", out.RunID, out.User, out.ClientID)
		}
		if want := map[string]string{auth.SessionMetaKey: "s1"}; !maps.Equal(out.Metas, want) {
			t.Errorf("Metas = %v, want %v", out.Metas, want)
		}
	})

	t.Run("login rejected", func(t *testing.T) {
		tok := mint(t, e.key, with("exp", now.Add(-time.Hour).Unix()), nil)
		in := loginContent(map[string]string{auth.TokenMetaKey: tok, auth.SessionMetaKey: "s2"})
		_, err := m.Login(&in)
		if err == nil || !strings.HasPrefix(err.Error(), "expired: token expired at 2026-11-23T02:00:00Z") {
			t.Fatalf("Login error = %v, want the expiry reason verbatim", err)
		}
	})

	t.Run("new proxy allowed", func(t *testing.T) {
		in := goodProxy()
		out, err := m.NewProxy(&in)
		if err != nil {
			t.Fatalf("NewProxy: %v", err)
		}
		// frp registers what the plugin answers: the route in its tunnel's group.
		if out.Group != "acme" || out.GroupKey == "" {
			t.Errorf("group/key = %q/%q, want acme and the plugin's key", out.Group, out.GroupKey)
		}
		if !slices.Contains(e.tunnels.routes, routeCall{"s1", "acme.web"}) {
			t.Errorf("AddRoute calls = %v, want s1/acme.web", e.tunnels.routes)
		}
	})

	t.Run("new proxy refused", func(t *testing.T) {
		in := goodProxy()
		in.NewProxy = msg.NewProxy{ProxyName: "acme.db", ProxyType: "tcp", RemotePort: 5432}
		_, err := m.NewProxy(&in)
		if err == nil || !strings.Contains(err.Error(), `proxy type "tcp" is not allowed`) {
			t.Fatalf("NewProxy error = %v, want the proxy type refusal", err)
		}
	})

	t.Run("close proxy", func(t *testing.T) {
		in := plugin.CloseProxyContent{User: goodProxy().User, CloseProxy: msg.CloseProxy{ProxyName: "acme.web"}}
		if err := m.CloseProxy(&in); err != nil {
			t.Fatalf("CloseProxy: %v", err)
		}
		if !slices.Contains(e.tunnels.removed, routeCall{"s1", "acme.web"}) {
			t.Errorf("RemoveRoute calls = %v, want s1/acme.web", e.tunnels.removed)
		}
	})
}
