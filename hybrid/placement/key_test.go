package placement

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// TestKeySize keeps a tracked key at 88 bytes: keys are held by value in
// the policy's table, so every byte more is a byte more on every key.
func TestKeySize(t *testing.T) {
	if got := unsafe.Sizeof(key{}); got > 88 {
		t.Fatalf("a key takes %d bytes, more than 88", got)
	}
}

// TestClocks checks that a clock rounds as it says and reads back as the
// instant nearest to the time it is read at, on both sides of the epoch
// and across the wrap of its 2^32 milliseconds.
func TestClocks(t *testing.T) {
	const ms = instant(time.Millisecond)
	wrap := instant(1<<32) * ms
	for _, tc := range []struct {
		a, floor, ceil instant
	}{
		{0, 0, 0},
		{1, 0, ms},
		{ms - 1, 0, ms},
		{ms, ms, ms},
		{-1, -ms, 0},
		{-ms, -ms, -ms},
		{-ms - 1, -2 * ms, -ms},
		{wrap + 3*ms + 7, wrap + 3*ms, wrap + 4*ms},
		{50*wrap - 1, 50*wrap - ms, 50 * wrap},
	} {
		// Read back from a time up to 24 days before or after.
		for _, from := range []instant{tc.a, tc.a - wrap/2 + 2*ms, tc.a + wrap/2 - 2*ms} {
			if got := floorClock(tc.a).at(from); got != tc.floor {
				t.Errorf("floorClock(%d) read at %d = %d, want %d", tc.a, from, got, tc.floor)
			}
			if got := ceilClock(tc.a).at(from); got != tc.ceil {
				t.Errorf("ceilClock(%d) read at %d = %d, want %d", tc.a, from, got, tc.ceil)
			}
		}
	}
}

// TestTTLSteps checks the lifetimes of the steps of a lease that settles:
// 600 ms, then 4x at each step up to UncontendedTTL.
func TestTTLSteps(t *testing.T) {
	p := New(cfg(1000, 100))
	var got []string
	for s := ttlStep(0); ; s = p.grown(s) {
		got = append(got, p.ttlOf(s).String())
		if s == ttlLongest {
			break
		}
	}
	if want := "600ms 2.4s 5s"; strings.Join(got, " ") != want {
		t.Errorf("lifetimes %q, want %q", got, want)
	}
}

// A key looked at every ten days, for longer than its clocks' 49 days,
// asks for a lease at each look once it is worth one: its last ask and
// renewal, days old, stay in the past however long the policy runs.
func TestClocksAge(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	days := int(24 * time.Hour / tick)
	for i := range 12 {
		k := 1 + 10*i*days
		got := h.tick(k, 1e9)
		if !strings.HasPrefix(got, "ask ") {
			t.Fatalf("day %d: %q, want an ask", 10*i, got)
		}
		expect(t, fmt.Sprintf("day %d: answer", 10*i), h.answer(Grant{Stale: true}), fmt.Sprintf("mark gen=%d", 3*(i+1)+1))
	}
}

// TestTableAgainstMap runs random puts, lookups, removals and packs on a
// table and on a map side by side: every key held is found, with what was
// written to it, and none other.
func TestTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tb := newTable()
	want := map[string]float64{} // each key's demand
	for step := range 5000 {
		name := fmt.Sprint("k", rng.IntN(700))
		switch op := rng.IntN(20); {
		case op < 10:
			if tb.get(name) == nil {
				k := tb.put(name)
				if k.name != name || k.demand != 0 || k.asked != 0 {
					t.Fatalf("step %d: put(%q) = %+v, want a zero key named so", step, name, *k)
				}
				k.demand = float64(step)
				want[name] = k.demand
			}
		case op < 17:
			tb.remove(name)
			delete(want, name)
		case op < 19:
			if _, held := want[name]; (tb.get(name) != nil) != held {
				t.Fatalf("step %d: get(%q) = %v, want it held: %v", step, name, tb.get(name), held)
			}
		default:
			tb.pack()
		}
		if tb.n != len(want) {
			t.Fatalf("step %d: the table holds %d keys, the map %d", step, tb.n, len(want))
		}
		for name, d := range want {
			if k := tb.get(name); k == nil || k.demand != d {
				t.Fatalf("step %d: get(%q) = %v, want demand %v", step, name, k, d)
			}
		}
		seen := 0
		tb.each(func(k *key) {
			if d, ok := want[k.name]; !ok || k.demand != d {
				t.Fatalf("step %d: each visits %q (demand %v), which the table should not hold", step, k.name, k.demand)
			}
			seen++
		})
		if seen != len(want) {
			t.Fatalf("step %d: each visits %d keys, want %d", step, seen, len(want))
		}
	}
}

// TestTablePacks checks that pack gives back the slots and pages of
// forgotten keys, and that their places are reused before then.
func TestTablePacks(t *testing.T) {
	tb := newTable()
	for i := range 1000 {
		tb.put(fmt.Sprint(i))
	}
	pages := len(tb.pages)
	for i := range 990 {
		tb.remove(fmt.Sprint(i))
	}
	for i := range 500 {
		tb.put(fmt.Sprint("again", i))
	}
	if len(tb.pages) != pages {
		t.Errorf("%d pages after reusing forgotten places, want %d", len(tb.pages), pages)
	}
	for i := range 500 {
		tb.remove(fmt.Sprint("again", i))
	}
	tb.pack()
	if tb.n != 10 || len(tb.slots) != 32 || len(tb.pages) != 1 {
		t.Errorf("packed: %d keys in %d slots and %d pages, want 10 in 32 slots and 1 page", tb.n, len(tb.slots), len(tb.pages))
	}
	for i := 990; i < 1000; i++ {
		if tb.get(fmt.Sprint(i)) == nil {
			t.Errorf("key %d lost in the pack", i)
		}
	}
}
