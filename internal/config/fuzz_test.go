package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// FuzzApply feeds arbitrary YAML to Apply. Apply must never panic, every error
// must name the file, and a file that applies cleanly must be stable: writing
// the resulting values back out as YAML and applying that to fresh flags gives
// the same values and the same changed flags (decode -> apply -> encode ->
// decode -> apply). Seeds are the YAML files in testdata/.
func FuzzApply(f *testing.F) {
	seeds, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, path := range seeds {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("route: /=http://a:80\ntag: \"a,b\"\n"))
	f.Add([]byte("tunnel-addr: \"\\xff\\u0085\"\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "first.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		first := newTestFlags()
		if err := Apply(first.fs, path, nil, "config"); err != nil {
			if !strings.Contains(err.Error(), "config file "+path) {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}

		out, err := yaml.Marshal(snapshot(first.fs, true))
		if err != nil {
			t.Fatalf("encode applied values: %v", err)
		}
		path2 := filepath.Join(dir, "second.yaml")
		if err := os.WriteFile(path2, out, 0o600); err != nil {
			t.Fatal(err)
		}
		second := newTestFlags()
		if err := Apply(second.fs, path2, nil, "config"); err != nil {
			t.Fatalf("re-applying the encoded values: %v\ninput:\n%s\nencoded:\n%s", err, data, out)
		}
		if got, want := snapshot(second.fs, false), snapshot(first.fs, false); !reflect.DeepEqual(got, want) {
			t.Fatalf("values differ after a round trip:\ngot  %#v\nwant %#v\nencoded:\n%s", got, want, out)
		}
		if got, want := snapshot(second.fs, true), snapshot(first.fs, true); len(got) != len(want) {
			t.Fatalf("changed flags differ after a round trip: got %v, want %v", got, want)
		}
	})
}

// snapshot returns the value of every flag of fs, or only of the changed ones:
// lists as []string, everything else as its String form, which the flag's
// own Set parses back.
func snapshot(fs *pflag.FlagSet, changedOnly bool) map[string]any {
	m := make(map[string]any)
	fs.VisitAll(func(f *pflag.Flag) {
		if changedOnly && !f.Changed {
			return
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			m[f.Name] = sv.GetSlice()
			return
		}
		m[f.Name] = f.Value.String()
	})
	return m
}
