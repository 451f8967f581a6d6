package proxy

import "time"

// argoRollouts is the Argo Rollouts dashboard. It listens on port 3100 and
// serves under the root path "rollouts" by default (--root-path), so the
// prefix is kept; its UI page at /rollouts/ doubles as the health path.
// Its watch endpoints stream, but they send headers with the first message,
// which is the current state and comes at once; the 60s timeout bounds only
// that wait, never the stream.
func argoRollouts() Adapter {
	return Adapter{
		Name:       "argo-rollouts",
		Prefix:     "/rollouts",
		Upstream:   "http://argo-rollouts-dashboard:3100",
		HealthPath: "/rollouts/",
		Timeout:    60 * time.Second,
	}
}
