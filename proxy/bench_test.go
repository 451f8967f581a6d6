package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap"
)

// discardWriter is a ResponseWriter that keeps only the status.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }

// BenchmarkRouter measures the cost of the router's hop for a small GET:
//
//   - direct: a client GETs the upstream (the floor);
//   - via-router: the same client GETs through the router served over HTTP,
//     as the tunnel client serves it (the difference is the hop's cost);
//   - serve-http: ServeHTTP called in-process, the router's own work plus
//     its upstream request.
func BenchmarkRouter(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"Version":"v2.14.0"}`)
	}))
	defer up.Close()
	r, err := NewRouter([]Route{
		{Prefix: "/", Upstream: mustURL(b, up.URL)},
		{Prefix: "/argo-cd", Upstream: mustURL(b, up.URL), Timeout: 0},
		{Prefix: "/webhooks", Upstream: mustURL(b, up.URL+"/"), Timeout: 30e9},
	}, zap.NewNop(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	front := httptest.NewServer(r)
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()

	get := func(b *testing.B, url string) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				res, err := client.Get(url)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					b.Errorf("status %d", res.StatusCode)
					return
				}
			}
		})
	}
	b.Run("direct", func(b *testing.B) { get(b, up.URL+"/argo-cd/api/version") })
	b.Run("via-router", func(b *testing.B) { get(b, front.URL+"/argo-cd/api/version") })
	for _, path := range []string{"/argo-cd/api/version", "/webhooks/github"} {
		b.Run("serve-http"+path, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := httptest.NewRequest(http.MethodGet, path, nil)
				w := &discardWriter{h: http.Header{}}
				for pb.Next() {
					clear(w.h)
					w.status = 0
					r.ServeHTTP(w, req)
					if w.status != http.StatusOK {
						b.Errorf("status %d", w.status)
						return
					}
				}
			})
		})
	}
}
