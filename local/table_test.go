package local

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestTableAgainstMap runs random puts, lookups and removals on a table and
// on a map side by side. The hashes are drawn from a few values, so that
// keys share homes, clusters wrap round the end of the slots, and some keys
// share a whole hash, and every key must stay where a lookup finds it.
func TestTableAgainstMap(t *testing.T) {
	for _, hashes := range []int{1, 3, 40, 1 << 20} {
		t.Run(fmt.Sprint("hashes=", hashes), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(hashes)))
			hashOf := map[string]uint64{}
			var tb table
			want := map[string]*entry{}
			check := func(step int) {
				t.Helper()
				if tb.n != len(want) {
					t.Fatalf("step %d: table holds %d, map %d", step, tb.n, len(want))
				}
				for k, e := range want {
					if got := tb.get(hashOf[k], k); got != e {
						t.Fatalf("step %d: get(%q) = %p, want %p", step, k, got, e)
					}
				}
				seen := 0
				tb.each(func(e *entry) {
					if want[e.key] != e {
						t.Fatalf("step %d: each visits %q, which the table should not hold", step, e.key)
					}
					seen++
				})
				if seen != len(want) {
					t.Fatalf("step %d: each visits %d entries, want %d", step, seen, len(want))
				}
			}
			for step := range 3000 {
				switch op := rng.IntN(10); {
				case op < 6: // put a key, new or not
					k := fmt.Sprint("k", rng.IntN(500))
					if _, ok := hashOf[k]; !ok {
						// The high half chooses the home, the low half
						// makes whole hashes differ or not.
						v := uint64(rng.IntN(hashes))
						hashOf[k] = v<<32 | v%7
					}
					if tb.get(hashOf[k], k) != nil {
						continue
					}
					e := &entry{key: k}
					tb.put(hashOf[k], e)
					want[k] = e
				case op < 9: // look up a key that may be missing
					k := fmt.Sprint("k", rng.IntN(500))
					if h, ok := hashOf[k]; ok && tb.get(h, k) != want[k] {
						t.Fatalf("step %d: get(%q) = %p, want %p", step, k, tb.get(h, k), want[k])
					}
				default: // remove a random part of the keys
					p := rng.Float64()
					dropped, asked := map[string]bool{}, map[string]bool{}
					tb.removeIf(func(e *entry) bool {
						asked[e.key] = true
						if dropped[e.key] {
							t.Fatalf("step %d: removeIf asked about %q after dropping it", step, e.key)
						}
						if rng.Float64() < p {
							dropped[e.key] = true
							return true
						}
						return false
					})
					for k := range want {
						if !asked[k] {
							t.Fatalf("step %d: removeIf never asked about %q", step, k)
						}
					}
					for k := range dropped {
						delete(want, k)
					}
				}
				check(step)
			}
		})
	}
}

// TestTableGivesMemoryBack fills a table, then empties most of it: the
// slots shrink to what the rest needs, and grow again as keys come back.
func TestTableGivesMemoryBack(t *testing.T) {
	var tb table
	for i := range 10_000 {
		tb.put(uint64(i)<<32, &entry{key: fmt.Sprint(i)})
	}
	if got := len(tb.slots); got != 16384 {
		t.Fatalf("10000 entries in %d slots, want 16384", got)
	}
	tb.removeIf(func(e *entry) bool { return e.key != "1" && e.key != "2" })
	if tb.n != 2 || len(tb.slots) != minSlots {
		t.Fatalf("after removing all but 2: %d entries in %d slots, want %d slots", tb.n, len(tb.slots), minSlots)
	}
	if tb.get(1<<32, "1") == nil || tb.get(2<<32, "2") == nil {
		t.Fatal("a kept entry was lost in the shrink")
	}
	// A quarter of what it could hold stays: no rebuild every round when
	// the key count swings by 2x.
	for i := range 10_000 {
		if i != 1 && i != 2 {
			tb.put(uint64(i)<<32, &entry{key: fmt.Sprint(i)})
		}
	}
	tb.removeIf(func(e *entry) bool { return e.key >= "5" })
	if len(tb.slots) != 16384 {
		t.Fatalf("%d of 10000 entries left: %d slots, want 16384 kept", tb.n, len(tb.slots))
	}
}
