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
