// Package shrink decides when a map or a slice that grew with a limit's keys
// gives its memory back. Go maps never free the memory of deleted entries,
// and a slice reused across rounds keeps the capacity of its largest round:
// after a burst of keys goes idle, both would hold that burst's memory for
// good.
package shrink

import "maps"

const (
	// Below is the fraction of its peak that what a map or slice holds must
	// fall to before it is rebuilt: 1/Below. Rebuilding at a quarter, not at
	// a half, keeps a key count that swings by 2x from rebuilding every
	// round.
	Below = 4
	// From is the smallest peak worth rebuilding for: below it the memory
	// saved is smaller than the rebuild's garbage.
	From = 64
)

// Tracker remembers the most entries a map has held since it was last
// rebuilt. The zero value is ready to use. It is not safe for concurrent
// use; guard it with the map's lock.
type Tracker struct {
	peak int
}

// Grew records that the map now holds n entries.
func (t *Tracker) Grew(n int) { t.peak = max(t.peak, n) }

// Map returns m, or a copy of m sized for what it holds once that fell below
// 1/Below of the tracked peak; the tracker then starts again from the copy.
func Map[M ~map[K]V, K comparable, V any](m M, t *Tracker) M {
	if t.peak < From || len(m) >= t.peak/Below {
		return m
	}
	m = maps.Collect(maps.All(m)) // inserted anew: sized for what is left
	t.peak = len(m)
	return m
}

// Slice returns s emptied for reuse, with no references left in it, or nil if
// its capacity is at least From and its last use needed less than 1/Below of
// it.
func Slice[S ~[]E, E any](s S) S {
	if Sparse(len(s), cap(s)) {
		return nil
	}
	clear(s)
	return s[:0]
}

// Sparse reports whether a buffer of capacity c that held n elements in its
// last use is worth giving back.
func Sparse(n, c int) bool { return c >= From && n < c/Below }
