package buffer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/tether-dev/tether/tunnel/server/registry"
)

// crashDirEnv tells a re-executed test binary to be the child of
// TestCrashSafety: append to the store in that directory until killed.
const crashDirEnv = "TETHER_TEST_BUFFER_CRASH_DIR"

// TestCrashSafety: a process that appends from several goroutines is killed
// with SIGKILL mid-stream; every append that had returned is in the file,
// byte for byte, and the file is consistent.
func TestCrashSafety(t *testing.T) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		appendUntilKilled(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCrashSafety$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Each line the child printed is an append that returned: "ID N".
	acked := map[string]int{}
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		id, n, ok := strings.Cut(lines.Text(), " ")
		if !ok {
			continue // the test framework's own output
		}
		acked[id], _ = strconv.Atoi(n)
		if len(acked) == 300 {
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("child: got %v, want it killed (after 300 appends)", err)
	}

	s := openStore(t, dir)
	if err := s.DB().View(func(tx *bolt.Tx) error {
		return errors.Join(drain(tx.Check())...)
	}); err != nil {
		t.Fatalf("the file is inconsistent after the crash: %v", err)
	}
	b := boltBuffer(t, s, Config{})
	found := 0
	for c := range 4 {
		tunnel := fmt.Sprintf("t%d", c)
		l, err := b.Acquire(t.Context(), tunnel)
		if err != nil {
			t.Fatal(err)
		}
		for {
			got, err := l.Next(t.Context())
			if errors.Is(err, ErrEmpty) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if n, ok := acked[got.ID]; ok {
				if err := sameRequest(got, webhook(tunnel, n)); err != nil {
					t.Fatal(err)
				}
				found++
			}
			if err := l.Ack(t.Context(), got.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if found != len(acked) {
		t.Fatalf("found %d of the %d appends that returned before the crash", found, len(acked))
	}
	t.Logf("all %d appends that returned were in the file", found)
}

func drain(ch <-chan error) []error {
	var errs []error
	for err := range ch {
		errs = append(errs, err)
	}
	return errs
}

// appendUntilKilled is the child of TestCrashSafety: four goroutines append
// to four tunnels and print each returned ID.
func appendUntilKilled(dir string) {
	s, err := registry.OpenStore(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	b, err := Open(Config{MaxRequests: 1 << 20, MaxBytes: 1 << 40, MaxTotalBytes: 1 << 40}, registry.Backing{Store: s}, zap.NewNop())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var mu sync.Mutex // one line at a time
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			tunnel := fmt.Sprintf("t%d", c)
			for n := 0; ; n++ {
				e, err := b.Append(context.Background(), webhook(tunnel, n%200))
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				mu.Lock()
				fmt.Printf("%s %d\n", e.ID, n%200)
				mu.Unlock()
			}
		})
	}
	wg.Wait() // never: the parent kills this process
}
