package hybrid

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
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

// TestCreditBookHeld: the demand a key's deny cache held, at fixed
// instants: counted only once started (a denial from a pool with no
// rate), each request's tokens decay over global.DemandTau from when it
// was held, as Redis decays a take's; drawing it empties it and stops the
// count; a key never held draws nothing; and demand held long ago is
// dropped from memory as the book grows.
func TestCreditBookHeld(t *testing.T) {
	var b creditBook
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	e := math.Exp(-1)
	type row struct {
		at   time.Duration
		op   string // "start", "hold n", "draw"
		n    int
		want float64 // draw
	}
	for i, r := range []row{
		{at: 0, op: "draw", want: 0},
		{at: 0, op: "hold", n: 1}, // not started: a turn's hold
		{at: 0, op: "draw", want: 0},
		{at: 0, op: "start"},
		{at: 0, op: "hold", n: 1},
		{at: 0, op: "hold", n: 2},
		{at: 500 * ms, op: "start"}, // started already: no change
		{at: time.Second, op: "draw", want: 3 * e},
		{at: time.Second, op: "draw", want: 0},
		{at: time.Second, op: "hold", n: 1},
		{at: 2 * time.Second, op: "start"},
		{at: 2 * time.Second, op: "hold", n: 1},
		{at: 3 * time.Second, op: "hold", n: 1},
		{at: 3 * time.Second, op: "draw", want: e + 1},
		// A decision that took the lock after a later one: counted now.
		{at: 4 * time.Second, op: "start"},
		{at: 5 * time.Second, op: "hold", n: 1},
		{at: 4 * time.Second, op: "hold", n: 1},
		{at: 6 * time.Second, op: "draw", want: 2 * e},
	} {
		now := at(r.at)
		switch r.op {
		case "start":
			b.startHeld("k", now)
		case "hold":
			b.hold("k", r.n, now)
		case "draw":
			if got := b.drawHeld("k", now); math.Abs(got-r.want) > 1e-12 {
				t.Fatalf("row %d (%v draw): %v; want %v", i, r.at, got, r.want)
			}
		}
		// hold takes the lock only while some demand is counted.
		if got := b.counting.Load(); got != int64(len(b.held)) {
			t.Fatalf("row %d: counting %d with %d held demands", i, got, len(b.held))
		}
	}
	// A take gives back the credit and sends the held demand, at once.
	b.add("k", 2, at(7*time.Second), at(8*time.Second))
	b.startHeld("k", at(7*time.Second))
	b.hold("k", 1, at(7*time.Second))
	if back, held := b.beforeTake("k", at(7*time.Second)); back != 2 || held != 1 || b.counting.Load() != 0 {
		t.Fatalf("beforeTake: %d back, %v held, %d still counted; want 2, 1, 0", back, held, b.counting.Load())
	}
	for i := range 100 {
		b.startHeld(fmt.Sprint(i), at(10*time.Second))
	}
	b.startHeld("late", at(10*time.Second+heldForgotten))
	for i := range 200 {
		b.startHeld(fmt.Sprint("x", i), at(10*time.Second+heldForgotten))
	}
	if len(b.held) != 201 || b.counting.Load() != 201 {
		t.Fatalf("%d held demands kept, %d counted; want the 201 recent ones", len(b.held), b.counting.Load())
	}
}

// TestCreditSharesGive: when a key leaves the exact placement for a lease,
// the tokens Redis drained from its pool and the credit it still holds
// here move into its local bucket, up to the lease's burst; the credit is
// gone from the book (it is not handed back to the pool as well), credit
// that has ended moves nothing, and a key still marked takes no tokens.
func TestCreditSharesGive(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name          string
		drained       int
		credit        int
		creditUntil   time.Duration // from t0
		marked        bool
		wantAdmitted  int
		wantBookAfter int
	}{
		{"drained and credit", 3, 4, time.Second, false, 7, 0},
		{"capped at the lease's burst", 8, 4, time.Second, false, 10, 0},
		{"credit ended", 3, 4, 0, false, 3, 0},
		{"nothing to give", 0, 0, 0, false, 0, 0},
		{"still marked", 3, 4, time.Second, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loc, err := local.New(local.Config{Limit: 0.001, Burst: 40, Instances: 4})
			if err != nil {
				t.Fatal(err)
			}
			loc.Allow(t0, "k")
			// A lease of a tenth of a token a second and a burst of 10,
			// after SetMark(0) emptied the bucket, as the engine does.
			loc.SetMark("k", markExact)
			loc.SetMark("k", 0)
			if !loc.Assign(t0, "k", local.Share{Limit: 0.001, Burst: 10}, t0.Add(time.Hour)) {
				t.Fatal("cannot assign k")
			}
			if tc.marked {
				loc.SetMark("k", markExact)
			}
			s := creditShares{Limiter: loc, book: &creditBook{}}
			if tc.credit > 0 {
				s.book.add("k", tc.credit, t0, t0.Add(tc.creditUntil))
			}
			s.Give(t0, "k", tc.drained)
			admitted := 0
			for range 20 {
				if loc.Allow(t0, "k").Allowed {
					admitted++
				}
			}
			if admitted != tc.wantAdmitted {
				t.Errorf("admitted %d after Give, want %d", admitted, tc.wantAdmitted)
			}
			if got := s.book.surrender("k", t0); got != tc.wantBookAfter {
				t.Errorf("the book still holds %d tokens of credit, want %d", got, tc.wantBookAfter)
			}
		})
	}
}
