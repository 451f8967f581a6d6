package proxy

// argoCD is the Argo CD API server and UI. The runtime runs argocd-server
// with --rootpath /argo-cd (and --insecure: TLS ends at the tunnel), so it
// expects the prefix in the path and the upstream URL has no path: the prefix
// is kept.
//
// Health: under a root path argocd-server mounts its whole mux, /healthz
// included, at /argo-cd/ (server.go withRootPath; it also answers /healthz at
// the root). /argo-cd/healthz is checked because it goes through the same
// prefix as real traffic and fails when the root path is misconfigured.
//
// No timeout: the UI and CLI hold watch streams open (application and
// resource-tree watches are streamed responses).
func argoCD() Adapter {
	return Adapter{
		Name:       "argo-cd",
		Prefix:     "/argo-cd",
		Upstream:   "http://argocd-server:80",
		HealthPath: "/argo-cd/healthz",
	}
}
