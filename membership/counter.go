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

// Roster is implemented by Counters that know the names of the live
// members, as Memberlist and Static do. Package hybrid ranks this instance
// by its name among them, to hand out the tokens of a burst that do not
// split evenly (see local.Split): every instance that sees the same members
// computes the same ranks.
type Roster interface {
	// Members returns the names of the members this instance believes
	// alive, self included, sorted in increasing byte order (as
	// slices.Sort sorts strings). It returns a new slice on every call.
	Members() []string
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

	// ErrMessageTooLarge means a message given to a Messenger is longer than
	// MaxMessage bytes; nothing was sent.
	ErrMessageTooLarge = errors.New("membership: message too large")

	// ErrUnknownMember means a message was sent to a name that is not a live
	// member of the cluster (or not connected to the Static's Bus); nothing
	// was sent.
	ErrUnknownMember = errors.New("membership: unknown member")

	// ErrClosed means the Memberlist was closed; nothing was sent.
	ErrClosed = errors.New("membership: closed")
)

// randomSuffix returns 8 random hex digits, to make generated names unique.
func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error.
	return hex.EncodeToString(b[:])
}
