package proxy

import "time"

// argoEvents is the Argo Events webhook event source that receives Git
// providers' webhooks. The event source listens on port 12000 with endpoints
// at its root (e.g. /push), so the prefix is stripped: /webhooks/push reaches
// /push. Webhook event sources answer GET /health on every port they listen
// on (Argo Events "webhook health check"), which is the health path.
//
// Git providers wait about 10-30s for a webhook response, so a 30s header
// timeout answers 504 rather than holding a delivery.
//
// Buffered: GitHub does not retry a failed delivery, and GitLab disables a
// webhook after a few failures in a row, so a webhook that arrives while
// the tunnel is down is stored by the server and delivered when it is back
// rather than lost (Route.Buffer).
func argoEvents() Adapter {
	return Adapter{
		Name:       "argo-events",
		Prefix:     "/webhooks",
		Upstream:   "http://webhook-eventsource-svc:12000/",
		HealthPath: "/health",
		Timeout:    30 * time.Second,
		Buffer:     true,
	}
}
