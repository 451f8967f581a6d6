package buffer

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/tunnel/server/registry"
)

func TestMain(m *testing.M) {
	registry.BridgeRedisLog(zap.NewNop())
	goleak.VerifyTestMain(m)
}

// kind is a store the tests run against: newBuffer makes a Buffer on it
// (each call another replica of the same store).
type kind struct {
	name      string
	newBuffer func(t testing.TB, cfg Config) *Buffer
}

// kinds are bbolt in a temp dir and a Redis started for the test.
func kinds() []kind {
	return []kind{
		{"data-dir", func(t testing.TB, cfg Config) *Buffer {
			return boltBuffer(t, openStore(t, t.TempDir()), cfg)
		}},
		{"redis", func(t testing.TB, cfg Config) *Buffer {
			return redisBuffer(t, testutil.StartRedis(t).URL(), "a", cfg)
		}},
	}
}

// forEachKind runs test against each kind of store.
func forEachKind(t *testing.T, test func(t *testing.T, k kind)) {
	for _, k := range kinds() {
		t.Run(k.name, func(t *testing.T) { test(t, k) })
	}
}

func openStore(t testing.TB, dir string) *registry.Store {
	t.Helper()
	s, err := registry.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func boltBuffer(t testing.TB, s *registry.Store, cfg Config) *Buffer {
	t.Helper()
	return openBuffer(t, registry.Backing{Store: s}, cfg)
}

// redisBuffer is replica id's buffer on the Redis at url.
func redisBuffer(t testing.TB, url, id string, cfg Config) *Buffer {
	t.Helper()
	conn, err := registry.NewRedisConn(registry.Config{URL: url, Replica: id, Addr: id + ".peers.test:7443"}, "")
	if err != nil {
		t.Fatal(err)
	}
	return openBuffer(t, registry.Backing{Redis: conn}, cfg)
}

func openBuffer(t testing.TB, b registry.Backing, cfg Config) *Buffer {
	t.Helper()
	buf, err := Open(cfg, b, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Close() })
	return buf
}

// webhook is the n-th test request for tunnel: a POST with a query, signed
// headers and a binary body.
func webhook(tunnel string, n int) *Request {
	body := bytes.Repeat([]byte{byte(n), 0, '\r', '\n', 0xff}, 50+n)
	return &Request{
		Entry: Entry{Tunnel: tunnel, Method: http.MethodPost},
		URI:   fmt.Sprintf("/webhooks/github?n=%d&secret=s3cr3t", n),
		Header: http.Header{
			"Content-Type":        {"application/json"},
			"X-Hub-Signature-256": {fmt.Sprintf("sha256=%064x", n)},
			"X-Multi":             {"a", "b"},
		},
		Body: body,
	}
}

// sameRequest reports how got differs from the request want as stored.
func sameRequest(got, want *Request) error {
	switch {
	case got.Tunnel != want.Tunnel || got.Method != want.Method || got.URI != want.URI:
		return fmt.Errorf("got %s %s %s, want %s %s %s", got.Tunnel, got.Method, got.URI, want.Tunnel, want.Method, want.URI)
	case !bytes.Equal(got.Body, want.Body):
		return fmt.Errorf("body of %s: got %d bytes, want %d, not the same", got.ID, len(got.Body), len(want.Body))
	case fmt.Sprint(got.Header) != fmt.Sprint(want.Header):
		return fmt.Errorf("headers of %s: got %v, want %v", got.ID, got.Header, want.Header)
	}
	return nil
}

// appendAll appends each request and returns their entries.
func appendAll(t testing.TB, b *Buffer, reqs ...*Request) []Entry {
	t.Helper()
	var es []Entry
	for _, r := range reqs {
		e, err := b.Append(t.Context(), r)
		if err != nil {
			t.Fatalf("append: %v", err)
		}
		es = append(es, e)
	}
	return es
}

// ids are the IDs of entries.
func ids(es []Entry) []string {
	var list []string
	for _, e := range es {
		list = append(list, e.ID)
	}
	return list
}
