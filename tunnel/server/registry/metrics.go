package registry

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a registry's state as Prometheus metrics, read from
// Status at scrape time:
//
//	tether_registry_up                   1 while the registry reads and writes Redis (always for memory)
//	tether_registry_tunnels{holder}      tunnels held by this replica (holder="self") or, per the cache, by others ("others")
//	tether_registry_errors_total         failed Redis operations
type Collector struct {
	reg     Registry
	up      *prometheus.Desc
	tunnels *prometheus.Desc
	errors  *prometheus.Desc
}

// NewCollector returns the collector of reg, for the server to register.
func NewCollector(reg Registry) *Collector {
	return &Collector{
		reg: reg,
		up: prometheus.NewDesc("tether_registry_up",
			"1 while the route registry reads and writes Redis (always 1 for the in-memory registry).", nil, nil),
		tunnels: prometheus.NewDesc("tether_registry_tunnels",
			"Tunnels in the route registry, by holder: this replica (self) or, per the cache, other replicas (others).",
			[]string{"holder"}, nil),
		errors: prometheus.NewDesc("tether_registry_errors_total",
			"Redis operations of the route registry that failed (writes, scans, the subscription).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.tunnels
	ch <- c.errors
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.reg.Status()
	up := 0.0
	if s.Up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.tunnels, prometheus.GaugeValue, float64(s.Held), "self")
	ch <- prometheus.MustNewConstMetric(c.tunnels, prometheus.GaugeValue, float64(s.Remote), "others")
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(s.Errors))
}
