package hybrid

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Reservation is a decision whose tokens can be given back: Reserve's
// answer. A request that one limit admits and a later check turns away (a
// second limit denies it, the handler finds it invalid) calls Cancel, so
// that it does not count against the first limit.
type Reservation struct {
	// Decision is the decision, as AllowN would have returned it.
	Decision

	l        *Limiter
	ls       *limitEntry
	key      string // as held (heldKey)
	n        int
	canceled atomic.Bool
}

// Reserve is AllowN, with a Reservation whose Cancel gives the tokens back
// if the request does not go ahead. It returns the errors of AllowN, with a
// nil Reservation.
func (l *Limiter) Reserve(ctx context.Context, limit, key string, n int) (*Reservation, error) {
	ls, err := l.entry(limit)
	if err != nil {
		return nil, err
	}
	r := &Reservation{l: l, ls: ls, key: heldKey(key), n: n}
	if err := l.decide(ctx, ls, key, n, &r.Decision); err != nil {
		return nil, err
	}
	return r, nil
}

// Cancel gives the reservation's tokens back to where they were taken from:
// this instance's bucket of the key (Local mode, a lease, the FailLocal
// quota), or the key's bucket in Redis (Global mode, and a Hybrid key
// decided exactly: one script, bounded by Config.RedisTimeout and by ctx).
// Other instances that hold a denial of the key (see AllowN) learn of
// the refund when they ask Redis again.
//
// A refund never lifts a bucket above its burst, nor gives back more than
// was taken, so the limit's bound holds: what the cluster admits, less
// what is given back, stays within rate·w + burst over any window w.
//
// Cancel does nothing for a denial, a shadowed decision (nothing was
// taken), a FailOpen admission (nothing was counted), a reservation
// canceled before, or after Close; nor for a lease's tokens once the key's
// lease has ended (they went with it). It is safe to call from any
// goroutine. It returns an error only when Redis could not take tokens
// back: they are then lost to the limit, which errs on the safe side.
func (r *Reservation) Cancel(ctx context.Context) error {
	if r == nil || !r.Allowed || r.Shadowed || r.l.closed.Load() || !r.canceled.CompareAndSwap(false, true) {
		return nil
	}
	ls, now := r.ls, time.Now()
	switch r.Source {
	case SourceLocal:
		ls.loc.Give(now, r.key, r.n)
	case SourceLease:
		ls.keys.Give(now, r.key, r.n)
	case SourceExact, SourceGlobal:
		return r.giveBack(ctx)
	}
	return nil
}

// giveBack gives the tokens of r back to the key's bucket in Redis: its
// pool for a Hybrid key, its token bucket in Global mode.
func (r *Reservation) giveBack(ctx context.Context) error {
	ls := r.ls
	cctx, cancel := context.WithTimeout(ctx, r.l.cfg.RedisTimeout)
	defer cancel()
	var err error
	if r.Source == SourceGlobal {
		_, err = r.l.store.GiveN(cctx, ls.Name, r.key, ls.Rate, ls.Burst, r.n)
	} else {
		_, err = r.l.store.GivePool(cctx, ls.Name, r.key, ls.Rate, ls.Burst, r.n)
	}
	ls.sent(1)
	if err != nil {
		ls.m.redisErrors.Inc()
		return fmt.Errorf("hybrid: limit %q: giving back %d tokens: %w", ls.Name, r.n, redact(err, r.key))
	}
	if r.Source == SourceExact {
		// The key's next request here asks the pool again rather than
		// wait for a turn handed out before the refund.
		ls.keys.ClearHold(r.key)
	}
	return nil
}
