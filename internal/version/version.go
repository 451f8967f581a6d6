// Package version reports the tether build: a release stamped at link time
// and the frp engine version compiled in.
//
// make build sets Version with -ldflags "-X .../internal/version.Version=...";
// a plain go build reports "dev".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the tether release, set at link time. "dev" when unset.
var Version = "dev"

const frpModule = "github.com/fatedier/frp"

// FRP is the version of the frp engine linked into this binary, read from the
// build information so that it can never drift from go.mod.
func FRP() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == frpModule {
			return dep.Version
		}
	}
	return "unknown"
}

// String is the one-line form printed by `tether version`:
// "tether dev (frp v0.71.0, go1.26.8 linux/amd64)".
func String() string {
	return fmt.Sprintf("tether %s (frp %s, %s %s/%s)", Version, FRP(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
