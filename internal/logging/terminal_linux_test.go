package logging

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY returns the two ends of a new pseudo-terminal, or skips the test
// where the system has none (some containers).
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { _ = ptm.Close() })
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Skipf("unlock pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Skipf("pseudo-terminal number: %v", err)
	}
	pts, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("open pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { _ = pts.Close() })
	return ptm, pts
}

func TestNewAutoFormatOnTerminal(t *testing.T) {
	ptm, pts := openPTY(t)
	log, err := New(pts, Options{})
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hello")
	if err := log.Sync(); err != nil {
		t.Errorf("Sync on a terminal: %v", err)
	}
	buf := make([]byte, 4096)
	n, err := ptm.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	out := string(buf[:n])
	if !strings.Contains(out, "\tINFO\t") || strings.HasPrefix(out, "{") {
		t.Errorf("auto format on a terminal wrote %q, want the console format", out)
	}
}
