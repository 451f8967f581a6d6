package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// kubeVersion is the cluster version charts are rendered for: helm built
// with `go install` assumes v1.20, older than the charts' kubeVersion.
const kubeVersion = "1.34.0"

var (
	// helmBin is the helm the tests run; helmErr says why there is none.
	helmBin string
	helmErr error
	// tetherBin is tether built from this module for the tests.
	tetherBin string
	// serverFlags and clientFlags are the long flags `tether server --help`
	// and `tether client --help` list (global flags included).
	serverFlags, clientFlags map[string]bool
	// clientHelp is the text of `tether client --help`.
	clientHelp string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	helmBin, helmErr = findHelm()

	dir, err := os.MkdirTemp("", "tether-deploy-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, "make temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	tetherBin = filepath.Join(dir, "tether")
	build := exec.Command("go", "build", "-o", tetherBin, "./cmd/tether")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/tether: %v\n%s", err, out)
		return 1
	}
	var help string
	if help, err = tetherHelp("server"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	serverFlags = withContract(parseFlags(help), serverHAFlags)
	if clientHelp, err = tetherHelp("client"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	clientFlags = withContract(parseFlags(clientHelp), clientHAFlags)
	return m.Run()
}

// serverHAFlags and clientHAFlags are the flags for several sessions per
// tunnel and several server replicas, public and fixed in DESIGN.md ("High
// availability and scale-out"), which the charts set.
var (
	serverHAFlags = []string{"registry", "registry-password-file", "replica-id", "peer-addr",
		"peer-advertise-addr", "peer-secret-file", "max-sessions-per-tunnel"}
	clientHAFlags = []string{"connections"}
)

// withContract adds the contract's flags to those --help lists when --help
// lists none of them: a binary built from a tree where they are not wired
// yet. As soon as it lists one, the check is --help's alone, so a contract
// flag that goes missing (or is renamed) fails the chart tests.
func withContract(flags map[string]bool, contract []string) map[string]bool {
	for _, f := range contract {
		if flags[f] {
			return flags
		}
	}
	for _, f := range contract {
		flags[f] = true
	}
	return flags
}

// findHelm looks for helm where `make helm` installs it, then on PATH.
func findHelm() (string, error) {
	var tried []string
	if h := os.Getenv("HELM"); h != "" {
		if _, err := os.Stat(h); err == nil {
			return h, nil
		}
		tried = append(tried, h+" (from $HELM)")
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, p := range filepath.SplitList(strings.TrimSpace(string(out))) {
			h := filepath.Join(p, "bin", "helm")
			if _, err := os.Stat(h); err == nil {
				return h, nil
			}
			tried = append(tried, h)
		}
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h, nil
	}
	tried = append(tried, "helm on $PATH")
	return "", fmt.Errorf("helm is not installed (looked at %s): run `make helm` to build the pinned version into $(go env GOPATH)/bin, or `make test`, which does it first",
		strings.Join(tried, ", "))
}

// needHelm fails the test when there is no helm: the chart tests are part of
// `make test` and must not pass by being skipped.
func needHelm(t *testing.T) {
	t.Helper()
	if helmErr != nil {
		t.Fatal(helmErr)
	}
}

func tetherHelp(cmd string) (string, error) {
	out, err := exec.Command(tetherBin, cmd, "--help").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("tether %s --help: %v\n%s", cmd, err, out)
	}
	return string(out), nil
}

var flagRE = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`)

func parseFlags(help string) map[string]bool {
	flags := map[string]bool{}
	for _, m := range flagRE.FindAllStringSubmatch(help, -1) {
		flags[m[1]] = true
	}
	return flags
}

// helm runs helm with a private home, so no user's repositories or plugins
// take part, and returns its stdout.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	needHelm(t)
	home := t.TempDir()
	cmd := exec.Command(helmBin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	return stdout.String(), nil
}

// chart names a chart under helm/ with the values it needs to render at all.
type chart struct {
	name     string
	required []string // --set values the defaults lack
}

var (
	serverChart = chart{name: "tether-server", required: []string{
		"domain=tunnels.example.com",
		"jwt.publicKey=-----BEGIN PUBLIC KEY-----",
		"adminToken.existingSecret=tether-admin",
	}}
	clientChart = chart{name: "tether-client", required: []string{
		"server=tunnels.example.com:7000",
		"token.existingSecret=acme-prod-token",
	}}
	charts = []chart{serverChart, clientChart}
)

func (c chart) dir() string { return filepath.Join("helm", c.name) }

// ciValues lists the chart's ci/*-values.yaml files.
func (c chart) ciValues(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(c.dir(), "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no ci/*-values.yaml in %s: %v", c.dir(), err)
	}
	sort.Strings(files)
	return files
}

func (c chart) allOn() string { return filepath.Join(c.dir(), "ci", "all-on-values.yaml") }

// template renders the chart with the given values files (and, when there
// are none, the required values) plus extra --set arguments.
func (c chart) template(t *testing.T, valuesFiles []string, set ...string) (string, error) {
	t.Helper()
	args := []string{"template", "rel", c.dir(), "--namespace", "tether", "--kube-version", kubeVersion}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	if len(valuesFiles) == 0 {
		set = append(append([]string{}, c.required...), set...)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return helm(t, args...)
}

func (c chart) mustTemplate(t *testing.T, valuesFiles []string, set ...string) *manifests {
	t.Helper()
	out, err := c.template(t, valuesFiles, set...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeAll(t, out)
}

// splitDocs splits a multi-document YAML stream, dropping empty documents.
func splitDocs(stream string) []string {
	var docs []string
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(stream))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	flush := func() {
		if doc := cur.String(); strings.TrimSpace(stripComments(doc)) != "" {
			docs = append(docs, doc)
		}
		cur.Reset()
	}
	for sc.Scan() {
		line := sc.Text()
		if line == "---" || strings.HasPrefix(line, "--- ") {
			flush()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return docs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
