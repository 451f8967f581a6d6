package proxy

import "time"

// appProxy is the platform's app-proxy, the runtime's own API. It owns every
// path no other adapter claims, so its prefix is "/", and it is served at its
// root with the path kept as is (no path in the upstream URL). It answers
// plain API calls, never long-lived streams, so a 60s header timeout turns a
// hung app-proxy into a 504 instead of a request that never ends.
func appProxy() Adapter {
	return Adapter{
		Name:       "app-proxy",
		Prefix:     "/",
		Upstream:   "http://app-proxy:8080",
		HealthPath: "/healthz",
		Timeout:    60 * time.Second,
	}
}
