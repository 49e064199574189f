package membership

import (
	"sync"
	"sync/atomic"
)

// Static is a Counter whose count is set by its owner rather than learned
// from a cluster: for single-instance use and tests. Connected to a Bus
// (see Connect), it names the other Statics connected to it, and learns
// of their graceful leaves. It is safe for concurrent use. It owns a
// goroutine only while it has watchers, so it needs no Close: stopping
// every watcher is enough.
type Static struct {
	name  string
	count atomic.Int64
	nt    *notifier

	connectMu sync.Mutex // serializes Connect
	bus       atomic.Pointer[Bus]
}

// NewStatic returns a Static counter named name with count n. A count below 1
// is treated as 1; an empty name is replaced by a random one.
func NewStatic(name string, n int) *Static {
	if name == "" {
		name = "static-" + randomSuffix()
	}
	s := &Static{name: name}
	s.count.Store(int64(max(n, 1)))
	load := func() int { return int(s.count.Load()) }
	refresh := func() (int, []string) {
		v := s.View()
		return v.Count, v.Members
	}
	s.nt = newNotifier(refresh, load, false)
	return s
}

// Name returns the name given to NewStatic (or the random one chosen there).
func (s *Static) Name() string { return s.name }

// Count returns the current count, at least 1.
func (s *Static) Count() int { return int(s.count.Load()) }

// Set changes the count to n (a count below 1 is treated as 1) and notifies
// the watchers asynchronously if it changed. Set does not wait for them.
func (s *Static) Set(n int) {
	s.count.Store(int64(max(n, 1)))
	s.nt.signal()
}

// Watch implements Counter.
func (s *Static) Watch(fn func(n int)) (stop func()) { return s.nt.watch(fn) }

// View implements Roster. Its Members are the names of the Statics
// connected to s's Bus, s included, or s's name alone without a Bus; its
// Count is s's count, which its owner sets and need not match them.
func (s *Static) View() View {
	return View{Count: s.Count(), Members: s.Members()}
}

// WatchView implements Roster. A View's Left names the Statics that left
// s's Bus with Leave; one disconnected with Connect is not in it, as a
// crashed member would not be.
func (s *Static) WatchView(fn func(View)) (stop func()) {
	return s.nt.watchView(fn, s.View().Members)
}
