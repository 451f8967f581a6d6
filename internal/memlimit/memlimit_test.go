package memlimit

import (
	"math"
	"runtime/debug"
	"strings"
	"testing"
	"testing/fstest"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestResolve(t *testing.T) {
	v2 := fstest.MapFS{
		"proc/self/cgroup":                           {Data: []byte("0::/kubepods/pod1/ctr\n")},
		"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": {Data: []byte("67108864\n")},
	}
	v2Root := fstest.MapFS{ // a cgroup namespace: the container's cgroup is the root
		"proc/self/cgroup":         {Data: []byte("0::/\n")},
		"sys/fs/cgroup/memory.max": {Data: []byte("134217728\n")},
	}
	v2Max := fstest.MapFS{
		"proc/self/cgroup":         {Data: []byte("0::/\n")},
		"sys/fs/cgroup/memory.max": {Data: []byte("max\n")},
	}
	v1 := fstest.MapFS{
		"proc/self/cgroup": {Data: []byte("4:memory:/docker/abc\n3:cpuset:/\n0::/\n")},
		"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": {Data: []byte("268435456\n")},
	}
	v1Unlimited := fstest.MapFS{
		"proc/self/cgroup":                           {Data: []byte("4:cpuacct,memory:/\n")},
		"sys/fs/cgroup/memory/memory.limit_in_bytes": {Data: []byte("9223372036854771712\n")},
	}
	for _, tc := range []struct {
		name       string
		value      string
		env        map[string]string
		root       fstest.MapFS
		want       int64
		wantSource string
	}{
		{"flag", "64MiB", nil, v2, 64 << 20, "--memory-limit"},
		{"flag over GOMEMLIMIT", "1GiB", map[string]string{"GOMEMLIMIT": "100MiB"}, v2, 1 << 30, "--memory-limit"},
		{"none", "none", nil, v2, 0, "--memory-limit none"},
		{"cgroup v2", "", nil, v2, 67108864 * 9 / 10, "/sys/fs/cgroup/kubepods/pod1/ctr/memory.max"},
		{"cgroup v2 namespace", "", nil, v2Root, 134217728 * 9 / 10, "/sys/fs/cgroup/memory.max"},
		{"cgroup v2 max", "", nil, v2Max, 0, "no container memory limit"},
		{"cgroup v1", "", nil, v1, 268435456 * 9 / 10, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"},
		{"cgroup v1 unlimited", "", nil, v1Unlimited, 0, "no container memory limit"},
		{"no cgroup", "", nil, fstest.MapFS{}, 0, "no container memory limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(tc.value, env(tc.env), tc.root)
			if err != nil {
				t.Fatal(err)
			}
			if got.Bytes != tc.want || !strings.Contains(got.Source, tc.wantSource) {
				t.Errorf("Resolve(%q) = %d bytes from %q, want %d from %q", tc.value, got.Bytes, got.Source, tc.want, tc.wantSource)
			}
		})
	}
}

// GOMEMLIMIT is the runtime's own: Resolve reports it, Apply leaves it.
func TestResolveGOMEMLIMIT(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	debug.SetMemoryLimit(100 << 20) // what the runtime made of GOMEMLIMIT=100MiB
	got, err := Resolve("", env(map[string]string{"GOMEMLIMIT": "100MiB"}), fstest.MapFS{})
	if err != nil || got.Bytes != 100<<20 || got.Source != "GOMEMLIMIT" {
		t.Fatalf("Resolve = %+v, %v; want 100MiB from GOMEMLIMIT", got, err)
	}
	Apply(got)
	if l := debug.SetMemoryLimit(-1); l != 100<<20 {
		t.Errorf("limit after Apply = %d, want GOMEMLIMIT's %d", l, 100<<20)
	}

	debug.SetMemoryLimit(math.MaxInt64) // what the runtime made of GOMEMLIMIT=off
	got, err = Resolve("", env(map[string]string{"GOMEMLIMIT": "off"}), fstest.MapFS{})
	if err != nil || got.Bytes != 0 || got.String() != "none (GOMEMLIMIT)" {
		t.Errorf("Resolve with GOMEMLIMIT=off = %+v (%s), %v; want none from GOMEMLIMIT", got, got, err)
	}
}

func TestApply(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	Apply(Limit{Bytes: 64 << 20, Source: "--memory-limit"})
	if l := debug.SetMemoryLimit(-1); l != 64<<20 {
		t.Errorf("limit = %d, want %d", l, 64<<20)
	}
	Apply(Limit{Source: "none"})
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		t.Errorf("limit after none = %d, want none (%d)", l, int64(math.MaxInt64))
	}
}

func TestResolveRejects(t *testing.T) {
	for _, v := range []string{"lots", "0", "-5MiB", "64XB"} {
		if _, err := Resolve(v, env(nil), fstest.MapFS{}); err == nil || !strings.Contains(err.Error(), "--memory-limit") {
			t.Errorf("Resolve(%q) = %v, want an error naming --memory-limit", v, err)
		}
	}
}
