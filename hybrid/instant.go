package hybrid

import (
	"math"
	"time"
)

// An instant is a point in time as the engine keeps it: nanoseconds after
// its epoch, 8 bytes where a time.Time takes 24, so that the engine's state
// of a key stays small. Its methods are named as time.Time's and behave
// alike. The zero instant stands for the zero time.Time: it is before every
// other, and so far back that the time since it outlasts any period of the
// engine.
type instant int64

// Add returns a+d, saturated at the largest and smallest instants.
func (a instant) Add(d time.Duration) instant {
	s := a + instant(d)
	switch {
	case d > 0 && s < a:
		return math.MaxInt64
	case d < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// Sub returns a-b, saturated as time.Time's Sub.
func (a instant) Sub(b instant) time.Duration {
	d := time.Duration(a - b)
	switch {
	case b < 0 && d < time.Duration(a):
		return math.MaxInt64
	case b > 0 && d > time.Duration(a):
		return math.MinInt64
	}
	return d
}

// Before reports whether a is before b.
func (a instant) Before(b instant) bool { return a < b }

// After reports whether a is after b.
func (a instant) After(b instant) bool { return a > b }

// Equal reports whether a and b are the same instant.
func (a instant) Equal(b instant) bool { return a == b }

// IsZero reports whether a is the zero instant.
func (a instant) IsZero() bool { return a == 0 }

// epochLead is how far before the first time it converts an epoch starts:
// every instant the engine meets is then far above the zero instant, which
// lies epochLead before that first time (about 36 years: the time since it
// outlasts every period, as the time since time.Time's zero does), while
// the epoch keeps the monotonic clock reading of that time (Go keeps one
// for times from 1885 on).
const epochLead = 1 << 60

// An epoch converts between time.Time and instant. The first non-zero time
// it converts sets its base, so that it keeps that time's monotonic clock
// reading, if any: a step of the wall clock then moves no instant. The
// zero value is ready to use.
type epoch struct {
	base time.Time // epochLead before the first time converted
}

// instant returns t as an instant; the zero time.Time is the zero instant.
func (ep *epoch) instant(t time.Time) instant {
	if t.IsZero() {
		return 0
	}
	if ep.base.IsZero() {
		ep.base = t.Add(-epochLead)
	}
	return instant(t.Sub(ep.base))
}

// time returns a as a time.Time; the zero instant is the zero time.Time.
func (ep *epoch) time(a instant) time.Time {
	if a == 0 {
		return time.Time{}
	}
	return ep.base.Add(time.Duration(a))
}
