package test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// bigSize is the size of the streamed upload and download.
const bigSize = 100 << 20

// streamBackend serves the streaming endpoints:
//
//	/events    three server-sent events; each after the previous was acknowledged by the test
//	/ws        websocket echo
//	/upload    reads the body and answers {"bytes": n, "sha256": hex}
//	/download  sends ?size= pseudo-random bytes of ?seed=
type streamBackend struct {
	*backend
	ack       chan struct{} // the test read an event
	received  atomic.Int64  // bytes /upload has read so far
	delivered atomic.Int64  // bytes the test has read of /download so far
}

func newStreamBackend(t testing.TB, name string) *streamBackend {
	sb := &streamBackend{ack: make(chan struct{})}
	sb.backend = newBackend(t, name, map[string]http.HandlerFunc{
		"/events":   sb.events,
		"/ws":       websocket.Handler(func(ws *websocket.Conn) { _, _ = io.Copy(ws, ws) }).ServeHTTP,
		"/upload":   sb.upload,
		"/download": sb.download,
	})
	return sb
}

func (sb *streamBackend) events(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	for i := range 3 {
		fmt.Fprintf(w, "id: %d\ndata: event %d\n\n", i, i)
		if err := rc.Flush(); err != nil {
			return
		}
		// The next event is sent only once the test has read this one: if
		// any hop held the stream back, the test would never see it.
		select {
		case <-sb.ack:
		case <-r.Context().Done():
			return
		case <-time.After(time.Minute):
			return
		}
	}
}

func (sb *streamBackend) upload(w http.ResponseWriter, r *http.Request) {
	h := sha256.New()
	n, err := io.CopyBuffer(h, &countingReader{r: r.Body, n: &sb.received}, make([]byte, 64<<10))
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"bytes": n, "sha256": hex.EncodeToString(h.Sum(nil))})
}

func (sb *streamBackend) download(w http.ResponseWriter, r *http.Request) {
	size, _ := strconv.ParseInt(r.URL.Query().Get("size"), 10, 64)
	seed, _ := strconv.ParseUint(r.URL.Query().Get("seed"), 10, 64)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	gen := newGenerator(seed, size, size/2, func() error {
		// Halfway, wait until the test has received something: a hop that
		// buffered the whole response would never let it.
		return waitUntil(r.Context(), time.Minute, func() bool { return sb.delivered.Load() > 0 },
			"the test received nothing of the download after half of it was sent")
	})
	_, _ = io.CopyBuffer(w, gen, make([]byte, 64<<10))
}

// countingReader counts what it reads into n.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// generator yields size pseudo-random bytes of seed, made on the fly. When
// pauseAt bytes have been read it calls pause once, and fails with its error.
type generator struct {
	rng       *rand.ChaCha8
	size, off int64
	pauseAt   int64
	pause     func() error
	paused    bool
}

func newGenerator(seed uint64, size, pauseAt int64, pause func() error) *generator {
	var s [32]byte
	for i := range 8 {
		s[i] = byte(seed >> (8 * i))
	}
	return &generator{rng: rand.NewChaCha8(s), size: size, pauseAt: pauseAt, pause: pause}
}

func (g *generator) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}
	if g.pause != nil && !g.paused && g.off >= g.pauseAt {
		g.paused = true
		if err := g.pause(); err != nil {
			return 0, err
		}
	}
	n := int64(len(p))
	n = min(n, g.size-g.off)
	if g.pause != nil && !g.paused {
		n = min(n, g.pauseAt-g.off)
	}
	_, _ = g.rng.Read(p[:n])
	g.off += n
	return int(n), nil
}

// waitUntil polls cond until it holds, ctx ends or timeout passes.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool, failure string) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return errors.New(failure)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// sumGenerated is the SHA-256 of what newGenerator(seed, size) yields.
func sumGenerated(seed uint64, size int64) string {
	h := sha256.New()
	_, _ = io.CopyBuffer(h, newGenerator(seed, size, 0, nil), make([]byte, 64<<10))
	return hex.EncodeToString(h.Sum(nil))
}

// TestStreaming: server-sent events, websockets, and large uploads and
// downloads pass through the whole path (public entry, server, tunnel,
// client, backend) as streams, through a tether client and a stock frpc.
func TestStreaming(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	viaTether := newStreamBackend(t, "tether-backend")
	viaFRPC := newStreamBackend(t, "frpc-backend")
	startClient(t, srv, clientOpts{
		tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)),
		routes:    []string{"/=" + viaTether.url()},
	})
	startFRPC(t, "frpc gamma", frpcConfig(srv, k.issue(t, "gamma", time.Hour), frpcHTTPProxy("gamma", viaFRPC.backend)))
	srv.waitServedBy(t, "gamma", "frpc-backend", readyTimeout)

	for _, tun := range []struct {
		name, tunnel string
		b            *streamBackend
		big          bool
	}{
		{"tether client", "alpha", viaTether, true},
		{"stock frpc", "gamma", viaFRPC, true},
	} {
		t.Run(tun.name+"/server-sent events", func(t *testing.T) {
			testSSE(t, srv, tun.tunnel, tun.b)
		})
		t.Run(tun.name+"/websocket echo", func(t *testing.T) {
			testWebsocket(t, srv, tun.tunnel)
		})
		if !tun.big {
			continue
		}
		t.Run(tun.name+"/100 MiB upload", func(t *testing.T) {
			testUpload(t, srv, tun.tunnel, tun.b)
		})
		t.Run(tun.name+"/100 MiB download", func(t *testing.T) {
			testDownload(t, srv, tun.tunnel, tun.b)
		})
	}
}

func testSSE(t *testing.T, srv *server, tunnel string, sb *streamBackend) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req := srv.request(t, http.MethodGet, tunnel, "/events", nil)
	req = req.WithContext(ctx)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := streamc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d (%s), want 200", resp.StatusCode, resp.Header.Get("X-Tether-Error"))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("got Content-Type %q, want text/event-stream", ct)
	}
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		var data string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("event %d: %v (events must arrive one by one, before the stream ends)", i, err)
			}
			line = strings.TrimRight(line, "\r\n")
			if line == "" {
				break
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				data = v
			}
		}
		if want := fmt.Sprintf("event %d", i); data != want {
			t.Fatalf("got event data %q, want %q", data, want)
		}
		select {
		case sb.ack <- struct{}{}:
		case <-ctx.Done():
			t.Fatalf("backend did not wait for the acknowledgement of event %d", i)
		}
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Errorf("after the last event: %q, %v; want the end of the stream", rest, err)
	}
}

func testWebsocket(t *testing.T, srv *server, tunnel string) {
	conn, err := net.Dial("tcp", srv.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	host := tunnel + "." + domain
	cfg, err := websocket.NewConfig("ws://"+host+"/ws", "http://"+host)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		t.Fatalf("websocket handshake through the tunnel: %v", err)
	}
	defer ws.Close()
	for i := range 5 {
		msg := fmt.Sprintf("message %d %s", i, strings.Repeat("x", i*1000))
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
		if got != msg {
			t.Fatalf("echo %d: got %d bytes %.20q, want %d bytes %.20q", i, len(got), got, len(msg), msg)
		}
	}
}

func testUpload(t *testing.T, srv *server, tunnel string, sb *streamBackend) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb.received.Store(0)
	sent := sha256.New()
	gen := newGenerator(1, bigSize, bigSize/2, func() error {
		// Halfway, wait until the backend has read something: a hop that
		// buffered the whole body would never let it.
		return waitUntil(ctx, time.Minute, func() bool { return sb.received.Load() > 0 },
			"the backend received nothing of the upload after half of it was sent")
	})
	req := srv.request(t, http.MethodPut, tunnel, "/upload", io.TeeReader(gen, sent))
	req = req.WithContext(ctx)
	req.ContentLength = bigSize
	start := time.Now()
	resp, err := streamc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d (%s): %s", resp.StatusCode, resp.Header.Get("X-Tether-Error"), body)
	}
	var got struct {
		Bytes  int64  `json:"bytes"`
		SHA256 string `json:"sha256"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if got.Bytes != bigSize || got.SHA256 != hexSum(sent) {
		t.Errorf("backend received %d bytes, sha256 %s; want %d bytes, sha256 %s", got.Bytes, got.SHA256, bigSize, hexSum(sent))
	}
	t.Logf("uploaded %d MiB in %v", bigSize>>20, time.Since(start).Round(time.Millisecond))
}

func testDownload(t *testing.T, srv *server, tunnel string, sb *streamBackend) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb.delivered.Store(0)
	const seed = 2
	req := srv.request(t, http.MethodGet, tunnel, fmt.Sprintf("/download?size=%d&seed=%d", bigSize, seed), nil)
	req = req.WithContext(ctx)
	start := time.Now()
	resp, err := streamc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d (%s)", resp.StatusCode, resp.Header.Get("X-Tether-Error"))
	}
	h := sha256.New()
	n, err := io.CopyBuffer(h, &countingReader{r: resp.Body, n: &sb.delivered}, make([]byte, 64<<10))
	if err != nil {
		t.Fatalf("after %d bytes: %v", n, err)
	}
	if want := sumGenerated(seed, bigSize); n != bigSize || hexSum(h) != want {
		t.Errorf("received %d bytes, sha256 %s; want %d bytes, sha256 %s", n, hexSum(h), bigSize, want)
	}
	t.Logf("downloaded %d MiB in %v", bigSize>>20, time.Since(start).Round(time.Millisecond))
}

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }
