package hybrid

import (
	"fmt"
	"testing"
	"time"
)

// TestCreditBook: a key's credit at fixed instants. It is used a token at
// a time until spent or ended (not at its end), surrendered whole (what is
// left, 0 once ended), added beside what a concurrent decision brought
// with the later end, and ended credits are dropped from memory as it
// grows.
func TestCreditBook(t *testing.T) {
	var b creditBook
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type row struct {
		at   time.Duration
		op   string // "use n", "surrender", "add n until"
		n    int
		end  time.Duration // add: until
		left int           // use: tokens left; surrender: tokens returned
		ok   bool          // use
	}
	for i, r := range []row{
		{at: 0, op: "use", n: 1},
		{at: 0, op: "add", n: 3, end: time.Second},
		{at: 100 * ms, op: "use", n: 1, left: 2, ok: true},
		{at: 200 * ms, op: "use", n: 3, left: 0},
		{at: 300 * ms, op: "use", n: 2, left: 0, ok: true},
		{at: 400 * ms, op: "use", n: 1},
		{at: 400 * ms, op: "add", n: 2, end: time.Second},
		{at: 500 * ms, op: "add", n: 1, end: 1500 * ms},
		{at: 1200 * ms, op: "use", n: 1, left: 2, ok: true},
		{at: 1300 * ms, op: "surrender", left: 2},
		{at: 1300 * ms, op: "use", n: 1},
		{at: 1300 * ms, op: "add", n: 2, end: 2 * time.Second},
		{at: 2 * time.Second, op: "use", n: 1},
		{at: 2 * time.Second, op: "surrender", left: 0},
	} {
		now := at(r.at)
		where := fmt.Sprintf("row %d (%v %s %d)", i, r.at, r.op, r.n)
		switch r.op {
		case "use":
			if left, ok := b.use("k", r.n, now); left != r.left || ok != r.ok {
				t.Fatalf("%s: %d, %v; want %d, %v", where, left, ok, r.left, r.ok)
			}
		case "surrender":
			if got := b.surrender("k", now); got != r.left {
				t.Fatalf("%s: %d; want %d", where, got, r.left)
			}
		case "add":
			b.add("k", r.n, now, at(r.end))
		}
	}
	// Ended credits go once the book has grown.
	for i := range 100 {
		b.add(fmt.Sprint(i), 1, at(10*time.Second), at(11*time.Second))
	}
	b.add("late", 1, at(20*time.Second), at(21*time.Second))
	for i := range 200 {
		b.add(fmt.Sprint("x", i), 1, at(20*time.Second), at(21*time.Second))
	}
	if len(b.keys) != 201 {
		t.Fatalf("%d credits kept; want the 201 live ones", len(b.keys))
	}
}
