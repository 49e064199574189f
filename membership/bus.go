package membership

import (
	"fmt"
	"slices"
	"sync"
)

// Bus carries messages between Statics in one process, as a memberlist
// cluster carries them between instances over the network: for tests and
// benchmarks that run several instances, each with its own Static, in one
// process. Connect a Static to it with Static.Connect.
//
// A Bus delivers asynchronously, through each receiving Static's bounded
// queue, and drops a message when that queue is full, so a slow receiver
// never blocks a sender; unlike UDP it loses nothing else and keeps each
// sender's order. The zero value is an empty Bus ready to use. A Bus is
// safe for concurrent use and owns no goroutine.
type Bus struct {
	mu      sync.RWMutex
	members map[string]*Static // by name
}

// NewBus returns an empty Bus.
func NewBus() *Bus { return &Bus{} }

// Connect connects s to b: from then on s's Broadcast and Send reach the
// other Statics connected to b, by their names, and s receives what they
// send. A Static is connected to one Bus at a time: connecting it to
// another disconnects it from the first, and Connect(nil) disconnects it.
// Connecting it again to its Bus does nothing.
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

// Broadcast implements Messenger: it queues a copy of msg for every other
// Static connected to s's Bus. Without a Bus there is nobody to tell:
// Broadcast does nothing and returns nil (but still refuses a message
// longer than MaxMessage, as a Memberlist would).
func (s *Static) Broadcast(msg []byte) error {
	if err := checkSize("broadcast", s.name, msg); err != nil {
		return err
	}
	b := s.bus.Load()
	if b == nil {
		return nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, peer := range b.members {
		if peer != s {
			peer.in.deliver(s.name, msg)
		}
	}
	return nil
}

// Send implements Messenger: it queues a copy of msg for the Static named
// to on s's Bus. It returns an error wrapping ErrUnknownMember if no Static
// of that name is connected to the Bus, or if s has no Bus; sending to s's
// own name does nothing and returns nil.
func (s *Static) Send(to string, msg []byte) error {
	if err := checkSize("send", s.name, msg); err != nil {
		return err
	}
	if to == s.name {
		return nil
	}
	var peer *Static
	if b := s.bus.Load(); b != nil {
		b.mu.RLock()
		peer = b.members[to]
		b.mu.RUnlock()
	}
	if peer == nil {
		return fmt.Errorf("%w %q (sending from %q)", ErrUnknownMember, to, s.name)
	}
	peer.in.deliver(s.name, msg)
	return nil
}

// Members returns the names of the Statics connected to s's Bus, s
// included, sorted; without a Bus, s's name alone (as View's Members). The
// list follows Connect, not Set: a Static's count may say more instances
// than the list names, for a test that plays one of many.
func (s *Static) Members() []string { return s.bus.Load().names(s.name) }

// Receive implements Messenger. The Static runs a goroutine to call fn
// until every receiver is stopped.
func (s *Static) Receive(fn func(from string, msg []byte)) (stop func()) {
	return s.in.receive(fn)
}

// Dropped implements Messenger.
func (s *Static) Dropped() uint64 { return s.in.dropped.Load() }
