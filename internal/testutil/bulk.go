package testutil

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// BulkRequest returns a bulk transfer of size bytes to base (a URL without
// a path) for host: a download of GET /large?bytes=size (method GET) or an
// upload to /upload (method POST), as the bulk benchmarks' upstreams serve.
func BulkRequest(tb testing.TB, method, base, host string, size int64) *http.Request {
	tb.Helper()
	url, body := base+"/large?bytes="+strconv.FormatInt(size, 10), io.Reader(nil)
	if method == http.MethodPost {
		url, body = base+"/upload", io.LimitReader(zeros{}, size)
	}
	req, err := http.NewRequestWithContext(tb.Context(), method, url, body)
	if err != nil {
		tb.Fatal(err)
	}
	req.Host = host
	return req
}

// TransferBulk sends a BulkRequest and checks that every byte arrived: a
// download brings size bytes, and an upload's upstream answers with the
// number of bytes it read.
func TransferBulk(tb testing.TB, hc *http.Client, req *http.Request, size int64) {
	tb.Helper()
	resp, err := hc.Do(req) //nolint:gosec // the test's own loopback server
	if err != nil {
		tb.Fatal(err)
	}
	var answer strings.Builder // the upload's count
	dst := io.Writer(&answer)
	if req.Method == http.MethodGet {
		dst = io.Discard
	}
	n, err := io.Copy(dst, resp.Body)
	_ = resp.Body.Close()
	switch {
	case err != nil || resp.StatusCode != http.StatusOK:
		tb.Fatalf("%s: status %d, %v", req.Method, resp.StatusCode, err)
	case req.Method == http.MethodGet && n != size:
		tb.Fatalf("downloaded %d bytes, want %d", n, size)
	case req.Method == http.MethodPost && answer.String() != strconv.FormatInt(size, 10):
		tb.Fatalf("the upstream read %s bytes, want %d", answer.String(), size)
	}
}

// zeros is an endless body that costs nothing to produce.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
