package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	tetherserver "github.com/tether-dev/tether/tunnel/server"
)

// domain is the domain every test server serves tunnels under.
const domain = "tunnels.test"

// Bounds of the waits. They are generous because the binaries may run under
// the race detector on a busy machine; a wait ends as soon as its condition
// holds.
const (
	startTimeout = 30 * time.Second // a process logs that it started
	readyTimeout = 30 * time.Second // a client becomes ready
	stopTimeout  = 30 * time.Second // a process exits after SIGTERM
)

// ---------------------------------------------------------------------------
// Processes

// proc is a process started by a test. Its stdout and stderr are captured;
// they are dumped when the test fails, and a data race the race detector
// reports in it fails the test.
type proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	out  *logBuffer
	done chan struct{} // closed when the process has exited
}

// logBuffer collects a process's output; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// childEnv is the environment of started processes: this process's, without
// anything that would change their behaviour behind the test's back (proxy
// variables, TETHER_* settings), plus extra.
func childEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToUpper(k) {
		case "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY":
			continue
		}
		if strings.HasPrefix(k, "TETHER_") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "GORACE=halt_on_error=0 exitcode=66")
	return append(env, extra...)
}

// startProc starts bin with args. The process gets SIGTERM when the test
// ends and is killed if it has not exited stopTimeout later.
func startProc(t testing.TB, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	p := &proc{t: t, name: name, cmd: cmd, out: &logBuffer{}, done: make(chan struct{})}
	cmd.Env = childEnv(env)
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopTimeout
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("----- output of %s (%s) -----\n%s----- end of %s -----", name, strings.Join(args, " "), p.out, name)
		}
	})
	return p
}

// Output is everything the process wrote so far.
func (p *proc) Output() string { return p.out.String() }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig unless the process has exited.
func (p *proc) signal(sig os.Signal) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// wait waits up to timeout for the process to exit and returns its exit
// code; ok is false if it is still running.
func (p *proc) wait(timeout time.Duration) (code int, ok bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), true
	case <-t.C:
		return 0, false
	}
}

// stop sends SIGTERM and waits for the exit, killing the process if it
// takes longer than stopTimeout.
func (p *proc) stop() {
	p.signal(syscall.SIGTERM)
	if _, ok := p.wait(stopTimeout); !ok {
		p.t.Errorf("%s did not exit within %v of SIGTERM; killing it", p.name, stopTimeout)
		p.kill()
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// logLines returns the JSON log lines the process wrote so far.
func (p *proc) logLines() []map[string]any {
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.Output()))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			lines = append(lines, m)
		}
	}
	return lines
}

// waitLog waits for a JSON log line whose "msg" is msg and returns it. It
// fails the test if the process exits first.
func (p *proc) waitLog(msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	var found map[string]any
	testutil.WaitFor(p.t, timeout, func() error {
		for _, l := range p.logLines() {
			if l["msg"] == msg {
				found = l
				return nil
			}
		}
		if p.exited() {
			p.t.Fatalf("%s exited (code %d) before logging %q:\n%s", p.name, p.cmd.ProcessState.ExitCode(), msg, p.Output())
		}
		return fmt.Errorf("%s has not logged %q", p.name, msg)
	})
	return found
}

// waitOutput waits until the process's output contains s.
func (p *proc) waitOutput(s string, timeout time.Duration) {
	p.t.Helper()
	testutil.WaitFor(p.t, timeout, func() error {
		if strings.Contains(p.Output(), s) {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited (code %d) without writing %q", p.name, p.cmd.ProcessState.ExitCode(), s)
		}
		return fmt.Errorf("%s has not written %q", p.name, s)
	})
}

// runTether runs a short tether command and returns its exit code, stdout
// and stderr.
func runTether(t testing.TB, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tetherBin, args...)
	cmd.Env = childEnv(env)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run tether %s: %v", strings.Join(args, " "), err)
	}
	return cmd.ProcessState.ExitCode(), o.String(), e.String()
}

// ---------------------------------------------------------------------------
// Keys and tokens

// keys is a token signing key pair made with `tether token keygen`.
type keys struct {
	priv, pub string
}

func newKeys(t testing.TB) *keys {
	t.Helper()
	dir := t.TempDir()
	k := &keys{priv: filepath.Join(dir, "jwt.key.pem"), pub: filepath.Join(dir, "jwt.pub.pem")}
	if code, _, stderr := runTether(t, nil, "token", "keygen", "--private-key", k.priv, "--public-key", k.pub); code != 0 {
		t.Fatalf("tether token keygen: exit %d: %s", code, stderr)
	}
	return k
}

// issue runs `tether token issue` for tunnel with ttl and extra flags.
func (k *keys) issue(t testing.TB, tunnel string, ttl time.Duration, extra ...string) string {
	t.Helper()
	args := append([]string{"token", "issue", "--key", k.priv, "--tunnel", tunnel, "--ttl", ttl.String()}, extra...)
	code, stdout, stderr := runTether(t, nil, args...)
	if code != 0 {
		t.Fatalf("tether %s: exit %d: %s", strings.Join(args, " "), code, stderr)
	}
	tok := strings.TrimSpace(stdout)
	if strings.Count(tok, ".") != 2 {
		t.Fatalf("tether token issue printed %q; want a JWT", tok)
	}
	return tok
}

// writeToken writes token into a new file and returns its path.
func writeToken(t testing.TB, token string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// replaceFile replaces path's content atomically, as a Kubernetes Secret
// volume update does.
func replaceFile(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// jwtHeader decodes a token's header.
func jwtHeader(t testing.TB, token string) map[string]any {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[0])
	if err != nil {
		t.Fatalf("decode JWT header: %v", err)
	}
	var h map[string]any
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("decode JWT header: %v", err)
	}
	return h
}

// assertNoSecret fails the test if secret (or, for a JWT, its signature)
// appears in the output of any of procs.
func assertNoSecret(t testing.TB, what, secret string, procs ...*proc) {
	t.Helper()
	var needles []string
	if len(secret) >= 16 {
		needles = append(needles, secret)
	}
	if parts := strings.Split(secret, "."); len(parts) == 3 && len(parts[2]) >= 16 {
		needles = append(needles, parts[2]) // the signature: what makes a JWT usable
	}
	for _, p := range procs {
		out := p.Output()
		for _, n := range needles {
			if strings.Contains(out, n) {
				t.Errorf("%s appears in the output of %s", what, p.name)
				break
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Server

// serverOpts configure startServer.
type serverOpts struct {
	tunnelAddr string   // default 127.0.0.1:0
	selfSigned bool     // no --tls-cert: clients pin the logged fingerprint
	args       []string // more flags
}

// server is a running `tether server`.
type server struct {
	*proc
	keys                            *keys
	tunnelAddr, httpAddr, adminAddr string
	fingerprint                     string // SHA-256 of a self-signed certificate
}

// startServer starts a tether server on loopback and waits until it has
// logged its bound addresses.
func startServer(t testing.TB, k *keys, o serverOpts) *server {
	t.Helper()
	if o.tunnelAddr == "" {
		o.tunnelAddr = "127.0.0.1:0"
	}
	args := []string{"server",
		"--tunnel-addr", o.tunnelAddr, "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--domain", domain, "--jwt-public-key", k.pub, "--log-level", "debug",
	}
	if !o.selfSigned {
		args = append(args, "--tls-cert", certFile, "--tls-key", keyFile)
	}
	args = append(args, o.args...)
	p := startProc(t, "tether server", nil, tetherBin, args...)
	started := p.waitLog("tether server started", startTimeout)
	s := &server{
		proc: p, keys: k,
		tunnelAddr: str(started["tunnel_addr"]),
		httpAddr:   str(started["http_addr"]),
		adminAddr:  str(started["admin_addr"]),
	}
	if o.selfSigned {
		l := p.waitLog("tunnel listener uses a self-signed certificate; pin it on clients with --tls-fingerprint", startTimeout)
		s.fingerprint = str(l["sha256_fingerprint"])
		if s.fingerprint == "" {
			t.Fatalf("self-signed server logged no sha256_fingerprint: %v", l)
		}
	}
	for _, a := range []string{s.tunnelAddr, s.httpAddr, s.adminAddr} {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "0" {
			t.Fatalf("server logged address %q; want the bound HOST:PORT", a)
		}
	}
	return s
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// tunnelPort is the port of the tunnel listener.
func (s *server) tunnelPort() string {
	_, port, _ := net.SplitHostPort(s.tunnelAddr)
	return port
}

// httpc is the HTTP client of the tests: no proxy from the environment, a
// bound on every request that is not a stream.
var httpc = &http.Client{
	Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, ResponseHeaderTimeout: time.Minute},
	Timeout:   time.Minute,
}

// quickc gives up after a few seconds, for polling a tunnel whose path
// may be frozen.
var quickc = &http.Client{
	Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
	Timeout:   3 * time.Second,
}

// watchc is the client of watchers: a healthy tunnel answers well within
// its timeout even on a busy machine.
var watchc = &http.Client{
	Transport: &http.Transport{Proxy: nil},
	Timeout:   10 * time.Second,
}

// streamc is httpc without the overall timeout, for streams; callers bound
// them with a context.
var streamc = &http.Client{Transport: httpc.Transport}

// request builds a request for path on tunnel's host at the public entry.
func (s *server) request(t testing.TB, method, tunnel, path string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+s.httpAddr+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = tunnel + "." + domain
	return req
}

// response is a read response.
type response struct {
	code   int
	header http.Header
	body   string
}

// get requests path on tunnel's host and reads the whole answer.
func (s *server) get(tunnel, path string) (response, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+s.httpAddr+path, nil)
	if err != nil {
		return response{}, err
	}
	req.Host = tunnel + "." + domain
	return do(req)
}

func do(req *http.Request) (response, error) { return doWith(httpc, req) }

func doWith(c *http.Client, req *http.Request) (response, error) {
	resp, err := c.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("read body of %s %s: %w", req.Method, req.URL, err)
	}
	return response{code: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// result is the outcome of a request made in the background.
type result struct {
	r   response
	err error
}

// getAsync starts get in the background; its one result arrives on the channel.
func (s *server) getAsync(tunnel, path string) <-chan result {
	done := make(chan result, 1)
	go func() {
		r, err := s.get(tunnel, path)
		done <- result{r, err}
	}()
	return done
}

// mustGet is get that fails the test on a transport error.
func (s *server) mustGet(t testing.TB, tunnel, path string) response {
	t.Helper()
	r, err := s.get(tunnel, path)
	if err != nil {
		t.Fatalf("GET %s%s: %v", tunnel, path, err)
	}
	return r
}

// admin GETs an admin endpoint.
func (s *server) admin(path string) (response, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+s.adminAddr+path, nil)
	if err != nil {
		return response{}, err
	}
	return do(req)
}

// tunnelInfo is one entry of /api/tunnels.
type tunnelInfo = tetherserver.Info

// tunnels reads /api/tunnels, one entry per tunnel: its oldest session,
// with the requests and bytes of all its sessions.
func (s *server) tunnels(t testing.TB) map[string]tunnelInfo {
	t.Helper()
	m := make(map[string]tunnelInfo)
	for _, ti := range s.sessions(t) {
		if cur, ok := m[ti.Name]; ok {
			cur.Requests += ti.Requests
			cur.BytesIn += ti.BytesIn
			cur.BytesOut += ti.BytesOut
			m[ti.Name] = cur
			continue
		}
		m[ti.Name] = ti
	}
	return m
}

// sessions reads /api/tunnels: this server's sessions, by tunnel name.
func (s *server) sessions(t testing.TB) []tunnelInfo {
	t.Helper()
	r, err := s.admin("/api/tunnels")
	if err != nil {
		t.Fatalf("GET /api/tunnels: %v", err)
	}
	if r.code != http.StatusOK {
		t.Fatalf("GET /api/tunnels: status %d: %s", r.code, r.body)
	}
	var list []tunnelInfo
	if err := json.Unmarshal([]byte(r.body), &list); err != nil {
		t.Fatalf("GET /api/tunnels: %v: %s", err, r.body)
	}
	return list
}

// metric returns the value of the series name{labels} from /metrics, 0 when
// the series does not exist (yet). labels are name, value pairs.
func (s *server) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	r, err := s.admin("/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	return metricValue(t, r.body, name, labels...)
}

// metricValue finds a series in Prometheus text exposition.
func metricValue(t testing.TB, text, name string, labels ...string) float64 {
	t.Helper()
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for line := range strings.SplitSeq(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		series, value := line[:sp], line[sp+1:]
		n, ls, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		got := map[string]string{}
		for kv := range strings.SplitSeq(strings.TrimSuffix(ls, "}"), ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				got[k] = strings.Trim(v, `"`)
			}
		}
		match := true
		for k, v := range want {
			if got[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		return f
	}
	return 0
}

// ---------------------------------------------------------------------------
// tether client

// clientOpts configure startClient.
type clientOpts struct {
	server    string   // default: the server's tunnel address
	tokenFile string   // required
	routes    []string // --route values
	trust     []string // how to trust the server; default --tls-ca of the test CA (or the pin of a self-signed server)
	args      []string // more flags
	env       []string // more environment
	noWait    bool     // do not wait for readiness
}

// client is a running `tether client`.
type client struct {
	*proc
	healthAddr string
	tokenFile  string
}

// startClient starts a tether client for s and waits until it is ready.
func startClient(t testing.TB, s *server, o clientOpts) *client {
	t.Helper()
	if o.server == "" {
		o.server = s.tunnelAddr
	}
	if o.trust == nil {
		if s.fingerprint != "" {
			o.trust = []string{"--tls-fingerprint", s.fingerprint}
		} else {
			o.trust = []string{"--tls-ca", caFile}
		}
	}
	args := []string{"client", "--server", o.server, "--token-file", o.tokenFile,
		"--health-addr", "127.0.0.1:0", "--log-level", "debug"}
	for _, r := range o.routes {
		args = append(args, "--route", r)
	}
	args = append(args, o.trust...)
	args = append(args, o.args...)
	p := startProc(t, "tether client", o.env, tetherBin, args...)
	started := p.waitLog("tether client started", startTimeout)
	c := &client{proc: p, healthAddr: str(started["health_addr"]), tokenFile: o.tokenFile}
	if c.healthAddr == "" {
		t.Fatalf("client logged no health_addr: %v", started)
	}
	if !o.noWait {
		c.waitReady(t, readyTimeout)
	}
	return c
}

// readyz returns the status and body of the client's /readyz.
func (c *client) readyz() (int, string, error) {
	r, err := httpc.Get("http://" + c.healthAddr + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b), nil
}

// waitReady waits until /readyz answers 200.
func (c *client) waitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	testutil.WaitFor(t, timeout, func() error {
		if c.exited() {
			t.Fatalf("client exited (code %d) before becoming ready", c.cmd.ProcessState.ExitCode())
		}
		code, body, err := c.readyz()
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("client /readyz: %d %s", code, strings.TrimSpace(body))
		}
		return nil
	})
}

// clientStatus is the client's /status.
type clientStatus struct {
	Tunnel     string `json:"tunnel"`
	Server     string `json:"server"`
	Via        string `json:"via"`
	Ready      bool   `json:"ready"`
	State      string `json:"state"`
	Connected  bool   `json:"connected"`
	LastError  string `json:"last_error"`
	Reconnects int    `json:"reconnects"`
	Routes     []struct {
		Prefix   string `json:"prefix"`
		Upstream string `json:"upstream"`
	} `json:"routes"`
	Sessions []sessionStatus `json:"sessions"`
}

// sessionStatus is one session of a client's /status.
type sessionStatus struct {
	Slot    int    `json:"slot"`
	Replica string `json:"replica"`
	Session string `json:"session"`
	State   string `json:"state"`
}

func (c *client) status() (clientStatus, error) {
	var st clientStatus
	r, err := httpc.Get("http://" + c.healthAddr + "/status")
	if err != nil {
		return st, err
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/status: %s", r.Status)
	}
	err = json.NewDecoder(r.Body).Decode(&st)
	return st, err
}

// ---------------------------------------------------------------------------
// stock frpc

// startFRPC starts a stock frpc with the given TOML configuration.
func startFRPC(t testing.TB, name, config string) *proc {
	t.Helper()
	f := filepath.Join(t.TempDir(), "frpc.toml")
	if err := os.WriteFile(f, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return startProc(t, name, nil, frpcBin, "-c", f)
}

// frpcConfig is a stock frpc configuration for s logging in with token. body
// holds further settings and the [[proxies]] tables.
func frpcConfig(s *server, token, body string) string {
	return fmt.Sprintf(`serverAddr = "127.0.0.1"
serverPort = %s
log.to = "console"
log.level = "debug"
log.disablePrintColor = true
metadatas.token = %q
%s
`, s.tunnelPort(), token, body)
}

// frpcHTTPProxy is the one proxy tether allows a tunnel: type http, named and
// with the subdomain of the tunnel, forwarding to backend.
func frpcHTTPProxy(tunnel string, b *backend) string {
	return fmt.Sprintf(`
[[proxies]]
name = %q
type = "http"
subdomain = %q
localIP = "127.0.0.1"
localPort = %d
`, tunnel, tunnel, b.port())
}

// ---------------------------------------------------------------------------
// Backends

// backend is an upstream service in the test process. By default it answers
// every request with an echo of what reached it.
type backend struct {
	name string
	srv  *httptest.Server
	hits atomic.Int64
}

// echo is what the default backend answers.
type echo struct {
	Backend  string      `json:"backend"`
	Method   string      `json:"method"`
	Path     string      `json:"path"`
	RawQuery string      `json:"raw_query"`
	Host     string      `json:"host"`
	Header   http.Header `json:"header"`
}

// newBackend starts an echo backend; extra handles the paths it names.
func newBackend(t testing.TB, name string, extra map[string]http.HandlerFunc) *backend {
	t.Helper()
	b := &backend{name: name}
	mux := http.NewServeMux()
	for pattern, h := range extra {
		mux.HandleFunc(pattern, h)
	}
	if _, ok := extra["/"]; !ok {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(echo{
				Backend: name, Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
				Host: r.Host, Header: r.Header,
			})
		})
	}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) url() string { return b.srv.URL }

func (b *backend) port() int {
	_, port, _ := net.SplitHostPort(b.srv.Listener.Addr().String())
	n, _ := strconv.Atoi(port)
	return n
}

// decodeEcho parses an echo answer, failing the test when r is not one.
func decodeEcho(t testing.TB, r response) echo {
	t.Helper()
	if r.code != http.StatusOK {
		t.Fatalf("got status %d (%s %s), want 200 from a backend", r.code, r.header.Get("X-Tether-Error"), strings.TrimSpace(r.body))
	}
	var e echo
	if err := json.Unmarshal([]byte(r.body), &e); err != nil {
		t.Fatalf("answer is not a backend echo: %v: %q", err, r.body)
	}
	return e
}

// echoFrom requests path on tunnel and returns which backend answered, or
// an error that says what came back instead.
func (s *server) echoFrom(tunnel, path string) (echo, error) {
	return s.echoFromWith(quickc, tunnel, path)
}

func (s *server) echoFromWith(c *http.Client, tunnel, path string) (echo, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+s.httpAddr+path, nil)
	if err != nil {
		return echo{}, err
	}
	req.Host = tunnel + "." + domain
	r, err := doWith(c, req)
	if err != nil {
		return echo{}, err
	}
	if r.code != http.StatusOK {
		return echo{}, fmt.Errorf("GET %s.%s%s: %d %s %s", tunnel, domain, path, r.code, r.header.Get("X-Tether-Error"), strings.TrimSpace(r.body))
	}
	var e echo
	if err := json.Unmarshal([]byte(r.body), &e); err != nil {
		return echo{}, fmt.Errorf("GET %s.%s%s: not a backend echo: %q", tunnel, domain, path, r.body)
	}
	return e, nil
}

// servedBy waits until a request for tunnel reaches backend want.
func (s *server) waitServedBy(t testing.TB, tunnel, want string, timeout time.Duration) {
	t.Helper()
	testutil.WaitFor(t, timeout, func() error {
		e, err := s.echoFrom(tunnel, "/")
		if err != nil {
			return err
		}
		if e.Backend != want {
			return fmt.Errorf("tunnel %s answered from backend %q, want %q", tunnel, e.Backend, want)
		}
		return nil
	})
}

// freePort returns a loopback port that nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(testutil.FreeAddr(t))
	n, _ := strconv.Atoi(port)
	return n
}

// ---------------------------------------------------------------------------
// Watching a healthy tunnel

// watcher requests a tunnel over and over in the background and records
// every request that did not reach the expected backend, and how long
// those that did took.
type watcher struct {
	cancel context.CancelFunc
	done   chan struct{}
	ok     atomic.Int64
	mu     sync.Mutex
	fails  []string
	took   []time.Duration
}

// watch starts a watcher on tunnel, expecting backend want.
func (s *server) watch(tunnel, want string) *watcher { return s.watchWith(watchc, tunnel, want) }

// watchWith is watch with client c: quickc makes each request on a new
// connection.
func (s *server) watchWith(c *http.Client, tunnel, want string) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			start := time.Now()
			e, err := s.echoFromWith(c, tunnel, "/watch")
			switch {
			case err != nil:
				w.fail(fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
			case e.Backend != want:
				w.fail(fmt.Sprintf("%s: answered by backend %q, want %q", time.Now().Format("15:04:05.000"), e.Backend, want))
			default:
				w.mu.Lock()
				w.took = append(w.took, time.Since(start))
				w.mu.Unlock()
				w.ok.Add(1)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *watcher) fail(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fails = append(w.fails, s)
}

// check fails the test if any request failed so far, and requires that some
// succeeded since the last check.
func (w *watcher) check(t testing.TB, phase string) {
	t.Helper()
	before := w.ok.Load()
	testutil.WaitFor(t, 20*time.Second, func() error {
		if w.ok.Load() > before {
			return nil
		}
		return fmt.Errorf("no request to the healthy tunnel succeeded %s", phase)
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.fails) > 0 {
		t.Errorf("healthy tunnel failed %d request(s) %s: %s", len(w.fails), phase, strings.Join(w.fails, "; "))
		w.fails = nil
	}
}

func (w *watcher) stop() {
	w.cancel()
	<-w.done
}

// listensOn reports whether process p has a TCP socket listening on port
// (IPv4 or IPv6), from /proc: a dial would also reach whatever another
// process listens on there.
func listensOn(t testing.TB, p *proc, port int) bool {
	t.Helper()
	listening := make(map[string]bool) // socket inodes
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			t.Fatalf("read %s: %v", table, err)
		}
		// sl local_address rem_address st ... inode: the local address is
		// HEX_IP:HEX_PORT, and st 0A is LISTEN.
		for line := range strings.Lines(string(data)) {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if n, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(n) == port {
				listening[f[9]] = true
			}
		}
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatalf("list the sockets of %s: %v", p.name, err)
	}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if inode, ok := strings.CutPrefix(target, "socket:["); err == nil && ok && listening[strings.TrimSuffix(inode, "]")] {
			return true
		}
	}
	return false
}
