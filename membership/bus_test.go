package membership

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestBusConnect: a Static moves between Buses and leaves them; names on a
// Bus are unique.
func TestBusConnect(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	b1, b2 := NewBus(), &Bus{} // the zero Bus is ready to use
	a, b, c := NewStatic("a", 1), NewStatic("b", 1), NewStatic("c", 1)
	members := func(what string, s *Static, want ...string) {
		t.Helper()
		if got := s.Members(); !slices.Equal(got, want) {
			t.Errorf("%s: %s.Members() = %v, want %v", what, s.Name(), got, want)
		}
	}
	a.Connect(b1)
	a.Connect(b1) // again: nothing changes
	b.Connect(b1)
	c.Connect(b2)
	members("a and b on one Bus", a, "a", "b")
	members("a and b on one Bus", b, "a", "b")
	members("c alone on another Bus", c, "c")
	a.Connect(b2)
	members("a moved to c's Bus", a, "a", "c")
	members("a moved to c's Bus", c, "a", "c")
	members("a moved away", b, "b")
	a.Connect(nil)
	members("a disconnected", a, "a")
	members("a disconnected", c, "c")

	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), `"b"`) {
			t.Errorf("connecting a second Static named b: recovered %v, want a panic naming b", r)
		}
	}()
	NewStatic("b", 1).Connect(b1)
}

// TestStaticMembers: a Static names the Statics on its Bus, itself
// included, sorted, and follows Connect; without a Bus it names itself.
func TestStaticMembers(t *testing.T) {
	bus := NewBus()
	self, a, b := NewStatic("c", 3), NewStatic("a", 3), NewStatic("b", 3)
	var r Roster = self
	for _, tc := range []struct {
		connect *Static
		to      *Bus
		want    []string
	}{
		{nil, nil, []string{"c"}},
		{self, bus, []string{"c"}},
		{a, bus, []string{"a", "c"}},
		{b, bus, []string{"a", "b", "c"}},
		{a, nil, []string{"b", "c"}},
		{self, nil, []string{"c"}},
	} {
		if tc.connect != nil {
			tc.connect.Connect(tc.to)
		}
		if got := r.View().Members; !slices.Equal(got, tc.want) {
			t.Errorf("View().Members = %v, want %v", got, tc.want)
		}
	}
}
