// Package deptest pins tether's architecture: which package may import
// what. It has only tests.
package deptest

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/tether-dev/tether"

type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found %d packages; the test is not looking at the module", len(pkgs))
	}
	return pkgs
}

func rel(p pkg) string { return strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/") }

// TestLayering: data flows cmd -> tunnel -> auth/proxy; frp stays behind
// tunnel/ and auth's plugin adapter; nothing imports cmd/; only test helpers
// import testing.
func TestLayering(t *testing.T) {
	for _, p := range listPackages(t) {
		dir := rel(p)
		for _, imp := range p.Imports {
			frp := strings.HasPrefix(imp, "github.com/fatedier/")
			switch {
			case strings.HasPrefix(imp, module+"/cmd"):
				t.Errorf("%s imports %s: nothing imports cmd/", dir, imp)
			case frp && (strings.HasPrefix(dir, "proxy") || strings.HasPrefix(dir, "internal") || strings.HasPrefix(dir, "diagnose")):
				t.Errorf("%s imports %s: proxy/, internal/ and diagnose/ never import frp", dir, imp)
			case dir == "diagnose" && strings.HasPrefix(imp, module+"/tunnel/server"):
				t.Errorf("%s imports %s: diagnose sees the server only as a client does", dir, imp)
			case frp && strings.HasPrefix(dir, "cmd"):
				t.Errorf("%s imports %s: commands reach frp only through tunnel/", dir, imp)
			case imp == "testing" && dir != "internal/testutil":
				t.Errorf("%s imports testing outside its tests", dir)
			case strings.HasPrefix(imp, module+"/tunnel") && (strings.HasPrefix(dir, "auth") || strings.HasPrefix(dir, "proxy")):
				t.Errorf("%s imports %s: auth/ and proxy/ sit below tunnel/", dir, imp)
			}
		}
	}
}

// TestFRPInAuthOnlyInThePluginAdapter keeps the verifier free of frp, so
// that it can be tested and fuzzed on its own.
func TestFRPInAuthOnlyInThePluginAdapter(t *testing.T) {
	for _, p := range listPackages(t) {
		if rel(p) != "auth" {
			continue
		}
		fset := token.NewFileSet()
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(path, "github.com/fatedier/") && name != "plugin.go" {
					t.Errorf("auth/%s imports %s: only plugin.go may", name, path)
				}
			}
		}
		return
	}
	t.Fatal("package auth not found")
}

// TestGateStandsAlone keeps the tunnel port (tunnel/server/gate) below the
// rest of the server: it reaches it only through its Host and Observer
// interfaces. It imports neither the server, the registry, the HTTP router
// (proxy), Prometheus nor an HTTP reverse proxy; the server, the registry
// and the router not even through another package.
func TestGateStandsAlone(t *testing.T) {
	const gate = module + "/tunnel/server/gate"
	banned := func(imp string) bool {
		return imp == module+"/tunnel/server" || strings.HasPrefix(imp, module+"/tunnel/server/") && imp != gate ||
			imp == module+"/proxy" || strings.HasPrefix(imp, module+"/proxy/") ||
			strings.HasPrefix(imp, "github.com/prometheus/") || imp == "net/http/httputil"
	}
	for _, p := range listPackages(t) {
		if p.ImportPath != gate {
			continue
		}
		for _, imp := range p.Imports {
			if banned(imp) {
				t.Errorf("tunnel/server/gate imports %s: the gate reaches the server only through gate.Host and gate.Observer", imp)
			}
		}
		for _, dep := range p.Deps {
			if strings.HasPrefix(dep, module+"/") && banned(dep) && !slices.Contains(p.Imports, dep) {
				t.Errorf("tunnel/server/gate depends on %s through another package: the gate sits below the server", dep)
			}
		}
		return
	}
	t.Fatal("package tunnel/server/gate not found")
}
