package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// testFlags is a command's flag set with one flag of each kind Apply handles.
type testFlags struct {
	fs        *pflag.FlagSet
	config    string
	addr      string
	timeout   time.Duration
	insecure  bool
	retries   int
	route     []string
	tags      []string
	apiToken  string
	hiddenOpt string
}

func newTestFlags() *testFlags {
	t := &testFlags{fs: pflag.NewFlagSet("test", pflag.ContinueOnError)}
	t.fs.SetOutput(new(strings.Builder))
	t.fs.StringVar(&t.config, "config", "", "config file")
	t.fs.StringVar(&t.addr, "tunnel-addr", "0.0.0.0:7000", "address")
	t.fs.DurationVar(&t.timeout, "heartbeat-timeout", 90*time.Second, "timeout")
	t.fs.BoolVar(&t.insecure, "tls-insecure-skip-verify", false, "insecure")
	t.fs.IntVar(&t.retries, "max-retries", 3, "retries")
	t.fs.StringArrayVar(&t.route, "route", []string{"/=http://default:80"}, "routes")
	t.fs.StringSliceVar(&t.tags, "tag", nil, "tags")
	t.fs.StringVar(&t.apiToken, "api-token", "", "a secret")
	t.fs.StringVar(&t.hiddenOpt, "hidden-opt", "", "hidden")
	_ = t.fs.MarkHidden("hidden-opt")
	return t
}

// env returns a lookupEnv over m.
func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// writeFile writes content to a file in a temporary directory and returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tether.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestEnvName(t *testing.T) {
	for _, tc := range []struct{ flag, want string }{
		{"tunnel-addr", "TETHER_TUNNEL_ADDR"},
		{"server", "TETHER_SERVER"},
		{"tls-insecure-skip-verify", "TETHER_TLS_INSECURE_SKIP_VERIFY"},
		{"http2-addr", "TETHER_HTTP2_ADDR"},
		{"a.b_c", "TETHER_A_B_C"},
		{"Mixed", "TETHER_MIXED"},
	} {
		if got := EnvName(tc.flag); got != tc.want {
			t.Errorf("EnvName(%q) = %q, want %q", tc.flag, got, tc.want)
		}
	}
}

func TestApplyPrecedence(t *testing.T) {
	const file = "tunnel-addr: file:1\nheartbeat-timeout: 10s\nroute: [/=http://file:80]\n"
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		file    string
		want    string
		changed bool
	}{
		{name: "default", want: "0.0.0.0:7000"},
		{name: "file over default", file: file, want: "file:1", changed: true},
		{name: "env over file", file: file, env: map[string]string{"TETHER_TUNNEL_ADDR": "env:1"}, want: "env:1", changed: true},
		{
			name: "flag over env and file", file: file, args: []string{"--tunnel-addr=flag:1"},
			env: map[string]string{"TETHER_TUNNEL_ADDR": "env:1"}, want: "flag:1", changed: true,
		},
		{name: "empty env is unset", file: file, env: map[string]string{"TETHER_TUNNEL_ADDR": ""}, want: "file:1", changed: true},
		{name: "null in file is unset", file: "tunnel-addr:\n", want: "0.0.0.0:7000"},
		{name: "empty string in file is a value", file: "tunnel-addr: \"\"\n", want: "", changed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFlags()
			if err := f.fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			if err := Apply(f.fs, path, env(tc.env), "config"); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if f.addr != tc.want {
				t.Errorf("tunnel-addr = %q, want %q", f.addr, tc.want)
			}
			if got := f.fs.Changed("tunnel-addr"); got != tc.changed {
				t.Errorf("Changed(tunnel-addr) = %v, want %v", got, tc.changed)
			}
		})
	}
}

func TestApplyValues(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		file  string
		check func(t *testing.T, f *testFlags)
	}{
		{
			name: "file: every type",
			file: "heartbeat-timeout: 1m30s\ntls-insecure-skip-verify: true\nmax-retries: 7\n" +
				"route:\n  - /=http://a:80\n  - /argo-cd=http://b:80\ntag: [x, \"y,z\"]\napi-token: s3cret\n",
			check: func(t *testing.T, f *testFlags) {
				want(t, "heartbeat-timeout", f.timeout, 90*time.Second)
				want(t, "tls-insecure-skip-verify", f.insecure, true)
				want(t, "max-retries", f.retries, 7)
				want(t, "route", f.route, []string{"/=http://a:80", "/argo-cd=http://b:80"})
				want(t, "tag", f.tags, []string{"x", "y,z"}) // no CSV splitting in the file
				want(t, "api-token", f.apiToken, "s3cret")
			},
		},
		{
			name: "file: scalar for a list is one item",
			file: "route: /=http://only:80\n",
			check: func(t *testing.T, f *testFlags) {
				want(t, "route", f.route, []string{"/=http://only:80"})
			},
		},
		{
			name: "file: empty list replaces the default",
			file: "route: []\n",
			check: func(t *testing.T, f *testFlags) {
				want(t, "route", f.route, []string{})
			},
		},
		{
			name: "file: aliases and hex ints",
			file: "tunnel-addr: &addr 10.0.0.1:7000\ntag: [*addr]\nmax-retries: 0x10\n",
			check: func(t *testing.T, f *testFlags) {
				want(t, "tunnel-addr", f.addr, "10.0.0.1:7000")
				want(t, "tag", f.tags, []string{"10.0.0.1:7000"})
				want(t, "max-retries", f.retries, 16)
			},
		},
		{
			name: "env: every type, lists split on commas",
			env: map[string]string{
				"TETHER_HEARTBEAT_TIMEOUT":        "45s",
				"TETHER_TLS_INSECURE_SKIP_VERIFY": "true",
				"TETHER_MAX_RETRIES":              "9",
				"TETHER_ROUTE":                    "/=http://a:80, /argo-cd=http://b:80",
				"TETHER_TAG":                      "x,y",
			},
			check: func(t *testing.T, f *testFlags) {
				want(t, "heartbeat-timeout", f.timeout, 45*time.Second)
				want(t, "tls-insecure-skip-verify", f.insecure, true)
				want(t, "max-retries", f.retries, 9)
				want(t, "route", f.route, []string{"/=http://a:80", "/argo-cd=http://b:80"})
				want(t, "tag", f.tags, []string{"x", "y"})
			},
		},
		{
			name: "hidden flags can be set",
			file: "hidden-opt: v\n",
			check: func(t *testing.T, f *testFlags) {
				want(t, "hidden-opt", f.hiddenOpt, "v")
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFlags()
			if err := f.fs.Parse(nil); err != nil {
				t.Fatal(err)
			}
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			if err := Apply(f.fs, path, env(tc.env), "config"); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			tc.check(t, f)
		})
	}
}

func want[T any](t *testing.T, name string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %#v, want %#v", name, got, want)
	}
}

func TestApplyListFromCommandLineIsKept(t *testing.T) {
	f := newTestFlags()
	if err := f.fs.Parse([]string{"--route=/=http://cli:80", "--route=/x=http://cli:81"}); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "route: [/=http://file:80]\n")
	if err := Apply(f.fs, path, env(map[string]string{"TETHER_ROUTE": "/=http://env:80"}), "config"); err != nil {
		t.Fatal(err)
	}
	want(t, "route", f.route, []string{"/=http://cli:80", "/x=http://cli:81"})
}

func TestApplyMarksChanged(t *testing.T) {
	f := newTestFlags()
	if err := f.fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "route: [/=http://a:80]\n")
	if err := Apply(f.fs, path, env(map[string]string{"TETHER_MAX_RETRIES": "5"}), "config"); err != nil {
		t.Fatal(err)
	}
	var visited []string
	f.fs.Visit(func(fl *pflag.Flag) { visited = append(visited, fl.Name) })
	slices.Sort(visited)
	want(t, "visited flags", visited, []string{"max-retries", "route"})
	if f.fs.Changed("tunnel-addr") {
		t.Error("tunnel-addr reported changed; nothing set it")
	}
	// The flag's value is the original again, not Apply's wrapper.
	if _, ok := f.fs.Lookup("route").Value.(setFunc); ok {
		t.Error("route still holds Apply's wrapper value")
	}
}

func TestApplySkip(t *testing.T) {
	f := newTestFlags()
	if err := f.fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	err := Apply(f.fs, "", env(map[string]string{"TETHER_CONFIG": "/x.yaml", "TETHER_TUNNEL_ADDR": "e:1"}), "config")
	if err != nil {
		t.Fatal(err)
	}
	want(t, "config", f.config, "")
	want(t, "tunnel-addr", f.addr, "e:1")

	path := writeFile(t, "config: other.yaml\n")
	err = Apply(newTestFlags().fs, path, nil, "config", "no-such-flag")
	wantErr(t, err, path, "line 1", `key "config" cannot be set in a config file`, "--config on the command line")
}

func TestApplyErrors(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		env   map[string]string
		wants [][]string // each inner list is one joined error's fragments
	}{
		{
			name:  "unknown key with suggestion",
			file:  "tunnel-addr: a:1\n\n\nheartbeat-timout: 5s\n",
			wants: [][]string{{"line 4", `unknown key "heartbeat-timout"`, `did you mean "heartbeat-timeout"?`}},
		},
		{
			name:  "unknown key, case and underscores",
			file:  "Tunnel_Addr: a:1\n",
			wants: [][]string{{"line 1", `unknown key "Tunnel_Addr"`, `did you mean "tunnel-addr"?`}},
		},
		{
			name:  "unknown key without suggestion",
			file:  "completely-different: 1\n",
			wants: [][]string{{"line 1", `unknown key "completely-different"`, "long flag names (see --help)"}},
		},
		{
			name:  "hidden flags are not suggested",
			file:  "hidden-op: 1\n",
			wants: [][]string{{`unknown key "hidden-op"; keys are`}},
		},
		{
			name:  "invalid duration",
			file:  "tunnel-addr: a:1\n\n\n\nheartbeat-timeout: abc\n",
			wants: [][]string{{"line 5", `key "heartbeat-timeout": invalid value "abc": must be a duration`}},
		},
		{
			name:  "invalid bool and int",
			file:  "tls-insecure-skip-verify: yes please\nmax-retries: 1.5\n",
			wants: [][]string{{"line 1", `"tls-insecure-skip-verify": invalid value "yes please"`, "must be true or false"}, {"line 2", `"max-retries": invalid value "1.5": must be an integer`}},
		},
		{
			name:  "list for a scalar",
			file:  "tunnel-addr:\n  - a:1\n  - b:2\n",
			wants: [][]string{{"line 2", `key "tunnel-addr": got a list; want a single string value`}},
		},
		{
			name:  "map for a scalar",
			file:  "heartbeat-timeout: {seconds: 3}\n",
			wants: [][]string{{"line 1", `key "heartbeat-timeout": got a map; want a single duration value`}},
		},
		{
			name:  "map for a list",
			file:  "route: {a: b}\n",
			wants: [][]string{{"line 1", `key "route": got a map; want a list`}},
		},
		{
			name:  "nested list item",
			file:  "route:\n  - /=http://a:80\n  - [x, y]\n",
			wants: [][]string{{"line 3", `key "route": item 2 is a list`}},
		},
		{
			name:  "empty list item",
			file:  "route:\n  - /=http://a:80\n  -\n",
			wants: [][]string{{`key "route": item 2 is empty`}},
		},
		{
			name:  "duplicate key",
			file:  "tunnel-addr: a:1\ntunnel-addr: b:2\n",
			wants: [][]string{{"line 2", `key "tunnel-addr" is already set on line 1`}},
		},
		{
			name:  "top level list",
			file:  "- tunnel-addr: a:1\n",
			wants: [][]string{{"line 1", "got a list at the top level; want a map of flag names to values"}},
		},
		{
			name:  "top level scalar",
			file:  "tunnel-addr\n",
			wants: [][]string{{"line 1", "got a single value at the top level"}},
		},
		{
			name:  "syntax error",
			file:  "tunnel-addr: a:1\n  bad: indent\n",
			wants: [][]string{{"yaml: line 2", "fix the YAML syntax"}},
		},
		{
			name:  "two documents",
			file:  "tunnel-addr: a:1\n---\nmax-retries: 2\n",
			wants: [][]string{{"a second YAML document"}},
		},
		{
			name:  "merge key",
			file:  "base: &b {max-retries: 2}\n<<: *b\n",
			wants: [][]string{{`unknown key "base"`}, {"line 2", "merge keys (<<) are not supported"}},
		},
		{
			name:  "non-scalar key",
			file:  "? [a, b]\n: c\n",
			wants: [][]string{{"line 1", "got a list as a key; want a flag name"}},
		},
		{
			name: "invalid env values",
			env: map[string]string{
				"TETHER_HEARTBEAT_TIMEOUT": "abc",
				"TETHER_MAX_RETRIES":       "many",
			},
			wants: [][]string{
				{`environment variable TETHER_HEARTBEAT_TIMEOUT: invalid value "abc" for --heartbeat-timeout: must be a duration`},
				{`environment variable TETHER_MAX_RETRIES: invalid value "many" for --max-retries: must be an integer`},
			},
		},
		{
			name: "all problems are reported, env and file together",
			env:  map[string]string{"TETHER_HEARTBEAT_TIMEOUT": "abc"},
			file: "tunel-addr: a\nmax-retries: x\nroute: {}\n",
			wants: [][]string{
				{"TETHER_HEARTBEAT_TIMEOUT"},
				{"line 1", `did you mean "tunnel-addr"?`},
				{"line 2", `"max-retries"`},
				{"line 3", `"route": got a map`},
			},
		},
		{
			name:  "shape is checked even when the env overrides the key",
			env:   map[string]string{"TETHER_TUNNEL_ADDR": "e:1"},
			file:  "tunnel-addr: [a, b]\n",
			wants: [][]string{{`key "tunnel-addr": got a list`}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFlags()
			if err := f.fs.Parse(nil); err != nil {
				t.Fatal(err)
			}
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			err := Apply(f.fs, path, env(tc.env), "config")
			if err == nil {
				t.Fatal("Apply succeeded, want an error")
			}
			errs := unjoin(err)
			if len(errs) != len(tc.wants) {
				t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(tc.wants), err)
			}
			for i, frags := range tc.wants {
				if path != "" && !strings.HasPrefix(errs[i].Error(), "environment variable") {
					frags = append(frags, "config file "+path)
				}
				wantErr(t, errs[i], frags...)
			}
		})
	}
}

// unjoin returns the errors an errors.Join holds, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func wantErr(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", fragments)
	}
	for _, frag := range fragments {
		if !strings.Contains(err.Error(), frag) {
			t.Errorf("error %q does not contain %q", err, frag)
		}
	}
}

func TestApplyValidValuesStillApplyBesideErrors(t *testing.T) {
	f := newTestFlags()
	if err := f.fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "tunnel-addr: good:1\nmax-retries: bad\n")
	if err := Apply(f.fs, path, nil, "config"); err == nil {
		t.Fatal("Apply succeeded, want an error")
	}
	want(t, "tunnel-addr", f.addr, "good:1")
}

// echoValue is a flag value whose parse error quotes the value, as many do.
type echoValue struct{}

func (echoValue) String() string     { return "" }
func (echoValue) Type() string       { return "echo" }
func (echoValue) Set(s string) error { return fmt.Errorf("bad value %q", s) }

func TestApplySecretsNeverEchoed(t *testing.T) {
	const secret = "hunter2-XYZZY"
	tests := []struct {
		name string
		def  func(fs *pflag.FlagSet)
		env  map[string]string
		file string
		want []string
	}{
		{
			name: "own error quoting the value, env",
			def:  func(fs *pflag.FlagSet) { fs.Var(echoValue{}, "api-token", "") },
			env:  map[string]string{"TETHER_API_TOKEN": secret},
			want: []string{"TETHER_API_TOKEN: invalid value (hidden: secret) for --api-token: the value does not parse"},
		},
		{
			name: "own error quoting the value, file",
			def:  func(fs *pflag.FlagSet) { fs.Var(echoValue{}, "db-password", "") },
			file: "db-password: " + secret + "\n",
			want: []string{`key "db-password": invalid value (hidden: secret): the value does not parse`},
		},
		{
			name: "strconv error in a list",
			def:  func(fs *pflag.FlagSet) { fs.IntSlice("pin-secret", nil, "") },
			file: "pin-secret: [1, " + secret + "]\n",
			want: []string{`key "pin-secret": invalid value (hidden: secret): invalid syntax`},
		},
		{
			name: "error without the value is kept",
			def:  func(fs *pflag.FlagSet) { fs.Int("secret", 0, "") },
			env:  map[string]string{"TETHER_SECRET": secret},
			want: []string{"for --secret: must be an integer"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			tc.def(fs)
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			err := Apply(fs, path, env(tc.env))
			wantErr(t, err, tc.want...)
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("error %q echoes the secret", err)
			}
		})
	}
}

func TestApplyFileErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		source string
	}{
		{name: "from the flag", args: []string{"--config", missing}, source: "(from --config)"},
		{name: "from the environment", env: map[string]string{"TETHER_CONFIG": missing}, source: "(from TETHER_CONFIG)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFlags()
			if err := f.fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			path := Path(f.fs, "config", env(tc.env))
			if path != missing {
				t.Fatalf("Path = %q, want %q", path, missing)
			}
			err := Apply(f.fs, path, env(tc.env), "config")
			wantErr(t, err, "config file "+missing+" "+tc.source, "no such file", "check the path")
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("errors.Is(%v, fs.ErrNotExist) = false, want true", err)
			}
		})
	}
}

func TestApplyEmptyFiles(t *testing.T) {
	for _, content := range []string{"", "\n", "# only a comment\n", "---\n", "~\n", "null\n"} {
		f := newTestFlags()
		if err := Apply(f.fs, writeFile(t, content), nil, "config"); err != nil {
			t.Errorf("Apply(%q): %v", content, err)
		}
	}
}

func TestPath(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.String("config", "/etc/tether/default.yaml", "")
	if got := Path(fs, "config", nil); got != "/etc/tether/default.yaml" {
		t.Errorf("default: got %q", got)
	}
	e := env(map[string]string{"TETHER_CONFIG": "/env.yaml"})
	if got := Path(fs, "config", e); got != "/env.yaml" {
		t.Errorf("env: got %q, want /env.yaml", got)
	}
	if err := fs.Parse([]string{"--config=/flag.yaml"}); err != nil {
		t.Fatal(err)
	}
	if got := Path(fs, "config", e); got != "/flag.yaml" {
		t.Errorf("flag: got %q, want /flag.yaml", got)
	}
	if got := Path(fs, "no-such", e); got != "" {
		t.Errorf("missing flag: got %q, want empty", got)
	}
}

func TestSuggestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "abc", 0}, {"abc", "abd", 1}, {"abc", "ab", 1},
		{"heartbeat-timout", "heartbeat-timeout", 1}, {"kitten", "sitting", 3}, {"a", "abcdef", 3},
	} {
		if got := distance(tc.a, tc.b, 3); got != tc.want {
			t.Errorf("distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
