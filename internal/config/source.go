package config

import (
	"github.com/spf13/pflag"
)

// Sources says where each flag's value came from. Take it with NewSources
// before Apply fills the flags, since afterwards flags from the environment
// and the file look as if given on the command line.
type Sources struct {
	cmdline   map[string]bool
	path      string
	lookupEnv func(string) (string, bool)
}

// NewSources records which flags of fs the command line set. path is the
// config file Apply will read ("" for none); lookupEnv may be nil.
func NewSources(fs *pflag.FlagSet, path string, lookupEnv func(string) (string, bool)) *Sources {
	s := &Sources{cmdline: make(map[string]bool), path: path, lookupEnv: lookupEnv}
	fs.Visit(func(f *pflag.Flag) { s.cmdline[f.Name] = true })
	return s
}

// Of names the source of f's value after Apply: "flag --name",
// "env TETHER_NAME", "file PATH" or "default". The precedence is Apply's.
func (s *Sources) Of(f *pflag.Flag) string {
	switch {
	case s.cmdline[f.Name]:
		return "flag --" + f.Name
	case !f.Changed:
		return "default"
	}
	if s.lookupEnv != nil {
		if v, ok := s.lookupEnv(EnvName(f.Name)); ok && v != "" {
			return "env " + EnvName(f.Name)
		}
	}
	return "file " + s.path
}

// IsSecret reports whether a flag's value must never be shown: names ending
// in token, secret or password.
func IsSecret(name string) bool { return isSecret(name) }
