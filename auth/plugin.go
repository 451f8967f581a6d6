package auth

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"

	"github.com/fatedier/frp/pkg/msg"
	plugin "github.com/fatedier/frp/pkg/plugin/server"
	"go.uber.org/zap"
)

// TokenMetaKey is the login metadata key that carries the tunnel token
// (metadatas.token in an frpc config).
const TokenMetaKey = "token"

// SessionMetaKey is the login metadata key with which the server's session
// layer stamps every login (overwriting any value the client sent) with the
// ID of the session it arrived on. frp copies login metadata into every later
// plugin call of that control, so it also identifies the session of NewProxy
// and CloseProxy.
const SessionMetaKey = "tether_session"

// maxPluginBody bounds a plugin request body. A Login with metadata is well
// under 4 KiB; frp does not bound what a client puts in it.
const maxPluginBody = 64 << 10

// Tunnels is the server state the plugin consults; the tunnel server's
// membership (tunnel/server's members: which sessions serve which tunnel)
// implements it. Methods are called concurrently, from the plugin's
// HTTP handler, while frp waits for the answer: they must not block for long.
type Tunnels interface {
	// Login binds session sessionID to the verified claims under the frp
	// run ID runID (see [ScopedRunID]); a live session of the same tunnel
	// with the same run ID is replaced. Return a *RejectError for a refusal
	// the client should read; any other error is logged and the client is
	// told only that the server failed (ReasonInternal).
	Login(sessionID string, claims *Claims, runID string) error
	// AddRoute records that the session registers proxyName, its tunnel's
	// http route. It fails when the session is not logged in or already has
	// a route. Errors are handled as for Login.
	AddRoute(sessionID, proxyName string) error
	// RemoveRoute forgets a route added by AddRoute. Unknown routes are
	// ignored.
	RemoveRoute(sessionID, proxyName string)
}

// Observer receives the plugin's decisions, for metrics. Methods are called
// concurrently and must not block.
type Observer interface {
	// LoginAccepted is called for each accepted login.
	LoginAccepted(c *Claims)
	// LoginRejected is called for each refused login.
	LoginRejected(reason Reason)
	// RouteRejected is called for each refused NewProxy.
	RouteRejected(reason Reason)
}

// Plugin is frp's server-plugin endpoint for tether: an http.Handler that
// frps calls (see frp's pkg/plugin/server) for the ops in [Plugin.Ops]. It
// verifies the token of each Login and binds the frp control to the tunnel,
// and allows each session of a tunnel exactly one http route at the
// tunnel's own subdomain, in the tunnel's load-balancing group.
type Plugin struct {
	v   *Verifier
	t   Tunnels
	log *zap.Logger
	obs Observer
	// groupKey is the key of every tunnel's frp load-balancing group: the
	// plugin puts each route in its tunnel's group, and no client knows the
	// key, so no client can join another tunnel's group.
	groupKey string
}

// NewPlugin returns a Plugin. log may be nil (no logs) and obs may be nil
// (no metrics); v and t are required.
func NewPlugin(v *Verifier, t Tunnels, log *zap.Logger, obs Observer) *Plugin {
	if v == nil || t == nil {
		panic("auth.NewPlugin: nil Verifier or Tunnels")
	}
	if log == nil {
		log = zap.NewNop()
	}
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	return &Plugin{v: v, t: t, log: log, obs: obs, groupKey: hex.EncodeToString(key)}
}

// Ops returns the ops frps must send to this plugin (HTTPPluginOptions.Ops).
func (p *Plugin) Ops() []string {
	return []string{plugin.OpLogin, plugin.OpNewProxy, plugin.OpCloseProxy}
}

// pluginRequest is frp's plugin request with the content left raw, to be
// decoded by op.
type pluginRequest struct {
	Version string          `json:"version"`
	Op      string          `json:"op"`
	Content json.RawMessage `json:"content"`
}

// ServeHTTP answers one frp plugin call. The answer is always HTTP 200 with
// frp's JSON response, except for a request that is not a plugin call
// (405, 413, 400): frps then refuses the login or proxy on its own.
func (p *Plugin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "frp plugin calls are POST requests", http.StatusMethodNotAllowed)
		return
	}
	var req pluginRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxPluginBody)).Decode(&req); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("plugin request is larger than %d bytes", maxPluginBody), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "plugin request is not JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	op := req.Op
	if op == "" {
		op = r.URL.Query().Get("op")
	}
	var res *plugin.Response
	var err error
	switch op {
	case plugin.OpLogin:
		res, err = decodeAnd(req.Content, p.login)
	case plugin.OpNewProxy:
		res, err = decodeAnd(req.Content, p.newProxy)
	case plugin.OpCloseProxy:
		res, err = decodeAnd(req.Content, p.closeProxy)
	default:
		res = &plugin.Response{Unchange: true}
	}
	if err != nil {
		http.Error(w, fmt.Sprintf("%s content is not valid: %v", op, err), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(res); err != nil {
		p.log.Debug("write plugin response", zap.String("op", op), zap.Error(err))
	}
}

// decodeAnd decodes content into a T and hands it to handle.
func decodeAnd[T any](content json.RawMessage, handle func(*T) *plugin.Response) (*plugin.Response, error) {
	var c T
	if len(content) == 0 || string(content) == "null" {
		return nil, errors.New("content is missing")
	}
	if err := json.Unmarshal(content, &c); err != nil {
		return nil, err
	}
	return handle(&c), nil
}

// rejected is the frp answer that refuses with e's text.
func rejected(e *RejectError) *plugin.Response {
	return &plugin.Response{Reject: true, RejectReason: e.Error(), Unchange: true}
}

// asReject converts an error of Tunnels into what the client may see: a copy
// of a *RejectError (the caller may set fields on it, and Tunnels may return
// shared values), anything else as an internal failure.
func asReject(err error, what string) (rej *RejectError, internal bool) {
	if errors.As(err, &rej) {
		c := *rej
		return &c, false
	}
	return reject(ReasonInternal, "the tunnel server could not %s; retry later, and tell the platform operator if this persists", what), true
}

// VerifyLoginToken verifies the token in a login's metadata, as every login
// is verified: a login probe is answered with exactly the words a login with
// the same token would get.
func VerifyLoginToken(v *Verifier, metas map[string]string) (*Claims, *RejectError) {
	token := metas[TokenMetaKey]
	if token == "" {
		return nil, reject(ReasonMissingToken,
			"login carries no token; set metadatas.token in the client config (tether client --token-file does this)")
	}
	claims, err := v.Verify(token)
	if err != nil {
		var rej *RejectError
		if !errors.As(err, &rej) {
			rej, _ = asReject(err, "verify the token")
		}
		return nil, rej
	}
	return claims, nil
}

// login verifies a Login and binds it to its tunnel.
func (p *Plugin) login(c *plugin.LoginContent) *plugin.Response {
	log := p.log.With(zap.String("client_address", c.ClientAddress))
	claims, rej := VerifyLoginToken(p.v, c.Metas)
	if rej != nil {
		return p.loginRejected(log, rej)
	}
	session := c.Metas[SessionMetaKey]
	if session == "" {
		return p.loginRejected(log, &RejectError{
			Reason:        ReasonSession,
			Detail:        "login did not come through the tether session layer",
			ClaimedTunnel: claims.Tunnel,
		})
	}
	runID := ScopedRunID(claims.Tunnel, c.RunID)
	if err := p.t.Login(session, claims, runID); err != nil {
		rej, internal := asReject(err, "register this login")
		if internal {
			log.Error("register tunnel login", zap.String("tunnel", claims.Tunnel), zap.String("session", session), zap.Error(err))
		}
		rej.ClaimedTunnel = claims.Tunnel
		return p.loginRejected(log, rej)
	}

	// The session layer logs the connected tunnel at info, with its transport.
	log.Debug("tunnel login accepted",
		zap.String("tunnel", claims.Tunnel),
		zap.String("account", claims.Account),
		zap.String("runtime", claims.Runtime),
		zap.String("kid", claims.KeyID),
		zap.Time("expires", claims.ExpiresAt),
		zap.String("session", session),
		zap.String("run_id", runID),
		zap.String("client_version", c.Version))
	if p.obs != nil {
		p.obs.LoginAccepted(claims)
	}

	out := *c
	// The run ID is scoped to the verified tunnel (see ScopedRunID), and the
	// user is the tunnel: frp passes both to every later plugin call of this
	// control, where they name the tunnel.
	out.RunID = runID
	out.User = claims.Tunnel
	// frps refuses a second control with the same (user, client ID); a
	// client-chosen ID could collide with another tenant's.
	out.ClientID = ""
	// The token is not needed past this point; frps keeps login metadata
	// for the life of the control and copies it into every plugin call.
	out.Metas = maps.Clone(c.Metas)
	delete(out.Metas, TokenMetaKey)
	return &plugin.Response{Unchange: false, Content: &out}
}

func (p *Plugin) loginRejected(log *zap.Logger, rej *RejectError) *plugin.Response {
	log.Warn("tunnel login rejected",
		zap.String("reason", string(rej.Reason)),
		zap.String("claimed_tunnel", rej.ClaimedTunnel),
		zap.String("detail", rej.Detail))
	if p.obs != nil {
		p.obs.LoginRejected(rej.Reason)
	}
	return rejected(rej)
}

// newProxy allows one http route per session, at the tunnel's own
// subdomain, and puts it in the tunnel's load-balancing group, so that the
// tunnel's sessions share its subdomain in frp's vhost.
func (p *Plugin) newProxy(c *plugin.NewProxyContent) *plugin.Response {
	// User is the verified tunnel: the login answer set it (see login).
	tunnel := c.User.User
	session := c.User.Metas[SessionMetaKey]
	log := p.log.With(zap.String("tunnel", tunnel), zap.String("proxy", c.ProxyName))
	if tunnel == "" || session == "" || c.User.RunID == "" {
		return p.routeRejected(log, reject(ReasonSession,
			"proxy registration did not come from a tunnel session logged in through tether; reconnect"))
	}
	if problems := routeProblems(tunnel, &c.NewProxy); len(problems) > 0 {
		return p.routeRejected(log, reject(ReasonProxy, "%s", strings.Join(problems, "; ")))
	}
	if err := p.t.AddRoute(session, c.ProxyName); err != nil {
		rej, internal := asReject(err, "register this route")
		if internal {
			log.Error("register tunnel route", zap.String("session", session), zap.Error(err))
		}
		return p.routeRejected(log, rej)
	}
	log.Debug("tunnel route registered", zap.String("session", session))
	out := *c
	out.Group, out.GroupKey = tunnel, p.groupKey
	return &plugin.Response{Unchange: false, Content: &out}
}

func (p *Plugin) routeRejected(log *zap.Logger, rej *RejectError) *plugin.Response {
	log.Warn("tunnel route rejected", zap.String("reason", string(rej.Reason)), zap.String("detail", rej.Detail))
	if p.obs != nil {
		p.obs.RouteRejected(rej.Reason)
	}
	return rejected(rej)
}

// closeProxy forgets a route.
func (p *Plugin) closeProxy(c *plugin.CloseProxyContent) *plugin.Response {
	if session := c.User.Metas[SessionMetaKey]; session != "" {
		p.t.RemoveRoute(session, c.ProxyName)
		p.log.Debug("tunnel route removed", zap.String("tunnel", c.User.User), zap.String("proxy", c.ProxyName))
	}
	return &plugin.Response{Unchange: true}
}

// routeProblems lists how a NewProxy breaks tether's route rule: a session
// serves exactly one http route, at its tunnel's subdomain, named after the
// tunnel. Every frp feature that would reach beyond that (other proxy types,
// ports, custom domains, load-balancing groups the client chose, path
// routing, HTTP basic auth routing, visitors) is refused. Nil means allowed.
func routeProblems(tunnel string, np *msg.NewProxy) []string {
	if np.ProxyType != "http" {
		return []string{fmt.Sprintf("proxy type %s is not allowed: a tunnel serves exactly one http route with subdomain %s",
			quote(np.ProxyType), quote(tunnel))}
	}
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if np.SubDomain != tunnel {
		add("subdomain %s is not allowed: this token is for tunnel %s; set subdomain = %s", quote(np.SubDomain), quote(tunnel), quote(tunnel))
	}
	if np.ProxyName != tunnel && !hasNamePrefix(np.ProxyName, tunnel) {
		add("proxy name %s is not allowed: name the proxy %s or %s", quote(np.ProxyName), quote(tunnel), quote(tunnel+".<name>"))
	}
	if len(np.CustomDomains) > 0 {
		add("custom_domains %s is not allowed: a tunnel is served only at its subdomain %s", quoteList(np.CustomDomains), quote(tunnel))
	}
	if np.Group != "" || np.GroupKey != "" {
		add("load balancing group %s is not allowed: the server puts every route of a tunnel in the tunnel's group; remove group and group_key", quote(np.Group))
	}
	if len(np.Locations) > 1 || (len(np.Locations) == 1 && np.Locations[0] != "/") {
		add(`locations %s is not allowed: a tunnel serves every path; remove locations (or use ["/"])`, quoteList(np.Locations))
	}
	if np.HTTPUser != "" || np.HTTPPwd != "" || np.RouteByHTTPUser != "" {
		add("http_user, http_pwd and route_by_http_user are not allowed: the platform authenticates its own requests")
	}
	if np.RemotePort != 0 {
		add("remote_port %d is not allowed: a tunnel opens no port on the server", np.RemotePort)
	}
	if np.Sk != "" || len(np.AllowUsers) > 0 {
		add("sk and allow_users are not allowed: a tunnel has no visitors")
	}
	if np.Multiplexer != "" {
		add("multiplexer %s is not allowed: a tunnel serves exactly one http route", quote(np.Multiplexer))
	}
	if np.UseEncryption || np.UseCompression {
		// frp would encrypt or compress the work connections, and the
		// server could no longer bound the service's answers before frp
		// reads them.
		add("transport.useEncryption and transport.useCompression are not allowed: the tunnel is TLS already, " +
			"and the server reads the service's answers to bound them; remove them from the proxy " +
			"(use_encryption and use_compression in an INI configuration)")
	}
	return problems
}

// hasNamePrefix reports whether name is "<tunnel>.<something>", the form frpc
// gives proxy names when its user is set to the tunnel name.
func hasNamePrefix(name, tunnel string) bool {
	return len(name) > len(tunnel)+1 && name[:len(tunnel)+1] == tunnel+"."
}
