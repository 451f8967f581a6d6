// Package memlimit sets the Go runtime's soft memory limit of a process
// that runs in a container, so that the garbage collector works harder as
// the process nears its container's limit instead of letting the kernel
// kill it there.
//
//	l, err := memlimit.Resolve(flagValue, os.Getenv, os.DirFS("/"))
//	memlimit.Apply(l)
//
// The limit is the --memory-limit flag's size, or by default 90% of the
// container's memory limit (cgroup v2 memory.max, or v1
// memory.limit_in_bytes); none outside a container or without a limit.
// GOMEMLIMIT, when set, is the runtime's own and is left alone unless the
// flag is given. It does not set GOGC: the collector's pace stays Go's
// default until the limit is near.
package memlimit

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/internal/human"
)

// containerShare is the share of the container's memory limit the Go
// runtime aims to stay under: the rest is room for what it does not count,
// the binary's pages first.
const containerShare = 0.9

// Limit is a soft memory limit and where it came from.
type Limit struct {
	// Bytes is the limit; 0 is none.
	Bytes int64
	// Source says where it came from, for the log: "--memory-limit",
	// "--memory-limit none", "GOMEMLIMIT", the container's limit and its
	// cgroup file, or that no container limit was found.
	Source string
}

// String is the limit for people, e.g. "922MiB (90% of the container's
// limit 1.0GiB, cgroup /sys/fs/cgroup/memory.max)" or "none (GOMEMLIMIT)".
func (l Limit) String() string {
	if l.Bytes <= 0 {
		return "none (" + l.Source + ")"
	}
	return human.Bytes(uint64(l.Bytes)) + " (" + l.Source + ")" //nolint:gosec // positive
}

// Resolve decides the limit. value is the --memory-limit flag: a size
// (64MiB, 1GiB, 512M), "none", or "" for the default; getenv reads the
// environment and root is the filesystem the cgroup files are read from
// (os.DirFS("/")).
func Resolve(value string, getenv func(string) string, root fs.FS) (Limit, error) {
	switch v := strings.TrimSpace(value); {
	case strings.EqualFold(v, "none"):
		return Limit{Source: "--memory-limit none"}, nil
	case v != "":
		n, err := human.ParseBytes(v)
		if err != nil {
			return Limit{}, fmt.Errorf("--memory-limit: %w, or none", err)
		}
		if n == 0 {
			return Limit{}, errors.New("--memory-limit 0: want a size such as 64MiB, or none for no limit")
		}
		return Limit{Bytes: int64(n), Source: "--memory-limit"}, nil //nolint:gosec // ParseBytes bounds n below MaxInt64
	case getenv("GOMEMLIMIT") != "":
		// The runtime has read it already; "off" reads as MaxInt64.
		if n := debug.SetMemoryLimit(-1); n != math.MaxInt64 {
			return Limit{Bytes: n, Source: "GOMEMLIMIT"}, nil
		}
		return Limit{Source: "GOMEMLIMIT"}, nil
	}
	limit, file := containerLimit(root)
	if limit == 0 {
		return Limit{Source: "no container memory limit found"}, nil
	}
	return Limit{
		Bytes:  int64(float64(limit) * containerShare),
		Source: fmt.Sprintf("%.0f%% of the container's limit %s, cgroup %s", containerShare*100, human.Bytes(uint64(limit)), file), //nolint:gosec // positive
	}, nil
}

// Apply makes l the runtime's soft memory limit. A limit from GOMEMLIMIT
// is in force already; none lifts any.
func Apply(l Limit) {
	switch {
	case l.Source == "GOMEMLIMIT":
	case l.Bytes > 0:
		debug.SetMemoryLimit(l.Bytes)
	default:
		debug.SetMemoryLimit(math.MaxInt64)
	}
}

// unlimited is where cgroup v1 reports no limit (the page counter's
// maximum, rounded down to a page: 9223372036854771712).
const unlimited = 1 << 62

// containerLimit reads the memory limit of the process's cgroup: v2's
// memory.max, else v1's memory.limit_in_bytes, at the process's cgroup
// path and then at the hierarchy's root (where a container with its own
// cgroup namespace sees its own cgroup). It returns 0 when there is none.
func containerLimit(root fs.FS) (limit int64, file string) {
	v2, v1 := cgroupPaths(root)
	var candidates []string
	if v2 != "" {
		candidates = append(candidates, path.Join("sys/fs/cgroup", v2, "memory.max"))
	}
	candidates = append(candidates, "sys/fs/cgroup/memory.max")
	if v1 != "" {
		candidates = append(candidates, path.Join("sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"))
	}
	candidates = append(candidates, "sys/fs/cgroup/memory/memory.limit_in_bytes")
	for _, name := range candidates {
		b, err := fs.ReadFile(root, name)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, ""
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= unlimited {
			return 0, ""
		}
		return n, "/" + name
	}
	return 0, ""
}

// cgroupPaths reads the process's cgroup v2 path ("0::/path") and v1
// memory controller path ("N:memory:/path") from /proc/self/cgroup.
func cgroupPaths(root fs.FS) (v2, v1 string) {
	f, err := root.Open("proc/self/cgroup")
	if err != nil {
		return "", ""
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			v1 = parts[2]
		}
	}
	return v2, v1
}
