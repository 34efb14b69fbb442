package config

import "strings"

// suggest returns the name in names that given most likely misspells, or
// "" when none is close. It is the rule behind every "Did you mean"
// diagnostic the package writes itself, and close to HCL's own: a name
// that differs only in case, or by an edit distance of at most 2 (1 for
// names of five characters or fewer, where two edits turn GOOS into GOGC).
// Earlier names win ties.
func suggest(given string, names []string) string {
	limit := 2
	if len(given) <= 5 {
		limit = 1
	}
	best, bestDist := "", limit+1
	for _, n := range names {
		if strings.EqualFold(given, n) {
			return n
		}
		if d := distance(given, n); d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b, in bytes: every
// name it compares is ASCII.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
