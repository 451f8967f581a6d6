// Package version reports the tether build: a release stamped at link time,
// the frp engine version compiled in, and the Go toolchain. It gives them as
// the one-line text of `tether version`, as JSON (`tether version -o json`),
// and as the Prometheus series tether_build_info that the server and the
// client export.
//
// make build and make release set Version with
// -ldflags "-X .../internal/version.Version=..."; a plain go build reports
// "dev".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
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

// Info is the build as `tether version -o json` prints it. Its keys are
// stable; new ones may be added.
type Info struct {
	Version   string `json:"version"`
	FRP       string `json:"frp_version"`
	Go        string `json:"go_version"`
	Platform  string `json:"platform"` // GOOS/GOARCH
	Revision  string `json:"revision,omitempty"`
	Modified  bool   `json:"modified,omitempty"` // built from a tree with uncommitted changes
	BuildTime string `json:"build_time,omitempty"`
}

// Get returns this binary's build information. Revision, Modified and
// BuildTime come from the VCS stamp of `go build` (absent with -buildvcs=false
// or outside a repository).
func Get() Info {
	i := Info{Version: Version, FRP: FRP(), Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			case "vcs.time":
				i.BuildTime = s.Value
			}
		}
	}
	return i
}

// Collector returns the gauge tether_build_info{version,go_version,frp_version},
// always 1: the usual way to put a build's versions on dashboards and in
// alert labels (join on it with group_left).
func Collector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "tether_build_info",
		Help:        "Always 1; its labels are the tether release, the Go toolchain and the frp engine this process was built with.",
		ConstLabels: prometheus.Labels{"version": i.Version, "go_version": i.Go, "frp_version": i.FRP},
	})
	g.Set(1)
	return g
}
