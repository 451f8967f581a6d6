package config

import (
	"strings"

	"github.com/spf13/pflag"
)

// maxSuggestDistance is how many single-character edits a typo may be from
// a known key and still be suggested.
const maxSuggestDistance = 2

// suggest returns the visible flag name closest to key, ignoring case and
// treating _ as -, or "" when none is within maxSuggestDistance.
func (a *applier) suggest(key string) string {
	want := normalizeKey(key)
	best, bestDist := "", maxSuggestDistance+1
	a.fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Deprecated != "" || a.skip[f.Name] {
			return
		}
		if d := distance(want, normalizeKey(f.Name), bestDist); d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	return best
}

func normalizeKey(s string) string {
	return strings.ToLower(strings.ReplaceAll(s, "_", "-"))
}

// distance is the Levenshtein distance between a and b in bytes, or limit
// when it is limit or more.
func distance(a, b string, limit int) int {
	if d := len(a) - len(b); d >= limit || -d >= limit {
		return limit
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin >= limit {
			return limit
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], limit)
}
