package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// EnvPrefix starts the name of every environment variable that sets a flag.
const EnvPrefix = "TETHER_"

// Apply fills every flag of fs that was not set on the command line: first from
// the environment, then from the YAML file at path (skipped when path is "").
// lookupEnv is os.LookupEnv in production (injectable for tests; nil reads no
// environment). Flags named in skip (e.g. "config", "help", "version") are never
// read from the environment or the file, and the file may not name them.
//
// Values are applied with fs.Set, so flags filled by Apply report Changed like
// flags given on the command line. Apply reports every problem it finds, joined
// with errors.Join; flags whose values were valid are applied even then.
func Apply(fs *pflag.FlagSet, path string, lookupEnv func(string) (string, bool), skip ...string) error {
	if lookupEnv == nil {
		lookupEnv = func(string) (string, bool) { return "", false }
	}
	a := &applier{
		fs:      fs,
		skip:    make(map[string]bool, len(skip)),
		claimed: make(map[string]bool),
	}
	for _, name := range skip {
		if f := fs.Lookup(name); f != nil {
			a.skip[f.Name] = true
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			a.claimed[f.Name] = true
		}
	})

	errs := a.applyEnv(lookupEnv)
	if path != "" {
		errs = append(errs, a.applyFile(path, pathSource(fs, path, lookupEnv, skip))...)
	}
	return errors.Join(errs...)
}

// EnvName returns the environment variable for a flag name:
// "tunnel-addr" -> "TETHER_TUNNEL_ADDR". Letters are upper-cased, digits kept,
// and every other character becomes an underscore.
func EnvName(flag string) string {
	var b strings.Builder
	b.Grow(len(EnvPrefix) + len(flag))
	b.WriteString(EnvPrefix)
	for _, r := range flag {
		switch {
		case r >= 'a' && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Path returns the config file a command should read: the value of the flag
// called name when it was set on the command line, else the environment
// variable EnvName(name) when it is set and not empty, else the flag's default.
// It returns "" when fs has no such flag. lookupEnv may be nil.
func Path(fs *pflag.FlagSet, name string, lookupEnv func(string) (string, bool)) string {
	f := fs.Lookup(name)
	if f == nil {
		return ""
	}
	if !f.Changed && lookupEnv != nil {
		if v, ok := lookupEnv(EnvName(f.Name)); ok && v != "" {
			return v
		}
	}
	return f.Value.String()
}

// applier carries the state of one Apply call.
type applier struct {
	fs   *pflag.FlagSet
	skip map[string]bool
	// claimed holds the flags a higher-precedence source has already set
	// (or tried to set): the command line, then the environment.
	claimed map[string]bool
}

func (a *applier) applyEnv(lookupEnv func(string) (string, bool)) []error {
	var errs []error
	a.fs.VisitAll(func(f *pflag.Flag) {
		if a.skip[f.Name] || a.claimed[f.Name] {
			return
		}
		env := EnvName(f.Name)
		v, ok := lookupEnv(env)
		if !ok || v == "" {
			return
		}
		a.claimed[f.Name] = true
		var err error
		if isList(f) {
			err = setList(a.fs, f, splitList(v))
		} else {
			err = setScalar(a.fs, f, v)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s: %s for --%s: %w",
				env, invalidValue(f, v), f.Name, hideSecret(f, err, v)))
		}
	})
	return errs
}

// splitList splits an environment value on commas, trimming spaces around
// each item.
func splitList(v string) []string {
	items := strings.Split(v, ",")
	for i := range items {
		items[i] = strings.TrimSpace(items[i])
	}
	return items
}

// pathSource says which flag or variable named the config file, for errors.
func pathSource(fs *pflag.FlagSet, path string, lookupEnv func(string) (string, bool), skip []string) string {
	for _, name := range skip {
		if f := fs.Lookup(name); f != nil && f.Changed && f.Value.String() == path {
			return " (from --" + f.Name + ")"
		}
	}
	for _, name := range skip {
		if v, ok := lookupEnv(EnvName(name)); ok && v == path {
			return " (from " + EnvName(name) + ")"
		}
	}
	for _, name := range skip {
		if f := fs.Lookup(name); f != nil && f.DefValue == path {
			return " (the default of --" + f.Name + ")"
		}
	}
	return ""
}

// isList reports whether f takes a list of values.
func isList(f *pflag.Flag) bool {
	_, ok := f.Value.(pflag.SliceValue)
	return ok
}

func setScalar(fs *pflag.FlagSet, f *pflag.Flag, value string) error {
	v := f.Value
	return setVia(fs, f, func() error { return v.Set(value) })
}

// setList replaces the whole list: a list from the environment or the file
// stands for the flag's value, it does not add to the default.
func setList(fs *pflag.FlagSet, f *pflag.Flag, items []string) error {
	sv := f.Value.(pflag.SliceValue)
	return setVia(fs, f, func() error { return sv.Replace(items) })
}

// setVia runs apply in place of the flag's Set inside fs.Set. pflag offers no
// other way to mark a flag changed: fs.Set records it in the set of actual
// flags (fs.Visit) and sets Flag.Changed (fs.Changed, cobra's required-flag
// and flag-group checks). Going through a wrapper also lets a list be replaced
// whole, without Set's CSV splitting, and returns apply's own error, because
// fs.Set's error quotes the value, which must not happen for a secret.
func setVia(fs *pflag.FlagSet, f *pflag.Flag, apply func() error) error {
	orig := f.Value
	var applyErr error
	f.Value = setFunc{Value: orig, set: func(string) error {
		applyErr = apply()
		return applyErr
	}}
	defer func() { f.Value = orig }()
	if err := fs.Set(f.Name, ""); err != nil && applyErr == nil {
		return err
	}
	return applyErr
}

// setFunc is a pflag.Value whose Set calls set; everything else is Value's.
type setFunc struct {
	pflag.Value
	set func(string) error
}

func (s setFunc) Set(v string) error { return s.set(v) }

// isSecret reports whether the flag's value must never appear in a message.
func isSecret(name string) bool {
	for _, s := range []string{"token", "secret", "password"} {
		if name == s || strings.HasSuffix(name, "-"+s) {
			return true
		}
	}
	return false
}

// invalidValue is `invalid value "v"`, or `invalid value (hidden)` for a secret.
func invalidValue(f *pflag.Flag, v string) string {
	if isSecret(f.Name) {
		return "invalid value (hidden: secret)"
	}
	return fmt.Sprintf("invalid value %q", v)
}

// invalidList is invalidValue for a list.
func invalidList(f *pflag.Flag, items []string) string {
	if isSecret(f.Name) {
		return "invalid value (hidden: secret)"
	}
	return fmt.Sprintf("invalid value %q", items)
}

// errHidden replaces a parse error of a secret flag whose text might quote it.
var errHidden = errors.New("the value does not parse")

// hideSecret keeps err for ordinary flags. For a secret flag it keeps err only
// when its text quotes none of values; strconv's errors lose their quote.
func hideSecret(f *pflag.Flag, err error, values ...string) error {
	if !isSecret(f.Name) {
		return err
	}
	if ne, ok := errors.AsType[*strconv.NumError](err); ok {
		return ne.Err
	}
	for _, v := range values {
		if v != "" && strings.Contains(err.Error(), v) {
			return errHidden
		}
	}
	return err
}
