package auth_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/auth"
	"github.com/tether-dev/tether/internal/testutil"
)

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// replaceFile swaps path for a new file with data, the way a Kubernetes
// Secret volume does (a rename), so the change is visible even within one
// mtime tick.
func replaceFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// waitForKeys polls src until its key IDs are want.
func waitForKeys(t testing.TB, src auth.KeySource, want []string) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, func() error {
		ks, err := src.Keys()
		if got := ks.KeyIDs(); !slices.Equal(got, want) {
			return fmt.Errorf("KeyIDs() = %q (err %v), want %q", got, err, want)
		}
		return nil
	})
}

func TestFileKeySourceReloads(t *testing.T) {
	a := newKeyPair(t, auth.EdDSA, 0)
	b := newKeyPair(t, auth.ES256, 0)
	path := writeFile(t, t.TempDir(), "jwt.pub", a.pubPEM)
	src, err := auth.NewFileKeySourceWith(path, 0, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	waitForKeys(t, src, []string{a.kid()})

	// Rotation step 1: the new key is added next to the old one.
	replaceFile(t, path, concat(a.pubPEM, b.pubPEM))
	waitForKeys(t, src, []string{a.kid(), b.kid()})

	// Step 2: the old key is retired, rewritten in place this time.
	if err := os.WriteFile(path, b.pubPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	waitForKeys(t, src, []string{b.kid()})

	// A verifier over the source follows along.
	v := verifier(t, src, nil)
	if _, err := v.Verify(mint(t, b, claims(), nil)); err != nil {
		t.Errorf("Verify with the new key: %v", err)
	}
	if got := reasonOf(verifyErr(v, mint(t, a, claims(), nil))); got != auth.ReasonUnknownKey {
		t.Errorf("Verify with the retired key: reason %q, want %q", got, auth.ReasonUnknownKey)
	}
}

func verifyErr(v *auth.Verifier, tok string) error {
	_, err := v.Verify(tok)
	return err
}

func TestFileKeySourceKeepsLastGoodKeys(t *testing.T) {
	a := newKeyPair(t, auth.EdDSA, 0)
	b := newKeyPair(t, auth.EdDSA, 0)
	path := writeFile(t, t.TempDir(), "jwt.pub", a.pubPEM)
	src, err := auth.NewFileKeySourceWith(path, 0, time.Now)
	if err != nil {
		t.Fatal(err)
	}

	replaceFile(t, path, []byte("garbage"))
	ks, err := src.Keys()
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "keeping the 1 keys") {
		t.Errorf("Keys() error = %v, want a reload error naming %s", err, path)
	}
	if got := ks.KeyIDs(); !slices.Equal(got, []string{a.kid()}) {
		t.Errorf("KeyIDs() = %q after a bad reload, want the last good [%q]", got, a.kid())
	}
	// The failure is reported once, not at every call.
	if _, err := src.Keys(); err != nil {
		t.Errorf("second Keys() error = %v, want nil (already reported)", err)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Keys(); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Keys() with the file gone: error = %v, want one naming %s", err, path)
	}
	if ks, err := src.Keys(); err != nil || ks.Len() != 1 {
		t.Errorf("Keys() again with the file gone = %d keys, %v; want 1 key, nil", ks.Len(), err)
	}

	replaceFile(t, path, b.pubPEM)
	waitForKeys(t, src, []string{b.kid()})
}

func TestFileKeySourceChecksAtMostOncePerInterval(t *testing.T) {
	a := newKeyPair(t, auth.EdDSA, 0)
	b := newKeyPair(t, auth.EdDSA, 0)
	path := writeFile(t, t.TempDir(), "jwt.pub", a.pubPEM)
	clk := &fakeClock{t: now}
	src, err := auth.NewFileKeySourceWith(path, time.Second, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	replaceFile(t, path, b.pubPEM)
	clk.Advance(999 * time.Millisecond)
	ks, _ := src.Keys()
	if got := ks.KeyIDs(); !slices.Equal(got, []string{a.kid()}) {
		t.Errorf("KeyIDs() before the interval = %q, want the old %q", got, a.kid())
	}
	clk.Advance(time.Millisecond)
	ks, err = src.Keys()
	if err != nil {
		t.Fatal(err)
	}
	if got := ks.KeyIDs(); !slices.Equal(got, []string{b.kid()}) {
		t.Errorf("KeyIDs() after the interval = %q, want the new %q", got, b.kid())
	}
}

func TestNewFileKeySourceErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pub")
	bad := writeFile(t, dir, "bad.pub", []byte("not a key"))
	for _, path := range []string{missing, bad} {
		if _, err := auth.NewFileKeySource(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("NewFileKeySource(%s) error = %v, want one naming the file", path, err)
		}
	}
}

func TestHMACKeySource(t *testing.T) {
	dir := t.TempDir()
	secret := strings.Repeat("s", 32)
	path := writeFile(t, dir, "secret", []byte(secret+"\r\n"))
	src, err := auth.NewHMACKeySourceWith(path, 0, time.Now)
	if err != nil {
		t.Fatalf("NewHMACKeySource: %v", err)
	}
	read, err := auth.ReadHMACSecret(path)
	if err != nil || string(read) != secret {
		t.Fatalf("ReadHMACSecret = %q, %v; want the secret without the newline", read, err)
	}
	signer, err := auth.NewHMACSigner(read)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := signer.Issue(auth.IssueRequest{Tunnel: "acme", TTL: time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	v := verifier(t, src, nil)
	if _, err := v.Verify(tok); err != nil {
		t.Errorf("Verify: %v", err)
	}

	// A rotated secret takes over.
	replaceFile(t, path, []byte(strings.Repeat("t", 40)))
	testutil.WaitFor(t, 5*time.Second, func() error {
		if got := reasonOf(verifyErr(v, tok)); got != auth.ReasonUnknownKey {
			return fmt.Errorf("old token reason %q, want %q", got, auth.ReasonUnknownKey)
		}
		return nil
	})

	short := writeFile(t, dir, "short", []byte("too short\n"))
	if _, err := auth.NewHMACKeySource(short); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Errorf("NewHMACKeySource(short) error = %v, want a length error", err)
	}
	if _, err := auth.ReadHMACSecret(short); err == nil || !strings.Contains(err.Error(), short) {
		t.Errorf("ReadHMACSecret(short) error = %v, want one naming the file", err)
	}
	if _, err := auth.NewHMACSigner([]byte("short")); err == nil {
		t.Error("NewHMACSigner(short): got nil error")
	}
}

func TestStaticKeySource(t *testing.T) {
	k := newKeyPair(t, auth.EdDSA, 0)
	ks := keySet(t, k.pubPEM)
	got, err := auth.NewStaticKeySource(ks).Keys()
	if got != ks || err != nil {
		t.Errorf("Keys() = %p, %v; want %p, nil", got, err, ks)
	}
}

// Verify is safe for concurrent use while the key file rotates underneath.
func TestVerifyConcurrentWithReload(t *testing.T) {
	a := newKeyPair(t, auth.EdDSA, 0)
	b := newKeyPair(t, auth.EdDSA, 0)
	path := writeFile(t, t.TempDir(), "jwt.pub", concat(a.pubPEM, b.pubPEM))
	src, err := auth.NewFileKeySourceWith(path, 0, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	v := verifier(t, src, nil)
	tokA, tokB := mint(t, a, claims(), nil), mint(t, b, claims(), nil)

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				if _, err := v.Verify(tokB); err != nil {
					t.Errorf("Verify with the key present throughout: %v", err)
					return
				}
				_, _ = v.Verify(tokA)
			}
		})
	}
	for i := range 20 {
		data := concat(a.pubPEM, b.pubPEM)
		if i%2 == 1 {
			data = b.pubPEM
		}
		replaceFile(t, path, data)
	}
	wg.Wait()
}
