package server

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// BenchmarkRequestPath measures one small GET through the whole request
// path, in one process: public entry, tunnel session, client router,
// upstream. Compare with BenchmarkDirect for the cost of the tunnel.
func BenchmarkRequestPath(b *testing.B) {
	s := startServer(b)
	be := smallBackend(b)
	os.Setenv("SPLICE", be.Listener.Addr().String())
	if os.Getenv("NOSPLICE") != "" {
		os.Setenv("SPLICE", "")
	}
	s.startClient(b, "alpha", be.URL)
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
				b.Error(fmt.Sprintf("status %d", resp.StatusCode))
				return
			}
		}
	})
}
