package hybrid

import (
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
)

// TestRankIn checks the rank of an instance among the names seen within
// PeakWindow, at fixed instants.
func TestRankIn(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	abcd := []string{"a", "b", "c", "d"}
	for _, tc := range []struct {
		name    string
		samples []peerSample
		live    int
		self    string
		n, rank int
	}{
		{"alone", []peerSample{{at(0), 1, []string{"a"}}}, 1, "a", 1, 0},
		{"four, the second", []peerSample{{at(0), 4, abcd}}, 4, "b", 4, 1},
		{"four, the last", []peerSample{{at(0), 4, abcd}}, 4, "d", 4, 3},
		{"no names (a Counter without a Roster)", []peerSample{{at(0), 4, nil}}, 4, "a", 4, local.NoRank},
		{"fewer names than the count", []peerSample{{at(0), 4, []string{"a", "b"}}}, 4, "a", 4, local.NoRank},
		{"the live count ran ahead of the names", []peerSample{{at(0), 4, abcd}}, 5, "a", 5, local.NoRank},
		{"self not named", []peerSample{{at(0), 4, abcd}}, 4, "e", 4, local.NoRank},
		// A partition 2|2: each side keeps the names and the count of the
		// window, so nobody's rank moves.
		{"partition, left side", []peerSample{{at(0), 4, abcd}, {at(5), 2, []string{"a", "b"}}}, 2, "b", 4, 1},
		{"partition, right side", []peerSample{{at(0), 4, abcd}, {at(5), 2, []string{"c", "d"}}}, 2, "c", 4, 2},
		// d replaced by e: five names for N-hat 4; ranks stay unique.
		{"replaced, the newcomer", []peerSample{{at(0), 4, abcd}, {at(5), 4, []string{"a", "b", "c", "e"}}}, 4, "e", 4, 4},
		{"replaced, an old one", []peerSample{{at(0), 4, abcd}, {at(5), 4, []string{"a", "b", "c", "e"}}}, 4, "c", 4, 2},
		{"a newcomer sorting first", []peerSample{{at(0), 3, []string{"b", "c", "d"}}, {at(5), 4, []string{"a", "b", "c", "d"}}}, 4, "b", 4, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, rank := rankIn(tc.samples, tc.live, tc.self)
			if n != tc.n || rank != tc.rank {
				t.Errorf("rankIn = N-hat %d rank %d, want %d and %d", n, rank, tc.n, tc.rank)
			}
		})
	}
}

// TestRankSharesNeverExceedTheBurst checks the bursts the instances hold
// at their local quotas (default shares, in package local: Local mode and
// FailLocal), summed over the instances that may be running, as
// their views of the window move: views that agree sum to at most the
// burst (exactly, when all N-hat instances are named); and while a name
// ages out of some views but not yet of others, or a partition splits the
// live names, the mix still sums to at most the burst.
func TestRankSharesNeverExceedTheBurst(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	names := []string{"a", "b", "c", "d", "e", "f"}
	for burst := 1; burst <= 14; burst++ {
		for size := 1; size <= len(names); size++ {
			all := names[:size]
			// All views agree on all the names: exactly the burst.
			sum := 0
			for _, self := range all {
				n, rank := rankIn([]peerSample{{t0, size, all}}, size, self)
				sum += rankShare(burst, n, rank)
			}
			if sum != burst {
				t.Errorf("burst %d, %d instances agreeing: %d", burst, size, sum)
			}
			// Instance gone departs the window: a view either still holds
			// it (old) or not (new). Every mix of views over the others.
			for gone := range size {
				var left []string
				for i, s := range all {
					if i != gone {
						left = append(left, s)
					}
				}
				old := []peerSample{{t0, size, all}, {t0.Add(time.Second), size - 1, left}}
				aged := []peerSample{{t0.Add(time.Second), size - 1, left}}
				for mask := range 1 << len(left) {
					sum := 0
					for i, self := range left {
						view := old
						if mask&(1<<i) != 0 {
							view = aged
						}
						n, rank := rankIn(view, size-1, self)
						sum += rankShare(burst, n, rank)
					}
					if sum > burst {
						t.Errorf("burst %d, %s left %v, views %b: %d", burst, all[gone], left, mask, sum)
					}
				}
			}
			// A partition: each side sees only its live names, and keeps the
			// window's. All instances still run.
			for cut := 1; cut < size; cut++ {
				sum := 0
				for i, self := range all {
					side := all[:cut]
					if i >= cut {
						side = all[cut:]
					}
					view := []peerSample{{t0, size, all}, {t0.Add(time.Second), len(side), side}}
					n, rank := rankIn(view, len(side), self)
					sum += rankShare(burst, n, rank)
				}
				if sum != burst {
					t.Errorf("burst %d, partition %v|%v: %d", burst, all[:cut], all[cut:], sum)
				}
			}
		}
	}
}

// TestRankShareMonotone checks what the argument for ages-out relies on:
// a local quota's burst never grows with its rank or N-hat.
func TestRankShareMonotone(t *testing.T) {
	for burst := 1; burst <= 30; burst++ {
		for n := 1; n <= 12; n++ {
			for rank := range n {
				b := rankShare(burst, n, rank)
				if rank > 0 && rankShare(burst, n, rank-1) < b {
					t.Errorf("burst %d n %d: rank %d has %d, rank %d less", burst, n, rank, b, rank-1)
				}
				if n > 1 && rank < n-1 && rankShare(burst, n-1, rank) < b {
					t.Errorf("burst %d rank %d: n %d has %d, n %d less", burst, rank, n, b, n-1)
				}
			}
		}
	}
}
