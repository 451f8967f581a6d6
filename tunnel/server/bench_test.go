package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkRequestPath measures one small GET through the whole request
// path, in one process: public entry and router, tunnel session, client,
// upstream. Compare with BenchmarkDirect for the cost of the tunnel.
func BenchmarkRequestPath(b *testing.B) {
	s := startServer(b)
	s.startClient(b, "alpha", smallBackend(b).URL)
	benchmarkGET(b, s.entry+"/small", "alpha."+testDomain)
}

// BenchmarkDirect is the same load straight to the upstream.
func BenchmarkDirect(b *testing.B) {
	benchmarkGET(b, smallBackend(b).URL+"/small", "")
}

func smallBackend(b *testing.B) *httptestServer {
	b.Helper()
	body := strings.Repeat("x", 97)
	return newHTTPTestServer(b, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, body)
	}))
}

func benchmarkGET(b *testing.B, url, host string) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Host = host
			resp, err := hc.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}
