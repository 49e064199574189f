package hybrid

import (
	"math"
	"testing"
	"time"
	"unsafe"
)

func TestInstant(t *testing.T) {
	var ep epoch
	a := ep.instant(t0) // sets the epoch
	for _, tc := range []struct {
		name string
		got  any
		want any
	}{
		{"zero time is the zero instant", ep.instant(time.Time{}), instant(0)},
		{"zero instant is the zero time", ep.time(0), time.Time{}},
		{"round trip", ep.time(ep.instant(t0.Add(1234 * time.Millisecond))), t0.Add(1234 * time.Millisecond)},
		{"Sub", ep.instant(t0.Add(time.Second)).Sub(a), time.Second},
		{"Add", a.Add(time.Second), ep.instant(t0.Add(time.Second))},
		{"Before", a.Before(a.Add(1)), true},
		{"After", a.After(a.Add(-1)), true},
		// The zero instant lies decades back, as time.Time's zero does:
		// the time since it outlasts every period of the engine.
		{"since zero", a.Sub(0) > 30*365*24*time.Hour, true},
		{"zero is before", instant(0).Before(a), true},
		{"Add saturates", instant(math.MaxInt64 - 1).Add(time.Hour), instant(math.MaxInt64)},
		{"Add saturates below", instant(math.MinInt64 + 1).Add(-time.Hour), instant(math.MinInt64)},
		{"Sub saturates", instant(math.MaxInt64).Sub(-1), time.Duration(math.MaxInt64)},
		{"Sub saturates below", instant(math.MinInt64).Sub(1), time.Duration(math.MinInt64)},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// TestLeaseSize guards the size of the engine's state of a key, held for
// every key of a Hybrid limit that the engine tracks (BenchmarkMemory's
// lease and exact placements): 224 bytes is its allocation size class;
// one byte more takes the next, 240.
func TestLeaseSize(t *testing.T) {
	if got := unsafe.Sizeof(lease{}); got > 224 {
		t.Errorf("a lease takes %d bytes, want at most 224", got)
	}
}
