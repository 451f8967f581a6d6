package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
)

// TestAlertsAndDashboardUseExportedMetrics renders the server chart's
// PrometheusRule and Grafana dashboard, and checks that every metric their
// expressions name is one that tether servers export: it runs two replicas
// of bin/tether sharing a Redis registry, a client, a request through each
// replica, a refused login and a refused connection, and scrapes both. A
// renamed metric fails here until the rules and the dashboard follow.
func TestAlertsAndDashboardUseExportedMetrics(t *testing.T) {
	m := serverChart.mustTemplate(t, nil, "prometheusRule.enabled=true", "grafanaDashboard.enabled=true")
	used := map[string][]string{} // metric -> where
	if len(m.prometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules rendered; want 1", len(m.prometheusRules))
	}
	for _, g := range m.prometheusRules[0].Spec.Groups {
		for _, r := range g.Rules {
			for _, name := range metricNames(r.Expr) {
				used[name] = append(used[name], "alert "+r.Alert)
			}
		}
	}
	for _, q := range dashboardQueries(t, m) {
		for _, name := range metricNames(q.expr) {
			used[name] = append(used[name], "panel "+q.panel)
		}
	}
	if len(used) < 10 {
		t.Fatalf("the rules and the dashboard name %d metrics: %v; the expressions were not read", len(used), used)
	}

	exported := scrapeFleet(t)
	for name, where := range used {
		if !exported[name] {
			t.Errorf("%s, used by %s, is not exported by the server", name, strings.Join(slices.Compact(where), ", "))
		}
	}
}

// query is one PromQL expression of the dashboard.
type query struct{ panel, expr string }

// dashboardQueries returns the expressions of the dashboard's panels and
// the metrics its template variables read.
func dashboardQueries(t *testing.T, m *manifests) []query {
	t.Helper()
	var board struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	var found bool
	for _, cm := range m.configMaps {
		if text, ok := cm.Data["tether.json"]; ok {
			found = true
			if err := json.Unmarshal([]byte(text), &board); err != nil {
				t.Fatalf("dashboard ConfigMap %s: %v", cm.Name, err)
			}
		}
	}
	if !found {
		t.Fatal("no dashboard ConfigMap rendered")
	}
	var qs []query
	for _, p := range board.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, query{p.Title, tg.Expr})
		}
	}
	labelValues := regexp.MustCompile(`^label_values\(([^,]+),`)
	for _, v := range board.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			qs = append(qs, query{"variable " + v.Name, m[1]})
		}
	}
	return qs
}

var (
	promStrings    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promMatchers   = regexp.MustCompile(`\{[^}]*\}`)
	promRanges     = regexp.MustCompile(`\[[^\]]*\]`)
	promNumbers    = regexp.MustCompile(`\b[0-9][0-9a-zA-Z_.]*`)
	promLabelLists = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdents     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords   = []string{"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring",
		"group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)

// metricNames returns the metric names a PromQL expression reads: what
// remains once strings, label matchers, ranges, label lists, function and
// aggregation names (followed by a parenthesis), numbers,
// durations and keywords are taken out.
func metricNames(expr string) []string {
	expr = promStrings.ReplaceAllString(expr, `""`)
	expr = promMatchers.ReplaceAllString(expr, " ")
	expr = promRanges.ReplaceAllString(expr, " ")
	expr = promLabelLists.ReplaceAllString(expr, " ")
	expr = promNumbers.ReplaceAllString(expr, " ")
	var names []string
	for _, m := range promIdents.FindAllStringSubmatch(expr, -1) {
		ident := strings.TrimRight(strings.TrimSuffix(strings.TrimSpace(m[0]), "("), " ")
		if m[1] != "" || slices.Contains(promKeywords, ident) {
			continue
		}
		names = append(names, ident)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (namespace, tunnel) (rate(tether_tunnel_requests_total{tunnel=~"a|b", code_class="5xx"}[5m]))`: {"tether_tunnel_requests_total"},
		"count by (tunnel) (max_over_time(a_total[1h]))\nunless count by (tunnel) (b_total offset 1h)":         {"a_total", "b_total"},
		`histogram_quantile(0.99, sum by (le) (rate(x_bucket{pod=~"$pod"}[$__rate_interval])))`:                {"x_bucket"},
		`max by (pod, version) (tether_build_info) * on (pod) group_left (version) up > 0.8 * 8192`:            {"tether_build_info", "up"},
		`1 - tether_registry_up{job="tether"} and bool process_cpu_seconds_total`:                              {"process_cpu_seconds_total", "tether_registry_up"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %v; want %v", expr, got, want)
		}
	}
}

// scrapeFleet runs two server replicas on one Redis registry, with a client
// on the first, causes the events whose counters the rules watch, and
// returns the metric names the two /metrics endpoints export.
func scrapeFleet(t *testing.T) map[string]bool {
	t.Helper()
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub.pem")
	if err := auth.GenerateKeyPair(auth.EdDSA, priv, pub); err != nil {
		t.Fatal(err)
	}
	otherPriv, otherPub := filepath.Join(dir, "other.pem"), filepath.Join(dir, "other.pub.pem")
	if err := auth.GenerateKeyPair(auth.EdDSA, otherPriv, otherPub); err != nil {
		t.Fatal(err)
	}
	token := issueToken(t, priv, filepath.Join(dir, "token"))
	foreignToken := issueToken(t, otherPriv, filepath.Join(dir, "foreign-token"))
	secret := filepath.Join(dir, "peer-secret")
	if err := os.WriteFile(secret, []byte("a-peer-secret-shared-by-the-replicas\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	redis := testutil.StartRedis(t)

	type replica struct{ tunnel, http, admin string }
	start := func(id string, extra ...string) replica {
		r := replica{testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)}
		startProcess(t, "server "+id, append([]string{"server", "--domain", "tunnels.test", "--jwt-public-key", pub,
			"--tunnel-addr", r.tunnel, "--http-addr", r.http, "--admin-addr", r.admin,
			"--registry", redis.URL(), "--replica-id", id, "--peer-addr", testutil.FreeAddr(t), "--peer-secret-file", secret,
			"--log-level", "warn"}, extra...)...)
		waitHTTP(t, "http://"+r.admin+"/readyz", "")
		return r
	}
	a := start("a")
	// b closes a second connection from one address before its login.
	b := start("b", "--max-anonymous-per-ip", "1")

	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	t.Cleanup(backend.Close)
	health := testutil.FreeAddr(t)
	startProcess(t, "client", "client", "--server", a.tunnel, "--token-file", token, "--tls-insecure-skip-verify",
		"--route", "/="+backend.URL, "--health-addr", health, "--connections", "1", "--log-level", "warn")
	waitHTTP(t, "http://"+health+"/readyz", "")
	// Served on a; forwarded by b to a once b's view of the registry has it.
	waitHTTP(t, "http://"+a.http+"/", "acme.tunnels.test")
	waitHTTP(t, "http://"+b.http+"/", "acme.tunnels.test")
	get(t, "http://"+a.http+"/", "nobody.tunnels.test") // 404 unknown_host

	// A client whose token no server trusts: refused logins.
	startProcess(t, "refused client", "client", "--server", a.tunnel, "--token-file", foreignToken, "--tls-insecure-skip-verify",
		"--route", "/="+backend.URL, "--log-level", "error")
	waitMetric(t, a.admin, "tether_logins_rejected_total")

	// Two connections from one address: b holds the first and resets the
	// second at accept (which its dial may see).
	held, err := net.Dial("tcp", b.tunnel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Close() })
	if c, err := net.Dial("tcp", b.tunnel); err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	waitMetric(t, b.admin, "tether_connections_refused_total")

	names := map[string]bool{}
	for _, admin := range []string{a.admin, b.admin} {
		for name := range scrape(t, admin) {
			names[name] = true
		}
	}
	return names
}

func issueToken(t *testing.T, key, file string) string {
	t.Helper()
	s, err := auth.LoadSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := s.Issue(auth.IssueRequest{Tunnel: "acme", TTL: time.Hour}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// startProcess starts bin/tether with args until the test ends; its output
// is logged when the test fails.
func startProcess(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(tetherBin, args...)
	var out testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s (tether %s):\n%s", name, strings.Join(args, " "), out.String())
		}
	})
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// get makes one request with the given Host and returns its status.
func get(t *testing.T, url, host string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	res, err := httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	return res.StatusCode, nil
}

// waitHTTP polls url until it answers 200.
func waitHTTP(t *testing.T, url, host string) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, func() error {
		code, err := get(t, url, host)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("GET %s (Host %q): %d", url, host, code)
		}
		return nil
	})
}

// scrape returns the metric names a server's /metrics exports.
func scrape(t *testing.T, admin string) map[string]bool {
	t.Helper()
	res, err := httpClient.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

func waitMetric(t *testing.T, admin, name string) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if !scrape(t, admin)[name] {
			return fmt.Errorf("%s exports no %s yet", admin, name)
		}
		return nil
	})
}

// TestAlertsHaveRunbooks: every alert has a summary, a description and a
// runbook_url whose fragment is a section of docs/runbooks.md, at the URL
// of the chart's appVersion by default or under prometheusRule.runbookURL.
func TestAlertsHaveRunbooks(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{1,6} (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	for base, set := range map[string][]string{
		"https://github.com/tether-dev/tether/blob/" + chartMeta(t, serverChart).AppVersion + "/docs/runbooks.md": nil,
		"https://wiki.example.com/tether": {"prometheusRule.runbookURL=https://wiki.example.com/tether"},
	} {
		m := serverChart.mustTemplate(t, nil, append(set, "prometheusRule.enabled=true")...)
		alerts := 0
		for _, g := range m.prometheusRules[0].Spec.Groups {
			for _, r := range g.Rules {
				alerts++
				if r.Annotations["summary"] == "" || r.Annotations["description"] == "" || r.Labels["severity"] == "" {
					t.Errorf("alert %s: summary %q, description %q, severity %q; want all three",
						r.Alert, r.Annotations["summary"], r.Annotations["description"], r.Labels["severity"])
				}
				url, fragment, _ := strings.Cut(r.Annotations["runbook_url"], "#")
				if url != base {
					t.Errorf("alert %s: runbook_url %s; want %s#...", r.Alert, r.Annotations["runbook_url"], base)
				}
				if !anchors[fragment] {
					t.Errorf("alert %s: runbook_url names section #%s, which docs/runbooks.md does not have", r.Alert, fragment)
				}
			}
		}
		if alerts < 6 {
			t.Errorf("%d alerts; want at least the six the chart documents", alerts)
		}
	}
}

// githubAnchor is the fragment GitHub gives a Markdown heading: lower case,
// punctuation dropped, spaces as hyphens.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}
