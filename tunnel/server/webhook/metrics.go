package webhook

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// collectTimeout bounds the store's work for one scrape.
const collectTimeout = 3 * time.Second

// collector exports the buffer's state and this process's counts.
type collector struct {
	f                                 *Forwarder
	requests, bytes, oldest, outcomes *prometheus.Desc
}

// Collector returns the buffer's metrics, for the server's registry:
//
//	tether_buffered_requests{tunnel,state}  stored requests, state queued or rejected
//	tether_buffered_bytes{tunnel}           what they count against the quotas
//	tether_buffer_oldest_age_seconds{tunnel} how long ago the oldest of them was accepted
//	tether_buffer_requests_total{outcome}   accepted, full, delivered, rejected, expired, dropped
//
// The gauges are read from the store at each scrape (with Redis, the same
// on every replica: aggregate them with max, not sum); a scrape while the
// store fails has none. The counters count what this process did.
func (f *Forwarder) Collector() prometheus.Collector {
	return &collector{
		f: f,
		requests: prometheus.NewDesc("tether_buffered_requests",
			"Requests stored for delivery while their tunnel was down, by tunnel and state: queued (waiting for delivery) or rejected (refused by their upstream with a 4xx, kept until dropped or requeued through the admin API).",
			[]string{"tunnel", "state"}, nil),
		bytes: prometheus.NewDesc("tether_buffered_bytes",
			"Bytes of the requests stored for a tunnel, queued and rejected: what counts against --buffer-max-bytes.",
			[]string{"tunnel"}, nil),
		oldest: prometheus.NewDesc("tether_buffer_oldest_age_seconds",
			"How long ago the oldest request stored for a tunnel (queued or rejected) was accepted, in seconds: how far behind its deliveries are, or how long a rejected request has waited for a person.",
			[]string{"tunnel"}, nil),
		outcomes: prometheus.NewDesc("tether_buffer_requests_total",
			"Requests of buffered routes by outcome: accepted (stored, answered 202), full (refused with 503 buffer_full), delivered (a 2xx or 3xx from the upstream), rejected (a 4xx), expired (dropped undelivered at the end of --buffer-retention), dropped (through the admin API).",
			[]string{"outcome"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.requests
	ch <- c.bytes
	ch <- c.oldest
	ch <- c.outcomes
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	n := c.f.buf.Counts()
	for outcome, v := range map[string]uint64{
		"accepted": n.Accepted, "full": n.Full, "delivered": n.Delivered,
		"rejected": n.Rejected, "expired": n.Expired, "dropped": n.Dropped,
	} {
		ch <- prometheus.MustNewConstMetric(c.outcomes, prometheus.CounterValue, float64(v), outcome)
	}
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	all, err := c.f.buf.All(ctx)
	if err != nil {
		c.f.log.Debug("buffer metrics left out of a scrape: the store failed", zap.Error(err))
		return
	}
	now := time.Now()
	for tunnel, st := range all {
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(st.Queued), tunnel, "queued")
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(st.Rejected), tunnel, "rejected")
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Bytes), tunnel)
		if !st.Oldest.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, max(now.Sub(st.Oldest).Seconds(), 0), tunnel)
		}
	}
}
