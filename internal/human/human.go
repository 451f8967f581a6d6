// Package human formats durations and sizes for people, the same way
// wherever tether prints them, and reads sizes as people write them.
package human

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Age prints a duration the way kubectl prints AGE: precise when short,
// coarser as it grows (45s, 3m20s, 25m, 3h12m, 20h, 3d4h, 12d, 2y30d).
// A negative duration, from clocks that disagree, is 0s.
func Age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	sec := int64(d / time.Second)
	mins, hours, days := sec/60, sec/3600, sec/86400
	switch {
	case sec < 120:
		return fmt.Sprintf("%ds", sec)
	case mins < 10:
		return withRest(mins, "m", sec%60, "s")
	case hours < 3:
		return fmt.Sprintf("%dm", mins)
	case hours < 8:
		return withRest(hours, "h", mins%60, "m")
	case hours < 48:
		return fmt.Sprintf("%dh", hours)
	case days < 8:
		return withRest(days, "d", hours%24, "h")
	case days < 2*365:
		return fmt.Sprintf("%dd", days)
	case days < 8*365:
		return withRest(days/365, "y", days%365, "d")
	}
	return fmt.Sprintf("%dy", days/365)
}

// withRest prints "3h12m", or "3h" when the rest is 0.
func withRest(n int64, unit string, rest int64, restUnit string) string {
	if rest == 0 {
		return fmt.Sprintf("%d%s", n, unit)
	}
	return fmt.Sprintf("%d%s%d%s", n, unit, rest, restUnit)
}

// Bytes prints a byte count in binary units: 512B, 1.5KiB, 20MiB, 3.2GiB.
// Below 10 of a unit it keeps one decimal.
func Bytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatUint(n, 10) + "B"
	}
	v, i := float64(n)/1024, 0
	for v >= 1023.5 && i < len(units)-1 { // what would print as 1024
		v /= 1024
		i++
	}
	if v < 9.95 { // what would print as 10.0
		return fmt.Sprintf("%.1f%ciB", v, units[i])
	}
	return fmt.Sprintf("%.0f%ciB", v, units[i])
}

// byteUnits are the units ParseBytes reads, as people and Kubernetes write
// them: binary ones with or without the B, decimal ones likewise.
var byteUnits = map[string]float64{
	"": 1, "b": 1,
	"ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20,
	"gi": 1 << 30, "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40,
	"k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
}

// ParseBytes reads a size: a number, whole or with a fraction, and an
// optional unit: B, KiB, MiB, GiB, TiB (Ki, Mi, Gi, Ti), or KB, MB, GB, TB
// (K, M, G, T) for powers of 1000; case does not matter. It is what Bytes
// prints, and what a Kubernetes resource quantity says: 64MiB, 64Mi, 1.5GiB.
func ParseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := byteUnits[unit]
	v, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || num == "" || strings.HasPrefix(num, ".") {
		return 0, fmt.Errorf("size %q: want a number of bytes and an optional unit (B, KiB, MiB, GiB, or KB, MB, GB), e.g. 64MiB", s)
	}
	n := math.Round(v * mult)
	if n >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return uint64(n), nil
}
