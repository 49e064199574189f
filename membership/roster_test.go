package membership

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/internal/gossiptest"
)

// viewRecorder records the Views a watcher is given.
type viewRecorder struct {
	mu    sync.Mutex
	views []View
}

func (r *viewRecorder) fn(v View) {
	r.mu.Lock()
	r.views = append(r.views, v)
	r.mu.Unlock()
}

func (r *viewRecorder) all() []View {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.views)
}

// left returns every name the recorded Views reported as Left, in order.
func (r *viewRecorder) left() []string {
	var names []string
	for _, v := range r.all() {
		names = append(names, v.Left...)
	}
	return names
}

// last returns the latest View, and false if there is none.
func (r *viewRecorder) last() (View, bool) {
	vs := r.all()
	if len(vs) == 0 {
		return View{}, false
	}
	return vs[len(vs)-1], true
}

// TestMemberlistGracefulLeave checks on real memberlist nodes that a
// member that leaves (Close) is reported as Left and gone from the count
// within a gossip round or two, and that one shut down without leaving (a
// crash) is never reported as Left, though failure detection takes it out
// of the count.
func TestMemberlistGracefulLeave(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	n2 := startNode(t, "n2", nil, n1.Addr())
	n3 := startNode(t, "n3", nil, n1.Addr())
	n4 := startNode(t, "n4", nil, n1.Addr())
	// Four nodes converge within a second or two; the deadline is for a
	// busy machine.
	waitCount(t, 15*time.Second, 4, n1, n2, n3, n4)
	if v := n1.View(); v.Count != 4 || !slices.Equal(v.Members, []string{"n1", "n2", "n3", "n4"}) || v.Left != nil {
		t.Fatalf("View() = %+v, want 4 members n1 to n4, none left", v)
	}
	var r viewRecorder
	stop := n1.WatchView(r.fn)
	defer stop()

	start := time.Now()
	if err := n4.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	eventually(t, 3*time.Second, "n1 reports n4 as left", func() bool {
		return slices.Equal(r.left(), []string{"n4"})
	})
	t.Logf("graceful leave reported after %v", time.Since(start))
	v, _ := r.last()
	if v.Count != 3 || !slices.Equal(v.Members, []string{"n1", "n2", "n3"}) {
		t.Errorf("View with the leave = %+v, want count 3, members n1 n2 n3", v)
	}
	if n1.Count() != 3 {
		t.Errorf("Count() = %d after the leave, want 3", n1.Count())
	}

	start = time.Now()
	if err := n3.close(false); err != nil { // no leave message: a crash
		t.Fatalf("crash: %v", err)
	}
	eventually(t, 15*time.Second, "n1 sees the crash", func() bool {
		v, ok := r.last()
		return ok && v.Count == 2
	})
	t.Logf("crash seen after %v", time.Since(start))
	if got := r.left(); !slices.Equal(got, []string{"n4"}) {
		t.Errorf("Left over every View = %v, want n4 only: a crash is not a graceful leave", got)
	}
	v, _ = r.last()
	if !slices.Equal(v.Members, []string{"n1", "n2"}) {
		t.Errorf("View after the crash = %+v, want members n1 n2", v)
	}
}

// TestStaticLeave checks Static's graceful leave over a Bus, and that a
// Static disconnected with Connect, the others' counts set by hand, is not
// reported as Left.
func TestStaticLeave(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	bus := NewBus()
	a, b, c := NewStatic("a", 3), NewStatic("b", 3), NewStatic("c", 3)
	for _, s := range []*Static{a, b, c} {
		s.Connect(bus)
	}
	if v := a.View(); v.Count != 3 || !slices.Equal(v.Members, []string{"a", "b", "c"}) || v.Left != nil {
		t.Fatalf("View() = %+v, want count 3, members a b c", v)
	}
	var r viewRecorder
	stop := a.WatchView(r.fn)
	defer stop()

	c.Leave()
	c.Leave() // no Bus any more: nothing
	eventually(t, 5*time.Second, "a reports c as left", func() bool {
		return slices.Equal(r.left(), []string{"c"})
	})
	want := View{Count: 2, Members: []string{"a", "b"}, Left: []string{"c"}}
	if v, _ := r.last(); v.Count != want.Count || !slices.Equal(v.Members, want.Members) || !slices.Equal(v.Left, want.Left) {
		t.Errorf("View = %+v, want %+v", v, want)
	}
	if a.Count() != 2 || b.Count() != 2 || c.Count() != 3 {
		t.Errorf("counts a=%d b=%d c=%d after c left, want 2 2 3", a.Count(), b.Count(), c.Count())
	}
	if v := c.View(); !slices.Equal(v.Members, []string{"c"}) {
		t.Errorf("the leaver's View = %+v, want itself alone", v)
	}

	// A failure: b is cut off, a is told it counts 1.
	b.Connect(nil)
	a.Set(1)
	eventually(t, 5*time.Second, "a sees count 1", func() bool {
		v, ok := r.last()
		return ok && v.Count == 1
	})
	if got := r.left(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("Left over every View = %v, want c only: Connect(nil) is not a graceful leave", got)
	}
	if v, _ := r.last(); !slices.Equal(v.Members, []string{"a"}) {
		t.Errorf("View after b was cut off = %+v, want members a", v)
	}

	// The count never goes below 1.
	d := NewStatic("d", 1)
	d.Connect(bus)
	a.Leave()
	eventually(t, 5*time.Second, "d counts 1", func() bool { return d.Count() == 1 })
}

// TestNotifierKeepsEveryLeave checks that graceful leaves are not lost
// when the passes that would report them coalesce: a watcher that is busy
// while members leave gets them all in its next View, in order.
func TestNotifierKeepsEveryLeave(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	bus := NewBus()
	statics := []*Static{NewStatic("a", 4), NewStatic("b", 4), NewStatic("c", 4), NewStatic("d", 4)}
	for _, s := range statics {
		s.Connect(bus)
	}
	a := statics[0]
	busy := make(chan struct{})
	release := make(chan struct{})
	var r viewRecorder
	var once sync.Once
	stop := a.WatchView(func(v View) {
		r.fn(v)
		once.Do(func() {
			close(busy)
			<-release
		})
	})
	defer stop()
	a.Set(5) // a first View, during which the others leave
	<-busy
	for _, s := range statics[1:] {
		s.Leave()
	}
	close(release)
	eventually(t, 5*time.Second, "a reports b, c and d as left", func() bool {
		return slices.Equal(r.left(), []string{"b", "c", "d"})
	})
	if v, _ := r.last(); v.Count != 2 || !slices.Equal(v.Members, []string{"a"}) {
		t.Errorf("last View = %+v, want count 2 (5 minus 3 leaves), members a", v)
	}
	if n := len(r.all()); n != 2 {
		t.Errorf("%d Views, want 2: the three leaves coalesced into one", n)
	}
}

// TestMemberlistPartitionIsNotALeave: a member cut off by a gossip
// partition is declared dead by failure detection, like a crashed one, and
// is never reported as Left, even if it then leaves gracefully on its own
// side: it may have been deciding all along.
func TestMemberlistPartitionIsNotALeave(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	nw := gossiptest.NewNetwork(nil)
	t.Cleanup(nw.Shutdown)
	transport := func(group string) func(*Config) {
		tr, err := nw.Transport(group)
		if err != nil {
			t.Fatal(err)
		}
		return func(c *Config) { c.Transport = tr }
	}
	a := startNode(t, "a", transport("left"))
	b := startNode(t, "b", transport("left"), a.Addr())
	c := startNode(t, "c", transport("right"), a.Addr())
	waitCount(t, 5*time.Second, 3, a, b, c)
	var r viewRecorder
	stop := a.WatchView(r.fn)
	defer stop()

	nw.Split("left", "right")
	split := time.Now()
	waitCount(t, 60*time.Second, 2, a, b)
	t.Logf("partition seen after %v", time.Since(split))
	if err := c.Close(); err != nil { // its goodbye reaches nobody
		t.Logf("Close across the partition: %v", err)
	}
	if got := r.left(); len(got) != 0 {
		t.Errorf("Left over every View = %v, want none: a partition is not a graceful leave", got)
	}
	if v, ok := r.last(); !ok || !slices.Equal(v.Members, []string{"a", "b"}) {
		t.Errorf("last View = %+v, want members a b", v)
	}
}

// TestParseLeaving: a leaving notice carries its sender's name and nothing
// else, and is never mistaken for a message (nor a message for a notice).
func TestParseLeaving(t *testing.T) {
	long := strings.Repeat("x", MaxNameLength+1)
	for _, tc := range []struct {
		name string
		b    []byte
		want string // "" when the notice must be refused
	}{
		{"notice", appendLeaving(nil, "api-1"), "api-1"},
		{"longest name", appendLeaving(nil, long[:MaxNameLength]), long[:MaxNameLength]},
		{"name too long", appendLeaving(nil, long), ""},
		{"empty name", appendLeaving(nil, ""), ""},
		{"trailing bytes", append(appendLeaving(nil, "api-1"), 'x'), ""},
		{"truncated", appendLeaving(nil, "api-1")[:4], ""},
		{"a message", appendFrame(nil, "api-1", []byte("hi")), ""},
		{"empty", nil, ""},
	} {
		from, ok := parseLeaving(tc.b)
		if got := string(from); ok != (tc.want != "") || got != tc.want {
			t.Errorf("%s: parseLeaving = %q, %v; want %q", tc.name, got, ok, tc.want)
		}
	}
	if _, _, ok := parseFrame(appendLeaving(nil, "api-1")); ok {
		t.Error("parseFrame accepted a leaving notice")
	}
}

// TestMemberlistLateLeavingNotice: a leaving notice that arrives after its
// sender's departure was already taken for a failure (the packet overtaken
// by the goodbye, or by failure detection) still reports the leave, once;
// one about a member still alive only waits for its departure.
func TestMemberlistLateLeavingNotice(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	n2 := startNode(t, "n2", nil, n1.Addr())
	waitCount(t, 15*time.Second, 2, n1, n2)
	var r viewRecorder
	stop := n1.WatchView(r.fn)
	defer stop()

	n1.heardLeaving("n2") // alive: recorded, not reported
	n1.heardLeaving("gone")
	eventually(t, 3*time.Second, "n1 reports the late notice's sender as left", func() bool {
		return slices.Equal(r.left(), []string{"gone"})
	})
	if v, _ := r.last(); v.Count != 2 {
		t.Errorf("last View %+v: want n2 still counted", v)
	}
}
