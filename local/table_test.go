package local

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
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
			// want holds each key's id, which its entry keeps in seen.
			want := map[string]time.Duration{}
			check := func(step int) {
				t.Helper()
				if tb.n != len(want) {
					t.Fatalf("step %d: table holds %d, map %d", step, tb.n, len(want))
				}
				for k, id := range want {
					if e := tb.get(hashOf[k], k); e == nil || e.key != k || e.seen != id {
						t.Fatalf("step %d: get(%q) = %+v, want id %d", step, k, e, id)
					}
				}
				seen := 0
				tb.each(func(e *entry) {
					if id, ok := want[e.key]; !ok || e.seen != id {
						t.Fatalf("step %d: each visits %q (id %d), which the table should not hold", step, e.key, e.seen)
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
					e := tb.put(hashOf[k])
					if *e != (entry{}) {
						t.Fatalf("step %d: put gave %+v, not a zero entry", step, *e)
					}
					e.key, e.seen = k, time.Duration(step)
					want[k] = e.seen
				case op < 9: // look up a key that may be missing
					k := fmt.Sprint("k", rng.IntN(500))
					_, held := want[k]
					if h, ok := hashOf[k]; ok && (tb.get(h, k) != nil) != held {
						t.Fatalf("step %d: get(%q) = %p, want it held: %v", step, k, tb.get(h, k), held)
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
// slots and the pages shrink to what the rest needs, and grow again as
// keys come back.
func TestTableGivesMemoryBack(t *testing.T) {
	var tb table
	for i := range 10_000 {
		tb.put(uint64(i) << 32).key = fmt.Sprint(i)
	}
	if got := len(tb.slots); got != 16384 {
		t.Fatalf("10000 entries in %d slots, want 16384", got)
	}
	tb.removeIf(func(e *entry) bool { return e.key != "1" && e.key != "2" })
	if tb.n != 2 || len(tb.slots) != minSlots || len(tb.pages) != 1 {
		t.Fatalf("after removing all but 2: %d entries in %d slots and %d pages, want %d slots and 1 page",
			tb.n, len(tb.slots), len(tb.pages), minSlots)
	}
	if tb.get(1<<32, "1") == nil || tb.get(2<<32, "2") == nil {
		t.Fatal("a kept entry was lost in the shrink")
	}
	// A quarter of what it could hold stays: no rebuild every round when
	// the key count swings by 2x.
	for i := range 10_000 {
		if i != 1 && i != 2 {
			tb.put(uint64(i) << 32).key = fmt.Sprint(i)
		}
	}
	tb.removeIf(func(e *entry) bool { return e.key >= "5" })
	if len(tb.slots) != 16384 {
		t.Fatalf("%d of 10000 entries left: %d slots, want 16384 kept", tb.n, len(tb.slots))
	}
}

// TestTableReusesRemoved checks that a removed entry's place goes to the
// next key, not to a new one at the end of the pages.
func TestTableReusesRemoved(t *testing.T) {
	var tb table
	for i := range 100 {
		tb.put(uint64(i) << 32).key = fmt.Sprint(i)
	}
	tb.removeIf(func(e *entry) bool { return e.key == "5" || e.key == "50" })
	for i := range 2 {
		tb.put(uint64(100+i) << 32).key = fmt.Sprint(100 + i)
	}
	for i := range 100 {
		if e := tb.at(uint32(i + 1)); e.key == "" {
			t.Errorf("entry %d is empty: %+v", i, *e)
		}
	}
	if len(tb.pages) != 2 || len(tb.pages[0]) != pageSize {
		t.Errorf("%d pages for 100 entries, the first of %d, want 2, the first full", len(tb.pages), len(tb.pages[0]))
	}
}
