package membership

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
)

// Counter reports the live instance count N, self included, and this
// instance's name. Implementations are safe for concurrent use.
type Counter interface {
	// Name is this instance's unique id in the cluster; it is stable for the
	// Counter's lifetime.
	Name() string

	// Count is the live instance count including self. It is at least 1, and
	// at most the configured maximum where there is one. It is cheap enough to
	// call on every decision.
	Count() int

	// Watch calls fn with the new count each time it changes, from a
	// goroutine owned by the Counter, never concurrently with itself and in
	// order; fn must not block. Changes in quick succession may be coalesced
	// into one call with the latest count. Watch returns a function that
	// stops the calls: it is safe to call more than once, and after it
	// returns fn is not running and will not be called again. Because it
	// waits for a running fn to return, stop must not be called from fn.
	Watch(fn func(n int)) (stop func())
}

// View is the membership as one instance sees it at one moment, with the
// graceful leaves since the previous View: what a Roster's watchers are
// given.
type View struct {
	// Count is the live instance count, self included, as Counter.Count
	// reports it at that moment: at least 1.
	Count int

	// Members are the names of the live members this instance knows, self
	// included, sorted. For a Memberlist there are Count of them; a
	// Static's are the Statics connected to its Bus, whatever its count.
	Members []string

	// Left are the members that left gracefully since the previous View
	// given to the same watcher (since Watch for the first), in the order
	// they left. A member that left gracefully called Memberlist.Close or
	// Static.Leave; one that crashed, was declared
	// dead by failure detection or is cut off by a partition is never in
	// Left: it may still be running. A member that left and came back
	// under the same name is in Left and in Members. Nil when none left.
	Left []string
}

// Roster is a Counter that knows its members by name and tells a member
// that left gracefully from one that failed. Memberlist and Static are
// Rosters.
//
// The difference matters to a consumer that must not under-count: a member
// that failed may still be running (a partition, a false verdict of
// failure detection), while one that left gracefully said goodbye itself,
// after it had stopped working. It is only as true as the leaver's order of
// shutdown: an instance must stop its work (hybrid.Limiter.Close) before
// it leaves.
type Roster interface {
	Counter

	// View returns the membership now, with Left nil.
	View() View

	// WatchView calls fn with a View each time the count or the members
	// change or a member leaves gracefully, from the same goroutine as
	// Watch's calls and under the same contract (fn must not block; stop
	// is safe to call more than once and waits for a running fn; it must
	// not be called from fn). Changes in quick succession may be coalesced
	// into one call, but no graceful leave is lost: each View's Left has
	// every graceful leave since the previous one, and was recorded before
	// that View's Count and Members were read, so a leaver is in Members
	// only if it came back.
	WatchView(fn func(View)) (stop func())
}

var (
	_ Roster = (*Memberlist)(nil)
	_ Roster = (*Static)(nil)
)

// Sentinel errors. Errors returned by this package wrap one of them, so that
// errors.Is can tell the cases apart.
var (
	// ErrInvalidConfig means a Config field has a value Join cannot use.
	ErrInvalidConfig = errors.New("membership: invalid config")

	// ErrStart means the local memberlist node could not be started, for
	// example because its address could not be bound.
	ErrStart = errors.New("membership: cannot start node")

	// ErrJoin means no seed answered before Config.JoinTimeout passed or
	// JoinContext's context ended: none could be resolved, reached or
	// accepted this node (wrong address, nothing listening yet, or a
	// different encryption key).
	ErrJoin = errors.New("membership: cannot join cluster")

	// ErrNameInUse means a live member of the cluster already has this
	// node's name, at another address: two nodes of one name would count
	// as one, and each instance would run more than its share of every
	// limit. Give each instance its own Config.Name, or leave it empty.
	ErrNameInUse = errors.New("membership: node name already in use")
)

// randomSuffix returns 8 random hex digits, to make generated names unique.
func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error.
	return hex.EncodeToString(b[:])
}
