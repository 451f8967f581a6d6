// Package human formats durations and sizes for people, the same way
// wherever tether prints them.
package human

import (
	"fmt"
	"strconv"
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
