package diagnose

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/human"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/client"
)

// tokenClaims are the claims a tunnel token carries.
type tokenClaims struct {
	jwt.RegisteredClaims
	Account string `json:"account"`
	Runtime string `json:"runtime"`
}

// checkToken reads the token file and shows what the token says, judged by
// the server's clock when the clock check learned it. With
// --renewed-token-file it judges the token the client logs in with: the
// renewal kept there when the client would prefer it. The token itself is
// never shown.
func (r *run) checkToken(context.Context) Check {
	path := r.o.Client.TokenFile
	if path == "" {
		return fail("--token-file is not set", "point --token-file at the mounted token Secret (TETHER_TOKEN_FILE in the sidecar)")
	}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fail(fmt.Sprintf("--token-file %s does not exist", path),
			"mount the tunnel's token Secret there, or fix --token-file (kubectl describe pod shows the volume mounts)")
	case errors.Is(err, fs.ErrPermission):
		return fail(fmt.Sprintf("--token-file %s is not readable by this user (uid %d)", path, os.Getuid()),
			"make the Secret volume readable: set defaultMode: 0440 on it and fsGroup in the pod's securityContext")
	case err != nil:
		return fail(fmt.Sprintf("read --token-file %s: %v", path, err), "fix --token-file")
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return fail(fmt.Sprintf("--token-file %s is empty", path), "put the JWT printed by `tether token issue` in the Secret")
	}
	var claims tokenClaims
	parsed, _, err := jwt.NewParser().ParseUnverified(token, &claims)
	if err != nil {
		return fail(fmt.Sprintf("--token-file %s does not hold a JWT (%d bytes; %v)", path, len(token), err),
			"the file must hold only the token printed by `tether token issue`: no quotes, no \"Bearer \", no other lines")
	}
	r.token = token

	now, clock := r.o.Now(), "this machine's clock"
	if r.skew != nil {
		now, clock = now.Add(*r.skew), "the server's clock"
	}
	lines := []string{fmt.Sprintf("tunnel (sub) %q%s; signed %s", claims.Subject, describeOwner(claims.Account, claims.Runtime), parsed.Method.Alg())}
	if kid, ok := parsed.Header["kid"].(string); ok {
		lines[0] += ", key ID " + kid
	}
	if err := auth.ValidTunnelName(claims.Subject); err != nil {
		return fail(strings.Join(lines, "\n")+"\nsub is not a tunnel name: "+err.Error(), "issue the token with --tunnel set to a DNS label (a-z, 0-9, '-')")
	}
	use, err := client.ParseToken(token, client.TokenFromFile)
	if err != nil { // checked above; a JWT with a tunnel's sub parses
		return fail(fmt.Sprintf("--token-file %s: %v", path, err), "put the JWT printed by `tether token issue` in the Secret")
	}
	lines = append(lines, tokenTimes(&use.Claims, now, clock)...)
	if renewed := r.o.Client.RenewedTokenFile; renewed != "" {
		var more []string
		use, more = r.renewedToken(renewed, use, now, clock)
		lines = append(lines, more...)
	}
	detail := strings.Join(lines, "\n")
	c := &use.Claims
	reissue := fmt.Sprintf("issue a new token (tether token issue --tunnel %s ...) and update the Secret; the client re-reads the file at its next connect, no restart needed", c.Tunnel)
	switch {
	case c.ExpiresAt.IsZero():
		return fail(detail+"\nthe token has no exp claim; the server requires one", reissue)
	case now.After(c.ExpiresAt.Add(auth.DefaultLeeway)):
		return fail(detail+"\nthe token has expired", reissue)
	case now.After(c.ExpiresAt):
		return warn(detail+fmt.Sprintf("\nthe token has expired; the server still accepts it for %s of clock leeway", auth.DefaultLeeway), reissue)
	case !c.NotBefore.IsZero() && now.Before(c.NotBefore):
		return fail(detail+fmt.Sprintf("\nthe token is not valid before %s (%s)", c.NotBefore.Format(time.RFC3339), until(c.NotBefore, now)),
			"wait, or issue a token without a future nbf; if the time looks wrong, see the clock check")
	}
	if within := client.ExpiryWarning(c, now); within != 0 {
		return warn(detail+fmt.Sprintf("\nthe token expires within %s and has not been renewed: servers with --token-renewal-key renew a connected client's token when a third of its lifetime is left", human.Age(within)),
			reissue+"; or give the servers --token-renewal-key, so that they renew it")
	}
	return pass(detail)
}

// tokenTimes describes a token's jti, iat and exp.
func tokenTimes(c *auth.Claims, now time.Time, clock string) []string {
	var lines []string
	if c.ID != "" {
		id := "jti " + c.ID
		if c.Renews != "" {
			id += ", renewing jti " + c.Renews
		}
		lines = append(lines, id)
	}
	if !c.IssuedAt.IsZero() {
		lines = append(lines, fmt.Sprintf("issued %s (%s)", c.IssuedAt.Format(time.RFC3339), until(c.IssuedAt, now)))
	}
	if !c.ExpiresAt.IsZero() {
		lines = append(lines, fmt.Sprintf("expires %s (%s, by %s)", c.ExpiresAt.Format(time.RFC3339), until(c.ExpiresAt, now), clock))
	}
	return lines
}

// renewedToken reads the renewal the client keeps in --renewed-token-file
// path and returns the token the client logs in with, file's or that one,
// with lines that say which and why.
func (r *run) renewedToken(path string, file *client.Token, now time.Time, clock string) (*client.Token, []string) {
	renewed, err := client.ReadRenewedToken(path, file.Claims.Tunnel, now)
	switch {
	case err != nil:
		return file, []string{"not used: " + err.Error()}
	case renewed == nil:
		return file, []string{fmt.Sprintf("--renewed-token-file %s holds no renewal yet", path)}
	case client.PreferToken(file, renewed, now) != renewed:
		return file, []string{fmt.Sprintf("--renewed-token-file %s holds an older renewal: the client logs in with --token-file's token", path)}
	}
	r.token = renewed.Raw()
	lines := []string{fmt.Sprintf("in use: the renewal in --renewed-token-file %s, newer than --token-file's", path)}
	return renewed, append(lines, tokenTimes(&renewed.Claims, now, clock)...)
}

// checkLogin asks the server, with a login probe, whether it accepts the
// token. The probe registers nothing, so a running client is not disturbed.
func (r *run) checkLogin(ctx context.Context) Check {
	switch {
	case r.prober == nil:
		return unusable()
	case r.token == "":
		return Check{Status: Skip, Detail: "skipped: no usable token (see token)"}
	case !r.reachable:
		return Check{Status: Skip, Detail: "skipped: the server is not reachable (see tcp)"}
	case !r.trusted:
		return Check{Status: Skip, Detail: "skipped: this client does not trust the server's certificate (see tls)"}
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	start := time.Now()
	reply, err := r.prober.Login(ctx, r.token)
	took := time.Since(start)
	if rej, ok := errors.AsType[*client.RejectedError](err); ok {
		return fail("the server refused the login: "+rej.Reason, loginHint(rej.Reason))
	}
	if err != nil {
		return fail(fmt.Sprintf("login over %s failed: %v", r.cfg.Transport, err), loginErrHint(r.cfg.Transport, err))
	}
	r.probe = reply
	lines := []string{fmt.Sprintf("the server (%s) accepts the token for tunnel %q%s in %s",
		reply.ServerVersion, reply.Tunnel, describeOwner(reply.Account, reply.Runtime), ms(took))}
	if reply.PublicURL != "" {
		lines = append(lines, "public URL: "+reply.PublicURL)
	}
	lines = append(lines, bufferLines(reply, r.o.Now())...)
	if !reply.Connected {
		lines = append(lines, "no client serves this tunnel right now")
		return warn(strings.Join(lines, "\n"), "the path to the server works, but the tunnel is down: start `tether client` with this configuration (before it starts, in a pre-flight check, this is expected), or read its log and `tether status` where it runs")
	}
	since := ""
	if reply.ConnectedSince != nil {
		since = fmt.Sprintf(" since %s (%s)", reply.ConnectedSince.UTC().Format(time.RFC3339), until(*reply.ConnectedSince, r.o.Now()))
	}
	lines = append(lines, fmt.Sprintf("a client serves this tunnel from %s%s", reply.ClientAddress, since))
	return pass(strings.Join(lines, "\n"))
}

// bufferLines says what the server holds of the tunnel's buffered
// webhooks: those waiting for delivery, and those their upstream refused.
func bufferLines(reply *tunnel.ProbeReply, now time.Time) []string {
	var lines []string
	since := ""
	if reply.BufferedSince != nil {
		since = fmt.Sprintf(", the oldest stored %s (%s)", reply.BufferedSince.UTC().Format(time.RFC3339), until(*reply.BufferedSince, now))
	}
	if reply.Buffered > 0 {
		lines = append(lines, fmt.Sprintf("%d webhooks stored while the tunnel was down wait for delivery%s; they are delivered in order once a client serves it", reply.Buffered, since))
		since = ""
	}
	if reply.BufferRejected > 0 {
		lines = append(lines, fmt.Sprintf("%d buffered webhooks were refused by their upstream (a 4xx)%s; the operator lists and requeues them at GET /api/tunnels/%s/buffer", reply.BufferRejected, since, reply.Tunnel))
	}
	return lines
}

// loginHint turns the server's reason code (the text before the first
// colon) into what to do.
func loginHint(reason string) string {
	code, _, _ := strings.Cut(reason, ":")
	switch auth.Reason(code) {
	case auth.ReasonExpired, auth.ReasonNoExpiry:
		return "issue a new token with `tether token issue` and update the Secret; the client picks it up at its next connect"
	case auth.ReasonSignature, auth.ReasonUnknownKey, auth.ReasonAlgorithm:
		return "the token was signed with a key the server does not trust: issue it with the private key whose public key is in the server's --jwt-public-key (during a key rotation the server's file must hold both public keys)"
	case auth.ReasonNotYetValid:
		return "the token is not valid yet by the server's clock: see the clock check, or issue it without a future nbf"
	case auth.ReasonIssuer, auth.ReasonAudience:
		return "the server requires a specific iss/aud (--jwt-issuer, --jwt-audience): issue the token with those values"
	case auth.ReasonMalformed, auth.ReasonMissingToken, auth.ReasonSubject:
		return "the token file must hold only the JWT printed by `tether token issue`"
	}
	return "the platform operator can look up this reason in the server's log (tunnel login rejected)"
}

func loginErrHint(transport string, err error) string {
	if transport == "wss" && strings.Contains(err.Error(), "wss upgrade") {
		return "a proxy or load balancer in the way does not pass websockets: allow the upgrade at /~!frp, or use --transport tcp"
	}
	return "the earlier checks reached the server, so the login itself failed: retry, and give the platform operator this output and the time"
}

// describeOwner is ", account "a", runtime "r"" for the claims a token has.
func describeOwner(account, runtime string) string {
	var s string
	if account != "" {
		s += fmt.Sprintf(", account %q", account)
	}
	if runtime != "" {
		s += fmt.Sprintf(", runtime %q", runtime)
	}
	return s
}
