package proxy

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// Status classes of tether_proxy_requests_total. classCanceled counts
// requests whose caller went away before the upstream answered.
var classes = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx", "canceled"}

const classCanceled = len(classes) - 1

// metrics are the router's Prometheus collectors. Labels are bounded by the
// configuration: route (the prefix), adapter, class.
type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

// newMetrics registers the router's collectors with reg. If a previous
// router registered them with reg already, they are shared, so a client that
// rebuilds its router keeps counting in the same series.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tether",
		Subsystem: "proxy",
		Name:      "requests_total",
		Help: "Requests handled by the client's router, by route prefix, adapter and status class " +
			"(1xx-5xx, or canceled when the caller went away first). " +
			"Requests that matched no route have empty route and adapter.",
	}, []string{"route", "adapter", "class"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "tether",
		Subsystem: "proxy",
		Name:      "upstream_latency_seconds",
		Help:      "Time from sending a request to its upstream to receiving the response headers.",
		Buckets:   []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"route", "adapter"})
	var err error
	if requests, err = register(reg, requests); err != nil {
		return nil, err
	}
	if latency, err = register(reg, latency); err != nil {
		return nil, err
	}
	return &metrics{requests: requests, latency: latency}, nil
}

// register registers c with reg, or returns the equal collector registered
// before.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register proxy metrics: %w", err)
}

// routeMetrics are one route's series, resolved once so that a request
// costs no label lookup.
type routeMetrics struct {
	requests [len(classes)]prometheus.Counter
	latency  prometheus.Observer
}

func (m *metrics) forRoute(prefix, adapter string) *routeMetrics {
	rm := m.forUnmatched(prefix, adapter)
	rm.latency = m.latency.WithLabelValues(prefix, adapter)
	return rm
}

// forUnmatched returns the request series of requests that reach no
// upstream, hence have no latency.
func (m *metrics) forUnmatched(prefix, adapter string) *routeMetrics {
	rm := &routeMetrics{}
	for i, c := range classes {
		rm.requests[i] = m.requests.WithLabelValues(prefix, adapter, c)
	}
	return rm
}

// count records one finished request.
func (rm *routeMetrics) count(status int, canceled bool) {
	if rm == nil {
		return
	}
	if status == 0 {
		// Nothing written: net/http answers 200 for the handler.
		status = http.StatusOK
	}
	i := classCanceled
	if !canceled {
		i = min(max(status/100, 1), 5) - 1
	}
	rm.requests[i].Inc()
}
