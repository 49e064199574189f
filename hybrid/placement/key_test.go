package placement

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// TestKeySize keeps a tracked key at 72 bytes, 88 with its name: keys are
// held by value in the policy's table, so every byte more is a byte more
// on every key.
func TestKeySize(t *testing.T) {
	if got := unsafe.Sizeof(key{}); got > 72 {
		t.Fatalf("a key takes %d bytes, more than 72", got)
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
