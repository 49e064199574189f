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

	l   *Limiter
	ls  *limitEntry
	key string // as held (heldKey)
	n   int
	// at is when the tokens were taken: Redis server time for a decision
	// in Redis (SourceExact, SourceGlobal), this process's clock from
	// before the decision for the others.
	at       time.Time
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
	r := &Reservation{l: l, ls: ls, key: heldKey(key), n: n, at: time.Now()}
	if err := l.decide(ctx, ls, key, n, &r.Decision, &r.at); err != nil {
		return nil, err
	}
	return r, nil
}

// Cancel gives the reservation's tokens back to where they were taken from:
// this instance's bucket of the key (Local mode, a lease, the FailLocal
// quota), or the key's bucket in Redis (Global mode, and a Hybrid key
// decided exactly: one script, bounded by Config.RedisTimeout and by ctx).
// Other instances that hold a denial of the key (see AllowN) learn of the
// refund when they ask Redis again.
//
// A refund puts a bucket back at most where it would be had the request
// never come: had the tokens not been taken, the bucket might have been
// full sooner and lost some of its refill, so a refund is the tokens less
// what the limit refills in the time since the decision (Limit.Rate per
// second), and never lifts a bucket above its burst. A Cancel right after
// the decision (a second limit that denies the same request) gives back
// about all of it; one a second later on a limit of 10/s gives back 10
// tokens less. So the bound holds: what the cluster admits, less the
// requests canceled, stays within rate·w + burst over any window w.
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
	// What the limit refilled since: the bucket here refills at its share
	// of the rate, at most the rate.
	back := float64(r.n) - ls.Rate*now.Sub(r.at).Seconds()
	switch r.Source {
	case SourceLocal:
		ls.loc.Give(now, r.key, back)
	case SourceLease:
		ls.keys.Give(now, r.key, back)
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
		_, err = r.l.store.GiveN(cctx, ls.Name, r.key, ls.Rate, ls.Burst, r.n, r.at)
	} else {
		_, err = r.l.store.GivePool(cctx, ls.Name, r.key, ls.Rate, ls.Burst, r.n, r.at)
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
