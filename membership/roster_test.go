package membership

import (
	"fmt"
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

// TestParseLeaving: a leaving notice carries its sender's name and
// incarnation and nothing else, and a packet of another kind is not taken
// for one.
func TestParseLeaving(t *testing.T) {
	long := strings.Repeat("x", MaxNameLength+1)
	const inc = "0123456789abcdef"
	for _, tc := range []struct {
		name      string
		b         []byte
		from, inc string // from "" when the notice must be refused
	}{
		{"notice", appendLeaving(nil, "api-1", inc), "api-1", inc},
		{"longest name", appendLeaving(nil, long[:MaxNameLength], inc), long[:MaxNameLength], inc},
		{"longest incarnation", appendLeaving(nil, "api-1", long[:maxIncarnation]), "api-1", long[:maxIncarnation]},
		{"incarnation too long", appendLeaving(nil, "api-1", long[:maxIncarnation+1]), "", ""},
		{"no incarnation", appendLeaving(nil, "api-1", ""), "", ""},
		{"name too long", appendLeaving(nil, long, inc), "", ""},
		{"empty name", appendLeaving(nil, "", inc), "", ""},
		{"truncated", appendLeaving(nil, "api-1", inc)[:4], "", ""},
		// What nodes of earlier versions of this package also sent: a
		// message from api-1 (version 1, the name's length, the name, "hi").
		{"an earlier version's message", []byte("\x01\x05api-1hi"), "", ""},
		{"empty", nil, "", ""},
	} {
		from, gotInc, ok := parseLeaving(tc.b)
		if ok != (tc.from != "") || string(from) != tc.from || string(gotInc) != tc.inc {
			t.Errorf("%s: parseLeaving = %q, %q, %v; want %q, %q", tc.name, from, gotInc, ok, tc.from, tc.inc)
		}
	}
}

// TestParseMeta: a node's metadata carries its incarnation and whether it
// is leaving; metadata of another kind carries neither.
func TestParseMeta(t *testing.T) {
	for _, tc := range []struct {
		b       []byte
		inc     string
		leaving bool
	}{
		{appendMeta(nil, "abc", false), "abc", false},
		{appendMeta(nil, "abc", true), "abc", true},
		{nil, "", false},
		// An earlier version's leaving metadata, without an incarnation:
		// not understood, so its departure stays a failure (the safe side).
		{[]byte("hybridlimit:leaving"), "leaving", false},
		{[]byte("other"), "", false},
	} {
		if inc, leaving := parseMeta(tc.b); inc != tc.inc || leaving != tc.leaving {
			t.Errorf("parseMeta(%q) = %q, %v; want %q, %v", tc.b, inc, leaving, tc.inc, tc.leaving)
		}
	}
	if a, b := newIncarnation(), newIncarnation(); len(a) != 16 || a == b {
		t.Errorf("newIncarnation() = %q then %q: want 16 digits, fresh each time", a, b)
	}
}

// TestMemberlistLateLeavingNotice: a leaving notice that arrives after its
// sender's departure was already taken for a failure (the packet overtaken
// by the goodbye, or by failure detection) still reports the leave, once,
// however often it arrives; one about a member still alive only waits for
// its departure; one from a node never seen is dropped.
func TestMemberlistLateLeavingNotice(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	n2 := startNode(t, "n2", nil, n1.Addr())
	waitCount(t, 15*time.Second, 2, n1, n2)
	var r viewRecorder
	stop := n1.WatchView(r.fn)
	defer stop()
	notice := func(name, inc string) { delegate{n1}.NotifyMsg(appendLeaving(nil, name, inc)) }

	notice("never-seen", "0123456789abcdef") // nothing to count out
	if err := n2.close(false); err != nil {  // a crash: its notice is late
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "n1 sees n2 fail", func() bool { return n1.Count() == 1 })
	if got := r.left(); len(got) != 0 {
		t.Fatalf("Left = %v before any notice, want none: a crash is a failure", got)
	}
	notice("n2", n2.incarnation)
	eventually(t, 3*time.Second, "n1 reports the late notice's sender as left", func() bool {
		return slices.Equal(r.left(), []string{"n2"})
	})
	notice("n2", n2.incarnation) // the same notice again: already reported
	n3 := startNode(t, "n3", nil, n1.Addr())
	waitCount(t, 15*time.Second, 2, n1, n3)
	notice("n3", n3.incarnation) // alive: recorded, not reported
	n1.peersMu.Lock()
	recorded := n1.peers["n3"].leaving
	n1.peersMu.Unlock()
	if !recorded || !slices.Equal(r.left(), []string{"n2"}) {
		t.Fatalf("n3's notice recorded %v, Left %v: want recorded, and n3 not reported while alive", recorded, r.left())
	}
	if err := n3.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, "n1 reports n3 as left", func() bool {
		return slices.Equal(r.left(), []string{"n2", "n3"})
	})
	if v, _ := r.last(); v.Count != 1 {
		t.Errorf("last View %+v: want n1 alone", v)
	}
}

// TestMemberlistStaleNoticeThenCrash: a crash of the process that now has
// a name is a failure even if a notice of an earlier process of that name
// arrived while it was alive (without incarnations, the stale notice made
// the crash a graceful leave, counted out at once).
func TestMemberlistStaleNoticeThenCrash(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	n2 := startNode(t, "n2", nil, n1.Addr())
	waitCount(t, 15*time.Second, 2, n1, n2)
	old := n2.incarnation
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	var r viewRecorder
	stop := n1.WatchView(r.fn)
	defer stop()
	eventually(t, 15*time.Second, "n1 sees n2 leave", func() bool { return n1.Count() == 1 })
	n2b := startNode(t, "n2", nil, n1.Addr())
	waitCount(t, 15*time.Second, 2, n1, n2b)
	eventually(t, 3*time.Second, "n1 knows the new n2's incarnation", func() bool {
		n1.peersMu.Lock()
		defer n1.peersMu.Unlock()
		return n1.peers["n2"].inc == n2b.incarnation
	})
	left := len(r.left())
	delegate{n1}.NotifyMsg(appendLeaving(nil, "n2", old))
	if err := n2b.close(false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "n1 sees the new n2 fail", func() bool { return n1.Count() == 1 })
	if got := r.left()[left:]; len(got) != 0 {
		t.Errorf("the crash was reported as a graceful leave (%v): a stale notice counted for it", got)
	}
}

// TestMemberlistConcurrentJoinsConverge: nodes that join through one seed
// at the same time all count every member well before memberlist's
// periodic state exchange (15 s with the Local profile). A joiner whose
// seed had not yet merged another joiner, and had spent its gossip about
// it, would otherwise count one member short, a larger default share,
// until then; each node exchanges state with its seeds once more a second
// after Join (catchUpAfter).
func TestMemberlistConcurrentJoinsConverge(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	seed := startNode(t, "n0", nil)
	const joiners = 8
	nodes := make([]*Memberlist, joiners)
	errs := make([]error, joiners)
	var wg sync.WaitGroup
	for i := range joiners {
		wg.Go(func() {
			nodes[i], errs[i] = Join(Config{Name: fmt.Sprintf("n%d", i+1), BindAddr: "127.0.0.1",
				Seeds: []string{seed.Addr()}, Profile: Local, Logger: testLogger(t)})
		})
	}
	wg.Wait()
	for i, m := range nodes {
		if errs[i] != nil {
			t.Fatalf("Join(n%d): %v", i+1, errs[i])
		}
		t.Cleanup(func() { _ = m.Close() })
	}
	waitCount(t, 5*time.Second, joiners+1, append(nodes, seed)...)
}

// TestAnnounceLeavingWhileMetadataChanges: leaving notices go to copies of
// the members' addresses, so sending one never reads a memberlist node that
// memberlist rewrites when a member's metadata changes (under -race, a send
// to memberlist's own *Node was reported racing with that update). The
// notices cross the network: a member that hears one marks the sender as
// leaving.
func TestAnnounceLeavingWhileMetadataChanges(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	n2 := startNode(t, "n2", nil, n1.Addr())
	n3 := startNode(t, "n3", nil, n1.Addr())
	waitCount(t, 5*time.Second, 3, n1, n2, n3)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			n1.announceLeaving()
		}
	}()
	for i := range 20 {
		n2.leaving.Store(i%2 == 0) // its metadata says so, or not
		if err := n2.ml.UpdateNode(time.Second); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	eventually(t, 5*time.Second, "n3 hears n1's leaving notice", func() bool {
		n3.peersMu.Lock()
		defer n3.peersMu.Unlock()
		return n3.peers["n1"].leaving
	})
}
