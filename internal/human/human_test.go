package human

import (
	"testing"
	"time"
)

func TestAge(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Minute, "0s"},
		{0, "0s"},
		{999 * time.Millisecond, "0s"},
		{45 * time.Second, "45s"},
		{119 * time.Second, "119s"},
		{2 * time.Minute, "2m"},
		{3*time.Minute + 20*time.Second, "3m20s"},
		{9*time.Minute + 59*time.Second, "9m59s"},
		{10*time.Minute + 30*time.Second, "10m"},
		{2*time.Hour + 59*time.Minute, "179m"},
		{3 * time.Hour, "3h"},
		{3*time.Hour + 12*time.Minute + 40*time.Second, "3h12m"},
		{8*time.Hour + 30*time.Minute, "8h"},
		{47 * time.Hour, "47h"},
		{48 * time.Hour, "2d"},
		{3*24*time.Hour + 4*time.Hour, "3d4h"},
		{8 * 24 * time.Hour, "8d"},
		{729 * 24 * time.Hour, "729d"},
		{(2*365 + 30) * 24 * time.Hour, "2y30d"},
		{3 * 365 * 24 * time.Hour, "3y"},
		{(9*365 + 100) * 24 * time.Hour, "9y"},
	}
	for _, tc := range tests {
		if got := Age(tc.d); got != tc.want {
			t.Errorf("Age(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestBytes(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{
		{0, "0B"},
		{512, "512B"},
		{1023, "1023B"},
		{1024, "1.0KiB"},
		{1536, "1.5KiB"},
		{10137, "9.9KiB"},
		{10239, "10KiB"},
		{20 << 10, "20KiB"},
		{1<<20 - 1, "1.0MiB"},
		{5 << 20, "5.0MiB"},
		{3<<30 + 200<<20, "3.2GiB"},
		{700 << 40, "700TiB"},
		{1<<64 - 1, "16EiB"},
	}
	for _, tc := range tests {
		if got := Bytes(tc.n); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
	}{
		{"0", 0},
		{"1048576", 1 << 20},
		{"512B", 512},
		{"64MiB", 64 << 20},
		{"64Mi", 64 << 20},
		{"64mib", 64 << 20},
		{" 1.5GiB ", 3 << 29},
		{"2Gi", 2 << 30},
		{"8KiB", 8 << 10},
		{"100MB", 100_000_000},
		{"100M", 100_000_000},
		{"1G", 1_000_000_000},
		{"64 MiB", 64 << 20},
		{"1TiB", 1 << 40},
	} {
		got, err := ParseBytes(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "MiB", "64XB", "-1MiB", "1.2.3MiB", ".5GiB", "64MiBs", "1e3", "99999999999TiB"} {
		if got, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, got)
		}
	}
	for _, n := range []uint64{0, 512, 64 << 20, 3 << 30} {
		if got, err := ParseBytes(Bytes(n)); err != nil || got != n {
			t.Errorf("ParseBytes(Bytes(%d)) = %d, %v", n, got, err)
		}
	}
}
