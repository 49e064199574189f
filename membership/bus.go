package membership

import (
	"fmt"
	"slices"
	"sync"
)

// Bus groups Statics in one process, as a memberlist cluster groups
// instances over the network: for tests and benchmarks that run several
// instances, each with its own Static, in one process. Connect a Static to
// it with Static.Connect: the Statics connected to a Bus know each other
// by name (Static.Members, View), and one that leaves with Static.Leave is
// reported in the others' Views as a graceful leave (View.Left). A
// Static's count stays its owner's to set, except that a Leave lowers the
// others' by one.
//
// The zero value is an empty Bus ready to use. A Bus is safe for
// concurrent use and owns no goroutine.
type Bus struct {
	mu      sync.RWMutex
	members map[string]*Static // by name
}

// NewBus returns an empty Bus.
func NewBus() *Bus { return &Bus{} }

// Connect connects s to b: from then on s's Members name the other Statics
// connected to b, and theirs name s. Nobody's watchers are called for it:
// they see the change in their next View. A Static is connected to one Bus
// at a time: connecting it to another disconnects it from the first, and
// Connect(nil) disconnects it. Connecting it again to its Bus does nothing.
//
// The Statics on a Bus must have distinct names: Connect panics if another
// Static with s's name is connected to b.
func (s *Static) Connect(b *Bus) {
	s.connectMu.Lock()
	defer s.connectMu.Unlock()
	old := s.bus.Load()
	if old == b {
		return
	}
	if b != nil {
		b.mu.Lock()
		if other, ok := b.members[s.name]; ok && other != s {
			b.mu.Unlock()
			panic(fmt.Sprintf("membership: Connect: another Static named %q is connected to this Bus", s.name))
		}
		if b.members == nil {
			b.members = make(map[string]*Static)
		}
		b.members[s.name] = s
		b.mu.Unlock()
	}
	if old != nil {
		old.mu.Lock()
		delete(old.members, s.name)
		old.mu.Unlock()
	}
	s.bus.Store(b)
}

// Leave disconnects s from its Bus as a member leaving the cluster
// gracefully, the way Memberlist.Close does: every other Static connected
// to the Bus lowers its count by one (to no less than 1) and reports s in
// the Left of its next View (see Roster). Disconnecting s with Connect(nil)
// instead, and setting the others' counts, looks like a crash or a
// partition: they do not report s as Left. Leave does nothing when s has
// no Bus.
//
// As with Memberlist.Close, whatever used s must have stopped before
// Leave (close the hybrid.Limiter first): the others may stop counting s
// at once.
func (s *Static) Leave() {
	s.connectMu.Lock()
	defer s.connectMu.Unlock()
	b := s.bus.Load()
	if b == nil {
		return
	}
	b.mu.Lock()
	delete(b.members, s.name)
	peers := make([]*Static, 0, len(b.members))
	for _, p := range b.members {
		peers = append(peers, p)
	}
	b.mu.Unlock()
	s.bus.Store(nil)
	for _, p := range peers {
		// The count first: the leave is recorded after what the next View
		// reads has changed (see notifier.left).
		for {
			n := p.count.Load()
			if p.count.CompareAndSwap(n, max(n-1, 1)) {
				break
			}
		}
		p.nt.left(s.name)
	}
}

// names returns the names of the Statics connected to b, sorted, or self
// alone when b is nil.
func (b *Bus) names(self string) []string {
	if b == nil {
		return []string{self}
	}
	b.mu.RLock()
	names := make([]string, 0, len(b.members))
	for name := range b.members {
		names = append(names, name)
	}
	b.mu.RUnlock()
	if !slices.Contains(names, self) {
		names = append(names, self) // disconnected meanwhile
	}
	slices.Sort(names)
	return names
}

// Members returns the names of the Statics connected to s's Bus, s
// included, sorted; without a Bus, s's name alone (as View's Members). The
// list follows Connect, not Set: a Static's count may say more instances
// than the list names, for a test that plays one of many.
func (s *Static) Members() []string { return s.bus.Load().names(s.name) }
