package test

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestGracefulShutdown: on SIGTERM the server reports not ready, lets a
// request in flight finish, and exits 0.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	b := newBackend(t, "backend", map[string]http.HandlerFunc{
		"/slow": func(w http.ResponseWriter, r *http.Request) {
			begin := time.Now()
			started <- struct{}{}
			// Answer about a second later, and not before the test has
			// seen the server draining.
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			case <-r.Context().Done():
				return
			}
			time.Sleep(time.Until(begin.Add(time.Second)))
			fmt.Fprint(w, "slow answer")
		},
	})
	startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + b.url()}})
	if r, err := srv.admin("/readyz"); err != nil || r.code != http.StatusOK {
		t.Fatalf("/readyz before shutdown: %d %v, want 200", r.code, err)
	}

	done := srv.getAsync("alpha", "/slow")
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow request never reached the backend")
	}

	srv.signal(syscall.SIGTERM)
	testutil.WaitFor(t, 10*time.Second, func() error {
		r, err := srv.admin("/readyz")
		if err != nil {
			return err
		}
		if r.code != http.StatusServiceUnavailable {
			return fmt.Errorf("/readyz during the drain: %d %q, want 503", r.code, strings.TrimSpace(r.body))
		}
		return nil
	})
	close(release)

	res := <-done
	if res.err != nil || res.r.code != http.StatusOK || res.r.body != "slow answer" {
		t.Errorf("request in flight during the drain: %d %q %v; want 200 \"slow answer\"", res.r.code, res.r.body, res.err)
	}
	code, ok := srv.wait(stopTimeout)
	if !ok {
		t.Fatalf("server still runs %v after SIGTERM", stopTimeout)
	}
	if code != 0 {
		t.Errorf("server exited with status %d after SIGTERM, want 0", code)
	}
}

// TestClientShutdown: the client exits 0 on SIGTERM.
func TestClientShutdown(t *testing.T) {
	t.Parallel()
	k := newKeys(t)
	srv := startServer(t, k, serverOpts{})
	b := newBackend(t, "backend", nil)
	c := startClient(t, srv, clientOpts{tokenFile: writeToken(t, k.issue(t, "alpha", time.Hour)), routes: []string{"/=" + b.url()}})
	c.signal(syscall.SIGTERM)
	code, ok := c.wait(stopTimeout)
	if !ok {
		t.Fatalf("client still runs %v after SIGTERM", stopTimeout)
	}
	if code != 0 {
		t.Errorf("client exited with status %d after SIGTERM, want 0", code)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		r, err := srv.get("alpha", "/")
		if err != nil {
			return err
		}
		if r.code != http.StatusServiceUnavailable || r.header.Get("X-Tether-Error") != "tunnel_down" {
			return fmt.Errorf("after the client left: %d %q, want 503 tunnel_down", r.code, r.header.Get("X-Tether-Error"))
		}
		return nil
	})
}
