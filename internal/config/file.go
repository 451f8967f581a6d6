package config

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// applyFile reads the YAML file at path and applies it; source says which flag
// or variable named the file.
func (a *applier) applyFile(path, source string) []error {
	data, err := os.ReadFile(path)
	if err != nil {
		return []error{fmt.Errorf("config file %s%s: %w; check the path and its permissions", path, source, err)}
	}
	return a.applyYAML(path, data)
}

// applyYAML applies the document in data; path is used only in errors.
func (a *applier) applyYAML(path string, data []byte) []error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file, or one with only comments
		}
		return []error{fmt.Errorf("config file %s: %w; fix the YAML syntax", path, err)}
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return []error{fmt.Errorf("config file %s: %w; fix the YAML syntax", path, err)}
	default:
		return []error{fmt.Errorf("config file %s line %d: a second YAML document; keep one document per file (remove the ---)",
			path, next.Line)}
	}

	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil
		}
		root = root.Content[0]
	}
	root = resolve(root)
	if isNull(root) {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		return []error{fmt.Errorf("config file %s line %d: got %s at the top level; want a map of flag names to values, one \"key: value\" per line",
			path, root.Line, kindName(root))}
	}

	var errs []error
	seen := make(map[string]int)
	for i := 0; i+1 < len(root.Content); i += 2 {
		if err := a.applyKey(path, root.Content[i], resolve(root.Content[i+1]), seen); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// applyKey checks one key of the top-level map and applies its value.
func (a *applier) applyKey(path string, k, v *yaml.Node, seen map[string]int) error {
	if k.Kind != yaml.ScalarNode {
		return fmt.Errorf("config file %s line %d: got %s as a key; want a flag name", path, k.Line, kindName(k))
	}
	key := k.Value
	if k.ShortTag() == "!!merge" {
		return fmt.Errorf("config file %s line %d: merge keys (<<) are not supported; write each key out", path, k.Line)
	}
	if line, dup := seen[key]; dup {
		return fmt.Errorf("config file %s line %d: key %q is already set on line %d; keep one of them", path, k.Line, key, line)
	}
	seen[key] = k.Line

	f := a.fs.Lookup(key)
	if f == nil {
		if s := a.suggest(key); s != "" {
			return fmt.Errorf("config file %s line %d: unknown key %q; did you mean %q?", path, k.Line, key, s)
		}
		return fmt.Errorf("config file %s line %d: unknown key %q; keys are the command's long flag names (see --help)",
			path, k.Line, key)
	}
	if a.skip[f.Name] {
		return fmt.Errorf("config file %s line %d: key %q cannot be set in a config file; give --%s on the command line",
			path, k.Line, key, f.Name)
	}
	return a.applyValue(path, key, f, v)
}

// applyValue checks the shape of v against f and, unless a higher-precedence
// source already set f, applies it. The shape is checked even then, so that a
// file stays valid when the override goes away.
func (a *applier) applyValue(path, key string, f *pflag.Flag, v *yaml.Node) error {
	list := isList(f)
	var items []string
	switch v.Kind {
	case yaml.ScalarNode:
		if isNull(v) {
			return nil // "key:" with no value leaves the flag to its default
		}
		s, err := scalarValue(v)
		if err != nil {
			return fmt.Errorf("config file %s line %d: key %q: %w", path, v.Line, key, err)
		}
		items = []string{s}
	case yaml.SequenceNode:
		if !list {
			return fmt.Errorf("config file %s line %d: key %q: got a list; want a single %s value (key: value)",
				path, v.Line, key, f.Value.Type())
		}
		items = make([]string, 0, len(v.Content))
		for i, item := range v.Content {
			item = resolve(item)
			if item.Kind != yaml.ScalarNode || isNull(item) {
				return fmt.Errorf("config file %s line %d: key %q: item %d is %s; want a single value per item",
					path, item.Line, key, i+1, kindName(item))
			}
			s, err := scalarValue(item)
			if err != nil {
				return fmt.Errorf("config file %s line %d: key %q: item %d: %w", path, item.Line, key, i+1, err)
			}
			items = append(items, s)
		}
	default:
		want := fmt.Sprintf("a single %s value (key: value)", f.Value.Type())
		if list {
			want = "a list (key: [a, b]) or a single value"
		}
		return fmt.Errorf("config file %s line %d: key %q: got %s; want %s", path, v.Line, key, kindName(v), want)
	}

	if a.claimed[f.Name] {
		return nil
	}
	a.claimed[f.Name] = true
	if list {
		if err := setList(a.fs, f, items); err != nil {
			return fmt.Errorf("config file %s line %d: key %q: %s: %w",
				path, v.Line, key, invalidList(f, items), hideSecret(f, err, items...))
		}
		return nil
	}
	if err := setScalar(a.fs, f, items[0]); err != nil {
		return fmt.Errorf("config file %s line %d: key %q: %s: %w",
			path, v.Line, key, invalidValue(f, items[0]), hideSecret(f, err, items[0]))
	}
	return nil
}

// scalarValue is the text of a scalar as the command line would carry it:
// its source text, so 0x10, 1e3 and 30s reach the flag's parser unchanged,
// except that !!binary is base64-decoded, as YAML defines.
func scalarValue(n *yaml.Node) (string, error) {
	if n.ShortTag() != "!!binary" {
		return n.Value, nil
	}
	b, err := base64.StdEncoding.DecodeString(n.Value)
	if err != nil {
		return "", fmt.Errorf("!!binary value is not base64: %w", err)
	}
	return string(b), nil
}

// resolve follows an alias (*name) to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// kindName names a node's kind for messages: "a list", "a map", ...
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a map"
	case yaml.ScalarNode:
		if isNull(n) {
			return "empty"
		}
		return "a single value"
	case yaml.AliasNode:
		return "an unresolved alias"
	}
	return "a YAML document"
}
