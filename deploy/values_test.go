package deploy

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"
)

// leaf is one documented value of a chart: a scalar, a list, an empty map,
// or a map documented as a whole.
type leaf struct {
	path    []string
	value   any
	comment string
}

func (l leaf) String() string { return strings.Join(l.path, ".") }

// valueLeaves walks values.yaml and returns its leaves with their comments.
func valueLeaves(t *testing.T, file string) []leaf {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var leaves []leaf
	var walk func(n *yaml.Node, path []string)
	walk = func(n *yaml.Node, path []string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := append(append([]string{}, path...), k.Value)
			// A map with its own "# --" comment is one value (resources,
			// strategy); other maps only group their keys.
			if v.Kind == yaml.MappingNode && len(v.Content) > 0 && !strings.HasPrefix(k.HeadComment, "# --") {
				walk(v, p)
				continue
			}
			var val any
			if err := v.Decode(&val); err != nil {
				t.Fatalf("%s: %s: %v", file, strings.Join(p, "."), err)
			}
			leaves = append(leaves, leaf{path: p, value: val, comment: k.HeadComment})
		}
	}
	walk(doc.Content[0], nil)
	return leaves
}

func readValues(t *testing.T, file string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return m
}

// lookupPath returns the value at path, and whether every step exists.
func lookupPath(m map[string]any, path []string) (any, bool) {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = mm[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func setPath(m map[string]any, path []string, v any) {
	for _, p := range path[:len(path)-1] {
		m = m[p].(map[string]any)
	}
	m[path[len(path)-1]] = v
}

// TestValuesDocumented: every value in values.yaml has a comment.
func TestValuesDocumented(t *testing.T) {
	for _, c := range charts {
		for _, l := range valueLeaves(t, filepath.Join(c.dir(), "values.yaml")) {
			if !strings.HasPrefix(strings.TrimSpace(l.comment), "# --") {
				t.Errorf("%s: value %s has no '# -- ' comment above it", c.name, l)
			}
		}
	}
}

// TestValuesExercised: every value in values.yaml is set in the chart's
// all-on values file, and changing it changes the render in at least one
// ci/*-values.yaml file (to the default, or for a boolean left at its
// default, to the opposite).
func TestValuesExercised(t *testing.T) {
	for _, c := range charts {
		t.Run(c.name, func(t *testing.T) {
			allOn := readValues(t, c.allOn())
			files := c.ciValues(t)
			var mu sync.Mutex
			baselines := map[string]string{}
			baseline := func(t *testing.T, f string) string {
				mu.Lock()
				defer mu.Unlock()
				if out, ok := baselines[f]; ok {
					return out
				}
				out, err := c.template(t, []string{f})
				if err != nil {
					t.Fatal(err)
				}
				baselines[f] = out
				return out
			}
			for _, l := range valueLeaves(t, filepath.Join(c.dir(), "values.yaml")) {
				if _, ok := lookupPath(allOn, l.path); !ok {
					t.Errorf("%s is not set in %s", l, c.allOn())
					continue
				}
				t.Run(l.String(), func(t *testing.T) {
					t.Parallel()
					var tried []string
					for _, f := range files {
						vals := readValues(t, f)
						got, ok := lookupPath(vals, l.path)
						if !ok {
							continue
						}
						alt := l.value
						if reflect.DeepEqual(got, l.value) {
							b, isBool := got.(bool)
							if !isBool {
								continue
							}
							alt = !b
						}
						tried = append(tried, filepath.Base(f))
						setPath(vals, l.path, alt)
						data, err := yaml.Marshal(vals)
						if err != nil {
							t.Fatal(err)
						}
						changed := filepath.Join(t.TempDir(), "values.yaml")
						if err := os.WriteFile(changed, data, 0o600); err != nil {
							t.Fatal(err)
						}
						out, err := c.template(t, []string{changed})
						if err != nil || out != baseline(t, f) {
							return // the value matters (a required one makes the render fail)
						}
					}
					t.Errorf("changing %s leaves the render unchanged in every ci values file that sets it (%v): "+
						"set it to a value that shows in some ci/*-values.yaml", l, tried)
				})
			}
		})
	}
}
