package version

import (
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestBuildInfoCollector(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(Collector())
	want := `# HELP tether_build_info Always 1; its labels are the tether release, the Go toolchain and the frp engine this process was built with.
# TYPE tether_build_info gauge
tether_build_info{frp_version="` + FRP() + `",go_version="` + runtime.Version() + `",version="` + Version + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tether_build_info"); err != nil {
		t.Error(err)
	}
}

func TestGet(t *testing.T) {
	i := Get()
	if i.Version != Version || i.Go != runtime.Version() || i.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("Get() = %+v", i)
	}
}
