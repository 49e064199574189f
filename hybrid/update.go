package hybrid

import (
	"time"

	"golang.org/x/time/rate"
)

// SetLimits replaces the Limiter's limits with limits while it runs: it
// adds the limits whose names are new, changes those whose Limit differs
// (rate, burst, mode, outage policy, shadow mode) and removes the others.
// It checks every limit first, as New does, and returns an error wrapping
// ErrConfig, changing nothing, if any is invalid (or if a limit needs Redis
// and the Limiter has no client); after Close it returns ErrClosed. Calls
// are serialised, and each puts its whole set in force at once: decisions
// that start after SetLimits returns see the new limits, and decisions in
// flight finish under the old ones.
//
// A limit keeps its keys, their tokens and its counters across a change.
// Its local quota (Local mode, FailLocal) moves to the new rate/N and
// burst/N at once. A Hybrid limit's exact decisions take the new rate and
// burst at once, and its leases, if the rate or burst changed, are renewed
// at the lease loop's next tick with the new rate, so that within a
// renewal Redis holds grants of the new rate (while the keys of a lowered
// rate wait, within their contended renewals, for the others to give back
// what they held above it: the bound always holds). A limit turned Local
// decides its keys by the local quota at once, and one turned Global by
// the Redis bucket; a limit that stops being Hybrid releases its leases at
// the next tick. A limit turned Hybrid decides its keys exactly at once,
// against each key's pool in Redis, and leases those worth it from the
// next tick on. A limit that starts to use Redis while Redis is
// unreachable starts degraded, as at New.
//
// A removed limit returns ErrUnknownLimit from then on; at the next tick
// its leases are released and its keys forgotten. Its metrics series (the
// children labelled with its name) are deleted, so that its gauges do not
// linger with their last values; added again later, it counts from zero.
//
// SetLimits logs one line naming the limits added, changed and removed,
// and nothing when nothing changed.
func (l *Limiter) SetLimits(limits []Limit) error {
	if err := validateLimits(limits, l.store != nil); err != nil {
		return err
	}
	l.setMu.Lock()
	defer l.setMu.Unlock()
	if l.closed.Load() {
		return ErrClosed
	}
	now := time.Now()
	old := l.set.Load()
	next := &limitSet{byName: make(map[string]*limitEntry, len(limits)), order: make([]*limitEntry, 0, len(limits))}
	var added, changed []string
	removed := l.remove(old, limits)
	var starts []*limitEntry // limits that start degraded
	l.shareMu.Lock()
	for _, lim := range limits {
		prev := old.byName[lim.Name]
		e := prev
		was := prev != nil && prev.degraded.Load()
		switch {
		case prev == nil:
			var err error
			if e, err = l.newEntry(lim, now); err != nil {
				// Not after validateLimits: local.New checks the same.
				l.shareMu.Unlock()
				return err
			}
			added = append(added, lim.Name)
		case prev.Limit != lim:
			e = l.change(prev, lim, now)
			changed = append(changed, lim.Name)
		}
		if e.degraded.Load() && !was {
			starts = append(starts, e)
		}
		next.byName[lim.Name] = e
		next.order = append(next.order, e)
	}
	l.set.Store(next)
	l.shareMu.Unlock()
	l.logChanges(added, changed, removed, starts)
	return nil
}

// remove returns the names of the limits of old that limits leaves out,
// and deletes their metrics series.
func (l *Limiter) remove(old *limitSet, limits []Limit) []string {
	keep := make(map[string]bool, len(limits))
	for _, lim := range limits {
		keep[lim.Name] = true
	}
	var removed []string
	for _, e := range old.order {
		if !keep[e.Name] {
			removed = append(removed, e.Name)
			// Before any new limit of the name resolves its metrics.
			l.m.forget(e.Name)
		}
	}
	return removed
}

// change returns the entry of prev changed to lim at now: the same keys
// and counters, its local quota re-split for lim, degraded if it starts
// to use Redis while Redis is unreachable. Requires shareMu held.
func (l *Limiter) change(prev *limitEntry, lim Limit, now time.Time) *limitEntry {
	e := &limitEntry{Limit: lim, limitState: prev.limitState}
	if usesRedis := lim.Mode != Local; usesRedis != (prev.Mode != Local) {
		on := usesRedis && l.down.Load() != nil
		e.degraded.Store(on)
		e.m.degraded.Set(float64(b2i(on)))
	}
	if lim.Rate != prev.Rate || lim.Burst != prev.Burst {
		// Cannot fail: lim is valid.
		_ = e.loc.SetLimit(now, rate.Limit(lim.Rate), lim.Burst)
		_ = e.keys.SetLimit(now, rate.Limit(lim.Rate), lim.Burst)
	}
	n, rank := l.place(now)
	e.loc.SetPlace(now, placeOf(e, n, rank))
	return e
}

// logChanges logs what a SetLimits changed, if anything, and each limit
// that starts degraded.
func (l *Limiter) logChanges(added, changed, removed []string, starts []*limitEntry) {
	if len(added)+len(changed)+len(removed) > 0 {
		l.log.Info("hybridlimit: limits changed", "added", added, "changed", changed, "removed", removed)
	}
	if d := l.down.Load(); d != nil {
		for _, e := range starts {
			l.log.Warn("hybridlimit: Redis unreachable, limit starts degraded to its outage policy",
				"limit", e.Name, "policy", e.OnOutage.String(), "error", d.cause)
		}
	}
}

// Limits returns the limits in force, in the order given to New or to the
// last SetLimits.
func (l *Limiter) Limits() []Limit {
	set := l.set.Load()
	out := make([]Limit, len(set.order))
	for i, e := range set.order {
		out[i] = e.Limit
	}
	return out
}
