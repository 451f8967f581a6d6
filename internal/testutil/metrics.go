package testutil

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricLabels gathers g and returns the label values of its series, each
// as "family/label=value". It fails tb for a label value with white space:
// PromQL matchers and dashboards' variables break on them.
func MetricLabels(tb testing.TB, g prometheus.Gatherer) map[string]bool {
	tb.Helper()
	families, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()+"/"] = true
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.ContainsAny(l.GetValue(), " \t\r\n") {
					tb.Errorf("%s{%s=%q}: a label value with white space", f.GetName(), l.GetName(), l.GetValue())
				}
				got[f.GetName()+"/"+l.GetName()+"="+l.GetValue()] = true
			}
		}
	}
	return got
}
