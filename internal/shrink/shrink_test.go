package shrink

import "testing"

func TestMap(t *testing.T) {
	m := map[int]bool{}
	var tr Tracker
	for i := range 4 * From {
		m[i] = true
		tr.Grew(len(m))
	}
	for i := range 3 * From {
		delete(m, i)
	}
	// A quarter left: not yet below it.
	if got := Map(m, &tr); tr.peak != 4*From || len(got) != From {
		t.Fatalf("rebuilt at a quarter of the peak: peak %d, len %d", tr.peak, len(got))
	}
	delete(m, 3*From)
	got := Map(m, &tr)
	if tr.peak != From-1 || len(got) != From-1 {
		t.Fatalf("after falling below a quarter: peak %d, len %d; want the tracker restarted at %d", tr.peak, len(got), From-1)
	}
	got[-1] = true
	if m[-1] {
		t.Fatal("the rebuilt map shares storage with the old one")
	}

	small := map[int]bool{1: true}
	var st Tracker
	st.Grew(From - 1)
	if Map(small, &st); st.peak != From-1 {
		t.Fatal("a map that never reached From was rebuilt")
	}
}

func TestSlice(t *testing.T) {
	p := new(int)
	for _, tc := range []struct {
		name     string
		len, cap int
		wantNil  bool
	}{
		{"small and sparse", 1, From - 1, false},
		{"large and full", From, From, false},
		{"large, a quarter used", From / Below, From, false},
		{"large, under a quarter used", From/Below - 1, From, true},
	} {
		s := make([]*int, tc.len, tc.cap)
		for i := range s {
			s[i] = p
		}
		got := Slice(s)
		switch {
		case tc.wantNil && got != nil:
			t.Errorf("%s: kept a buffer of %d for %d elements", tc.name, tc.cap, tc.len)
		case !tc.wantNil && (got == nil || len(got) != 0 || cap(got) != tc.cap):
			t.Errorf("%s: got len %d cap %d; want the buffer emptied and kept", tc.name, len(got), cap(got))
		case !tc.wantNil && s[:tc.len][0] != nil && tc.len > 0:
			t.Errorf("%s: references left in the reused buffer", tc.name)
		}
	}
}
