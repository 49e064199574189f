package local

import (
	"testing"
	"time"
)

// TestLapseRunsAtMostTheDefault: an assigned share that ends without an
// Unassign runs the smaller of itself and the default share, rate and burst
// apart, also across a re-split; only Unassign goes back to the default.
func TestLapseRunsAtMostTheDefault(t *testing.T) {
	l := mustNew(t, Config{Limit: 100, Burst: 20, Instances: 4}) // default 25/s, burst 5
	l.AllowN(t0, "low", 1)
	l.AllowN(t0, "high", 1)
	l.Assign(t0, "low", Share{10, 2}, t0.Add(time.Second))
	l.Assign(t0, "high", Share{60, 12}, t0.Add(time.Second))
	at := t0.Add(2 * time.Second)
	l.AllowN(at, "low", 1)
	l.AllowN(at, "high", 1)
	want := map[string]Share{"low": {10, 2}, "high": {25, 5}}
	for _, st := range l.AppendStats(nil) {
		if st.Share != want[st.Key] || !st.Lapsed || st.Assigned {
			t.Errorf("%s lapsed at %+v (lapsed %v, assigned %v); want %+v", st.Key, st.Share, st.Lapsed, st.Assigned, want[st.Key])
		}
	}
	l.SetInstances(at, 20) // default 5/s, burst 1: both capped by it
	for _, st := range l.AppendStats(nil) {
		if st.Share != (Share{5, 1}) {
			t.Errorf("%s after a re-split to 5/s: %+v", st.Key, st.Share)
		}
	}
	l.SetInstances(at, 4)
	l.Unassign(at, "low")
	for _, st := range l.AppendStats(nil) {
		if st.Key == "low" && (st.Share != Share{25, 5} || st.Lapsed) {
			t.Errorf("after Unassign: %+v", st)
		}
	}
}

// TestMarkedKeysAreNotDecidedHere: a marked key counts its attempts and
// reports its mark and hold, never admits, and comes back unmarked with an
// empty bucket; SetNewMark marks keys created after it.
func TestMarkedKeysAreNotDecidedHere(t *testing.T) {
	l := mustNew(t, Config{Limit: 100, Burst: 20, Instances: 4})
	l.AllowN(t0, "k", 1)
	if !l.SetMark("k", 1) || l.SetMark("nope", 1) {
		t.Fatal("SetMark on a known key must succeed, on an unknown one fail")
	}
	r := l.AllowN(t0, "k", 1)
	if r.Allowed || r.Mark != 1 || r.Hold != 0 {
		t.Fatalf("marked, no hold: %+v", r)
	}
	// The answer of a decision made under another mark holds nothing.
	if l.SetHold("k", 2, t0.Add(300*time.Millisecond)) || l.SetHold("nope", 1, t0.Add(300*time.Millisecond)) {
		t.Fatal("SetHold under another mark, or of an unknown key, must fail")
	}
	if r := l.AllowN(t0.Add(50*time.Millisecond), "k", 1); r.Hold != 0 {
		t.Fatalf("held under another mark: %+v", r)
	}
	if !l.SetHold("k", 1, t0.Add(300*time.Millisecond)) {
		t.Fatal("SetHold under the key's mark failed")
	}
	if r := l.AllowN(t0.Add(100*time.Millisecond), "k", 1); r.Hold != 200*time.Millisecond {
		t.Fatalf("held: %+v, want a hold of 200ms", r)
	}
	if r := l.AllowN(t0.Add(400*time.Millisecond), "k", 1); r.Hold != 0 {
		t.Fatalf("hold ended: %+v", r)
	}
	st := l.AppendStats(nil)[0]
	if st.Attempted != 5 || st.Mark != 1 || st.Denied != 0 {
		t.Fatalf("stats of a marked key: %+v", st)
	}
	l.SetMark("k", 0)
	if r := l.AllowN(t0.Add(400*time.Millisecond), "k", 1); r.Allowed {
		t.Fatalf("unmarked: the bucket must start empty, got %+v", r)
	}
	if st := l.AppendStats(nil)[0]; st.Denied != 1 {
		t.Fatalf("denials counted %d, want 1", st.Denied)
	}
	l.SetNewMark(1)
	if r := l.AllowN(t0, "fresh", 1); r.Mark != 1 || r.Allowed {
		t.Fatalf("a key created after SetNewMark: %+v", r)
	}
}

// TestAssignNewAndZeroShare: AssignNew creates a key; the zero share admits
// nothing; a live assignment keeps an idle key from eviction.
func TestAssignNewAndZeroShare(t *testing.T) {
	l := mustNew(t, Config{Limit: 100, Burst: 20, Instances: 4})
	if !l.AssignNew(t0, "k", Share{}, t0.Add(time.Minute)) {
		t.Fatal("AssignNew failed")
	}
	if r := l.AllowN(t0.Add(time.Second), "k", 1); r.Allowed || !r.Assigned {
		t.Fatalf("the zero share admitted: %+v", r)
	}
	if ev := l.EvictIdle(t0.Add(30*time.Second), time.Second, nil); len(ev) != 0 {
		t.Fatalf("evicted %v while its assignment lives", ev)
	}
	if ev := l.EvictIdle(t0.Add(2*time.Minute), time.Second, nil); len(ev) != 1 {
		t.Fatalf("evicted %v after its assignment ended; want the key", ev)
	}
}

// TestLease: a key runs a lease only while it is in force, and is marked
// with the lease's next mark once it ends, with no call in between; SetMark
// ends a lease at once, even into the same mark; a hold never extends it;
// a fresh lease starts with the tokens given it, a renewal keeps its
// bucket's.
func TestLease(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l, err := New(Config{Limit: 100, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	l.SetNewMark(1)
	if r := l.Allow(t0, "k"); r.Mark != 1 || r.Attempted != 1 {
		t.Fatalf("a new key: %+v, want marked 1, one token asked for", r)
	}
	until := t0.Add(time.Second)
	if !l.Lease(t0, "k", Share{Limit: 10, Burst: 5}, until, 3, 2) {
		t.Fatal("Lease of an existing key reported false")
	}
	for i, want := range []bool{true, true, false} { // the 2 tokens given, then none
		if r := l.Allow(t0, "k"); r.Mark != 0 || r.Allowed != want || !r.Assigned {
			t.Fatalf("decision %d on the fresh lease: %+v, want allowed=%v, decided here", i, r, want)
		}
	}
	if l.SetHold("k", 3, t0.Add(time.Hour)) {
		t.Error("SetHold on a key running a lease reported true")
	}
	// Renewed: the bucket keeps its tokens, refilled at the new rate.
	l.Lease(t0.Add(500*time.Millisecond), "k", Share{Limit: 20, Burst: 5}, t0.Add(2*time.Second), 5, 5)
	if r := l.Allow(t0.Add(500*time.Millisecond), "k"); !r.Allowed || r.Remaining != 4 {
		t.Errorf("after a renewal: %+v, want allowed with 4 left (5 refilled at 10/s, none given)", r)
	}
	if r := l.Allow(t0.Add(2*time.Second), "k"); r.Mark != 5 || r.Allowed {
		t.Errorf("at the lease's end: %+v, want marked 5, decided by the caller", r)
	}
	l.Lease(t0.Add(3*time.Second), "k", Share{Limit: 20, Burst: 5}, t0.Add(4*time.Second), 7, 0)
	if !l.SetMark("k", 7) {
		t.Fatal("SetMark of an existing key reported false")
	}
	if r := l.Allow(t0.Add(3*time.Second), "k"); r.Mark != 7 {
		t.Errorf("after SetMark into the lease's own next mark: %+v, want marked 7", r)
	}
	if st, _ := l.Stats("k"); st.Assigned {
		t.Errorf("stats after SetMark: %+v, want no lease in force", st)
	}
}

// TestLeaseOfRateZero: a lease of rate 0 (credit) admits the tokens given
// it and then, unable to admit, ends at once: the request that found it
// spent goes to the caller, under the lease's next mark.
func TestLeaseOfRateZero(t *testing.T) {
	l, err := New(Config{Limit: 100, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	l.SetNewMark(4)
	l.Allow(t0, "k")
	l.Lease(t0, "k", Share{Burst: 2}, t0.Add(time.Minute), 4, 2)
	for i := range 2 {
		if r := l.Allow(t0, "k"); !r.Allowed || r.Mark != 0 {
			t.Fatalf("credit %d: %+v, want admitted here", i, r)
		}
	}
	if r := l.Allow(t0, "k"); r.Allowed || r.Mark != 4 {
		t.Fatalf("credit spent: %+v, want the caller to decide, under mark 4", r)
	}
	if st, _ := l.Stats("k"); st.Assigned {
		t.Errorf("stats after the credit was spent: %+v, want no lease in force", st)
	}
}

// TestCreditID: a credit (Credit) admits its tokens here, and once they
// are spent, or it has ended, the key's decisions go to the caller and
// report its id; a key never handed credit reports 0, and a key decided
// here reports none.
func TestCreditID(t *testing.T) {
	l := mustNew(t, Config{Limit: 100, Burst: 10})
	l.SetNewMark(4)
	if r := l.Allow(t0, "k"); r.Mark != 4 || r.Credit != 0 {
		t.Fatalf("a fresh marked key: %+v, want mark 4, no credit", r)
	}
	l.Credit(t0, "k", 1, t0.Add(time.Second), 4, 77)
	if r := l.Allow(t0, "k"); !r.Allowed || r.Credit != 0 {
		t.Fatalf("the credit: %+v, want admitted here, no id reported", r)
	}
	if r := l.Allow(t0, "k"); r.Allowed || r.Mark != 4 || r.Credit != 77 {
		t.Fatalf("credit spent: %+v, want the caller to decide, credit 77", r)
	}
	l.Credit(t0, "k", 5, t0.Add(time.Second), 4, 78)
	if r := l.Allow(t0.Add(time.Second), "k"); r.Allowed || r.Mark != 4 || r.Credit != 78 {
		t.Fatalf("credit ended: %+v, want the caller to decide, credit 78", r)
	}
}

// TestCreditAfterTheKeyMovedOn: a credit whose answer lands after the key
// moved on (a lease put in force, or another mark) leaves the key as it
// is, and only records its id.
func TestCreditAfterTheKeyMovedOn(t *testing.T) {
	l := mustNew(t, Config{Limit: 100, Burst: 10})
	l.SetNewMark(4)
	l.Allow(t0, "k")
	l.Lease(t0, "k", Share{Limit: 50, Burst: 5}, t0.Add(time.Second), 5, 5)
	l.Credit(t0, "k", 1, t0.Add(time.Second), 4, 77)
	for i := range 5 {
		if r := l.Allow(t0, "k"); !r.Allowed || r.Mark != 0 {
			t.Fatalf("decision %d on the lease after a late credit: %+v, want admitted by the lease", i, r)
		}
	}
	if r := l.Allow(t0.Add(time.Second), "k"); r.Allowed || r.Mark != 5 || r.Credit != 77 {
		t.Fatalf("the lease ended: %+v, want the caller to decide under mark 5, credit 77 named", r)
	}
	l.Credit(t0.Add(time.Second), "k", 3, t0.Add(2*time.Second), 4, 78)
	if r := l.Allow(t0.Add(time.Second), "k"); r.Allowed || r.Mark != 5 || r.Credit != 78 {
		t.Fatalf("a credit under an older mark: %+v, want the caller to decide under mark 5, credit 78 named", r)
	}
	l.Credit(t0.Add(time.Second), "k", 2, t0.Add(2*time.Second), 5, 79)
	if r := l.Allow(t0.Add(time.Second), "k"); !r.Allowed || r.Mark != 0 {
		t.Fatalf("a credit under the key's mark: %+v, want admitted here", r)
	}
}

// TestGive: tokens given back go to a key decided here (unmarked, or on a
// lease in force), up to its burst; a key decided elsewhere (marked, its
// lease ended) takes none. ClearHold ends a marked key's hold.
func TestGive(t *testing.T) {
	l := mustNew(t, Config{Limit: 1, Burst: 4, Instances: 1})
	left := func(key string, at time.Time) int {
		n := 0
		for l.AllowN(at, key, 1).Allowed {
			n++
		}
		return n
	}
	l.AllowN(t0, "k", 3)
	l.Give(t0, "k", 2)
	if got := left("k", t0); got != 3 {
		t.Errorf("3 of 4 taken, 2 given back: %d left, want 3", got)
	}
	l.Give(t0, "k", 9)
	if got := left("k", t0); got != 4 {
		t.Errorf("a give above the burst: %d left, want the burst 4", got)
	}

	l.AllowN(t0, "leased", 1)
	until := t0.Add(time.Second)
	l.Lease(t0, "leased", Share{Limit: 1, Burst: 3}, until, 7, 0)
	l.Give(t0, "leased", 2)
	if got := left("leased", t0); got != 2 {
		t.Errorf("a lease given 2: %d admitted, want 2", got)
	}
	l.Give(until, "leased", 2) // the lease has ended: the key is marked
	if r := l.AllowN(until, "leased", 1); r.Allowed || r.Mark != 7 {
		t.Errorf("after the lease: %+v, want the key passed on under mark 7", r)
	}

	l.SetHold("leased", 7, until.Add(time.Minute))
	if r := l.AllowN(until, "leased", 1); r.Hold <= 0 {
		t.Fatalf("a hold set: %+v", r)
	}
	l.ClearHold("leased")
	if r := l.AllowN(until, "leased", 1); r.Hold != 0 || r.Mark != 7 {
		t.Errorf("after ClearHold: %+v, want no hold, still marked", r)
	}
}
