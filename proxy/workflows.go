package proxy

// argoWorkflows is argo-server, the Argo Workflows API and UI. It serves at
// its own root on port 2746 and only its UI knows the prefix (run with
// --base-href /workflows/), so the upstream URL has the path "/": the prefix
// is stripped and sent as X-Forwarded-Prefix.
//
// argo-server serves TLS with a self-signed certificate by default (--secure),
// hence https and InsecureSkipVerify; the connection never leaves the cluster.
// Health: "/" is what its own manifests probe (readinessProbe httpGet path /,
// scheme HTTPS, port 2746).
//
// No timeout: workflow and log watches are server-sent event streams.
func argoWorkflows() Adapter {
	return Adapter{
		Name:               "argo-workflows",
		Prefix:             "/workflows",
		Upstream:           "https://argo-server:2746/",
		HealthPath:         "/",
		InsecureSkipVerify: true,
	}
}
