package hybrid

import (
	"context"
	"math"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/hybrid/placement"
	"github.com/hybridlimit/hybridlimit/internal/shrink"
	"github.com/hybridlimit/hybridlimit/local"
)

// store is the part of global.Store the Limiter uses.
type store interface {
	AskLeases(ctx context.Context, asks []global.LeaseAsk, out []global.LeaseGrant) error
	TakeN(ctx context.Context, limit, key string, rate float64, burst, n int) (global.Take, error)
	TakePool(ctx context.Context, r global.PoolTake) (global.Take, error)
	GiveN(ctx context.Context, limit, key string, rate float64, burst, n int, takenAt time.Time) (int64, error)
	GivePool(ctx context.Context, limit, key string, rate float64, burst, n int, takenAt time.Time) (int64, error)
	Ping(ctx context.Context) error
	Check(ctx context.Context) error
	Definitions(ctx context.Context, limit, instance, def string, ttl time.Duration) (map[string]string, error)
}

var _ store = (*global.Store)(nil)

// health tells from Redis's answers whether it is gone. Every live lease
// renews within UncontendedTTL/RenewDivisor, so that long (plus a tick)
// without any answer means Redis is gone, not just the nodes of the keys in
// one batch. Owned by the loop.
type health struct {
	quiet    time.Duration // UncontendedTTL/RenewDivisor + Tick
	answered time.Time     // when Redis last answered
}

// ok records an answer at t.
func (h *health) ok(t time.Time) { h.answered = t }

// silent reports whether Redis has not answered for long enough at now that
// the limits should degrade.
func (h *health) silent(now time.Time) bool { return now.Sub(h.answered) >= h.quiet }

// batch is one tick's worth of lease asks and releases, reused across ticks.
type batch struct {
	asks    []global.LeaseAsk
	out     []global.LeaseGrant
	refs    []ref
	outs    []placement.Out // what one call of a policy returned
	evicted []string
	quiet   int // ticks in a row that used a small part of the buffers
}

// ref is what an ask of a batch was for.
type ref struct {
	ls *limitEntry
	o  placement.Out
}

// shrinkAfter is how many ticks in a row the batches must have used less
// than 1/shrink.Below of their buffers before these are given back: a
// burst of keys went idle, or a first round of leases for many keys is
// over. Ticks, not one tick, so that a batch that is small every other
// tick keeps its buffers.
const shrinkAfter = 40

// quotaEvictEvery is how often the idle keys of the local quotas (Local
// limits, FailLocal) are evicted: a walk over every key, which a tick
// would repeat too often for a limit of millions of one-shot keys.
const quotaEvictEvery = time.Second

// reset empties b for the next tick, giving its buffers back once they have
// been mostly unused for shrinkAfter ticks.
func (b *batch) reset() {
	if shrink.Sparse(len(b.asks), cap(b.asks)) {
		b.quiet++
	} else {
		b.quiet = 0
	}
	if b.quiet >= shrinkAfter {
		*b = batch{}
		return
	}
	clear(b.asks)
	b.asks = b.asks[:0]
	clear(b.refs)
	b.refs = b.refs[:0]
	clear(b.out) // drops the errors of the last answers
	b.outs = b.outs[:0]
	clear(b.evicted)
	b.evicted = b.evicted[:0]
}

// loop is the Limiter's one background goroutine: every tick it evicts idle
// keys and renews, in one pipeline, the leases of every key that is due.
func (l *Limiter) loop() {
	defer close(l.done)
	t := time.NewTicker(l.cfg.Tick)
	defer t.Stop()
	var b batch
	for {
		select {
		case <-l.quit:
			return
		case <-t.C:
		}
		l.tick(time.Now(), &b)
	}
}

// tick is one round of the loop at now: put changes of the limits in force,
// ask every Hybrid limit's policy what to send, send it, hand back the
// answers.
func (l *Limiter) tick(now time.Time, b *batch) {
	b.reset()
	// The names may change with the count unchanged (one leaves as another
	// joins): look at them at every tick, for the ranks.
	l.observe(now, l.members.Count(), l.roster())
	n := l.peak(now)
	set := l.reconcile(now, n, b)
	resettle := l.resettle.Swap(false)
	evictQuotas := now.Sub(l.quotasEvicted) >= quotaEvictEvery
	if evictQuotas {
		l.quotasEvicted = now
	}
	probe := false
	for _, ls := range set.order {
		l.logUnlogged(ls)
		// The largest recent count may have aged out of PeakWindow.
		l.resplit(ls, now, n)
		// A degraded limit recovers when Redis answers: a renewal, or a
		// probe when there is none (a Global limit, or a Hybrid one whose
		// keys ask for nothing).
		probe = probe || (ls.degraded.Load() && ls.Mode != Local)
		if evictQuotas {
			ls.loc.EvictIdle(now, l.cfg.IdleAfter, nil)
		}
		if ls.pol != nil {
			if resettle {
				ls.pol.Resettle(now)
			}
			l.evict(now, ls, b)
			l.collect(now, n, ls, b)
		}
	}
	if now.Sub(l.definitionsAt) >= definitionsEvery {
		l.definitionsAt = now
		l.compareDefinitions(set)
	}
	suspect := l.exactFailed.Swap(false)
	switch {
	case len(b.asks) > 0:
		l.renew(now, b)
	case probe || suspect:
		l.probe(set)
	}
}

// reconcile puts the limits as configured now in force in the loop's own
// state, adding to b the releases that takes, and returns them. A limit
// that SetLimits removed has its leases released and its keys forgotten; a
// limit that became Hybrid gets a policy, one that stopped being Hybrid
// loses it (its leases released, its keys forgotten), and the policy of one
// whose rate or burst changed takes the new values and renews every lease
// at now.
func (l *Limiter) reconcile(now time.Time, n int, b *batch) *limitSet {
	set := l.set.Load()
	if set != l.seen {
		for _, e := range l.seen.order {
			if cur := set.byName[e.Name]; cur == nil || cur.limitState != e.limitState {
				l.retire(e, b)
			}
		}
		l.seen = set
		l.definitionsAt = time.Time{} // compare the new definitions at once
	}
	for _, e := range set.order {
		if e.applied != e.Limit {
			l.apply(now, e, b)
		}
	}
	return set
}

// apply puts e's Limit in force in the loop's state of e.
func (l *Limiter) apply(now time.Time, e *limitEntry, b *batch) {
	was := e.applied
	e.applied = e.Limit
	switch {
	case e.Mode != Hybrid && e.pol != nil:
		l.retire(e, b)
	case e.Mode == Hybrid && e.pol == nil:
		e.pol = placement.New(placement.Config{Rate: e.Rate, Burst: e.Burst,
			Tick: l.cfg.Tick, ContendedTTL: l.cfg.ContendedTTL, UncontendedTTL: l.cfg.UncontendedTTL})
	case e.Mode == Hybrid && (was.Rate != e.Rate || was.Burst != e.Burst):
		e.pol.SetLimit(now, e.Rate, e.Burst)
	}
}

// retire adds to b the releases of every record of e's keys, a limit
// SetLimits removed or changed from Hybrid, or one the Limiter closes, and
// forgets its keys.
func (l *Limiter) retire(e *limitEntry, b *batch) {
	if e.pol != nil {
		for i := range e.keys.Shards() {
			e.stats = e.keys.AppendShardStats(i, e.stats[:0])
			for j := range e.stats {
				o := e.pol.Release(e.stats[j].Key, e.stats[j].Mark)
				e.keys.SetMark(o.Key, o.Gen)
				b.asks = append(b.asks, l.leaseAsk(e, &o))
				b.refs = append(b.refs, ref{ls: e, o: o})
			}
		}
		e.stats = shrink.Slice(e.stats)
		e.pol = nil
	}
	e.failingKeys.Store(0)
	e.m.leasedRate.Set(0)
	e.m.contendedKeys.Set(0)
	// Every key is idle as seen from this far ahead.
	e.keys.EvictIdle(time.Now().Add(math.MaxInt64), 0, nil)
}

// evict forgets the keys of ls idle for IdleAfter, adding to b the releases
// of their leases.
func (l *Limiter) evict(now time.Time, ls *limitEntry, b *batch) {
	b.evicted = ls.keys.EvictIdle(now, l.cfg.IdleAfter, b.evicted[:0])
	for _, k := range b.evicted {
		b.outs = ls.pol.Forget(k, b.outs[:0])
		l.carryOut(ls, b)
	}
	ls.pol.Compact()
}

// collect adds to b the lease asks and releases of ls that are due, puts
// the policy's marks in force, and updates the limit's gauges.
func (l *Limiter) collect(now time.Time, n int, ls *limitEntry, b *batch) {
	ls.pol.SetDegraded(ls.degraded.Load())
	var g placement.Gauges
	failing := 0
	// A shard at a time: the snapshot holds one shard's keys, not every
	// key's, and its buffer stays small.
	for i := range ls.keys.Shards() {
		ls.stats = ls.keys.AppendShardStats(i, ls.stats[:0])
		for j := range ls.stats {
			st := &ls.stats[j]
			if st.Flagged {
				failing++
			}
			ps := placement.Stats{Key: st.Key, Asked: st.Attempted, Created: st.Created, LastSeen: st.LastSeen}
			b.outs = ls.pol.Step(now, n, &ps, b.outs[:0], &g)
			l.carryOut(ls, b)
		}
	}
	ls.stats = shrink.Slice(ls.stats)
	l.countFailing(ls, failing)
	ls.m.leasesExpired.Add(float64(g.Expired))
	ls.m.leasedRate.Set(g.Leased)
	ls.m.contendedKeys.Set(float64(g.Contended))
}

// carryOut does what the policy of ls returned in b.outs: marks and grants
// at once, in the keys' local limiters; asks and releases into b, sent at
// the end of the tick.
func (l *Limiter) carryOut(ls *limitEntry, b *batch) {
	for _, o := range b.outs {
		switch o.Kind {
		case placement.Mark:
			ls.keys.SetMark(o.Key, o.Gen)
		case placement.Assign:
			ls.keys.Lease(time.Now(), o.Key, local.Share{Limit: rate.Limit(o.Rate), Burst: o.Burst}, o.Until, o.Gen, o.Give)
		case placement.Ask, placement.Release:
			b.asks = append(b.asks, l.leaseAsk(ls, &o))
			b.refs = append(b.refs, ref{ls: ls, o: o})
		}
	}
	b.outs = b.outs[:0]
}

// leaseAsk is the request to Redis of the ask or release o of ls.
func (l *Limiter) leaseAsk(ls *limitEntry, o *placement.Out) global.LeaseAsk {
	return global.LeaseAsk{
		Limit: ls.Name, Key: o.Key, Instance: l.members.Name(), Gen: o.Gen,
		Want: o.Want, Release: o.Kind == placement.Release,
		Rate: ls.Rate, Burst: ls.Burst, Instances: max(ls.loc.Instances(), 1),
		TTL: max(o.TTL, l.cfg.ContendedTTL), MaxTTL: l.cfg.UncontendedTTL,
		Running: o.Running, RunningFor: o.RunningFor, Drain: o.Drain, Recorded: o.Recorded,
		// What a contended key's renewal takes to land: a shorter pulse
		// elsewhere would end before the cut it asked for.
		YoungFor: l.cfg.ContendedTTL / placement.RenewDivisor,
	}
}

// renew sends b, made at sent, in pipelines (sendAsks), and hands the
// answers to the policies.
func (l *Limiter) renew(sent time.Time, b *batch) {
	answered, failed := l.sendAsks(b)
	l.m.renewal.Observe(time.Since(sent).Seconds())
	for _, r := range b.refs {
		r.ls.sent(1)
	}
	if !answered {
		l.batchFailed(sent, b, failed)
		return
	}
	l.health.ok(sent)
	l.setAllDegraded(false, nil)
	for i := range b.refs {
		l.answered(sent, b, &b.refs[i], &b.out[i])
	}
}

// sendAsks sends b's asks and puts their answers in b.out, in pipelines of
// askChunk, each within RedisTimeout: when many keys become worth a lease
// at once, one pipeline of them all may outlast it, fail, and be sent
// again at every tick. It reports whether any pipeline was answered, and
// the error of the last that was not.
func (l *Limiter) sendAsks(b *batch) (answered bool, failed error) {
	if cap(b.out) < len(b.asks) {
		b.out = make([]global.LeaseGrant, len(b.asks))
	}
	b.out = b.out[:len(b.asks)]
	clear(b.out)
	for i := 0; i < len(b.asks); i += askChunk {
		j := min(i+askChunk, len(b.asks))
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
		err := l.store.AskLeases(ctx, b.asks[i:j], b.out[i:j])
		cancel()
		if err != nil {
			failed = err
			for k := i; k < j; k++ {
				b.out[k] = global.LeaseGrant{Err: err}
			}
			continue
		}
		answered = true
	}
	return answered, failed
}

// answered hands the answer res to the request r of batch b, sent at sent,
// to its limit's policy, and carries out what the policy says.
func (l *Limiter) answered(sent time.Time, b *batch, r *ref, res *global.LeaseGrant) {
	if r.o.Kind == placement.Release {
		if res.Err == nil {
			r.ls.m.leasesReleased.Inc()
		}
		return
	}
	if r.ls.pol == nil {
		return // retired since
	}
	if res.Err != nil {
		r.ls.m.redisErrors.Inc()
		r.ls.pol.Failed(sent, &r.o)
		if !global.IsReplyError(res.Err) {
			// A reply error (WRONGTYPE at the key, NOPERM) is about this
			// key's requests only, which are denied: not an outage of it.
			l.keyFailed(r.ls, r.o.Key, redact(res.Err, r.o.Key))
		}
		return
	}
	r.ls.keys.SetFlag(r.o.Key, false)
	g := placement.Grant{Granted: res.Granted, Fair: res.Fair, Demand: res.Demand, Contended: res.Contended,
		Lost: res.Lost, Stale: res.Stale, In: res.In, Drained: res.Drained, Answered: time.Now()}
	b.outs = r.ls.pol.Answer(sent, &r.o, &g, b.outs[:0])
	for _, o := range b.outs {
		if o.Kind == placement.Assign {
			r.ls.m.leasesGranted.Inc()
		}
	}
	l.carryOut(r.ls, b)
}

// batchFailed handles a batch that got no answer at all. Each key of it
// keeps what it runs until its lease ends, then decides exactly; the limits
// as a whole degrade only when nothing has answered for a while (see
// health), so that a batch that happened to hold only keys of one dead
// Cluster node does not degrade the keys of the live ones. A PING that
// some node answers says Redis is there.
func (l *Limiter) batchFailed(sent time.Time, b *batch, err error) {
	for i := range b.refs {
		r := &b.refs[i]
		r.ls.m.redisErrors.Inc()
		if r.o.Kind == placement.Ask && r.ls.pol != nil {
			r.ls.pol.Failed(sent, &r.o)
			l.keyFailed(r.ls, r.o.Key, err)
		}
	}
	if l.health.silent(sent) && l.ping() == nil {
		l.health.ok(time.Now())
	}
	if l.health.silent(sent) {
		l.setAllDegraded(true, &cause{err: err})
	}
}

// keyFailed records that an ask for key of ls got no answer: the key is
// flagged failing (see Status.FailingKeys), cause kept for the log line.
func (l *Limiter) keyFailed(ls *limitEntry, key string, cause error) {
	ls.keys.SetFlag(key, true)
	ls.failCause.Store(&cause)
}

// countFailing puts n, the keys of ls flagged failing at this tick (their
// last ask or take got no answer while the limit is not degraded), in
// Status, and logs when the first key starts failing and when the last
// one recovers.
func (l *Limiter) countFailing(ls *limitEntry, n int) {
	switch was := ls.failingKeys.Swap(int64(n)); {
	case was == 0 && n > 0:
		var cause error
		if c := ls.failCause.Load(); c != nil {
			cause = *c
		}
		l.log.Warn("hybridlimit: Redis requests failing for some keys while Redis answers; they follow the outage policy once their leases run out, until a request succeeds",
			"limit", ls.Name, "policy", ls.OnOutage.String(), "keys", n, "error", cause)
	case was > 0 && n == 0:
		l.log.Info("hybridlimit: Redis requests succeed again for every key", "limit", ls.Name)
	}
}

// setAllDegraded degrades, or restores, every limit that uses Redis; c
// says why it degrades them (nil when they recover).
func (l *Limiter) setAllDegraded(on bool, c *cause) {
	set := l.set.Load()
	if on {
		if l.down.Load() == nil {
			l.down.Store(&outage{cause: l.why(c)})
		}
	} else if l.down.Load() != nil {
		l.down.Store(nil)
	}
	for _, ls := range set.order {
		if ls.Mode != Local {
			l.setDegraded(ls, on, c)
		}
	}
}

// probe asks Redis with a PING whether it is there, when no renewal is on
// its way to tell: for a degraded limit (a Global one whose call failed, or
// every limit after a failed PING), whether it is back; after an exact
// decision that failed, whether it is gone. An answer restores every
// limit; none degrades every limit that uses Redis, whichever of the two
// asked, so that decisions stop waiting on Redis (invariant 3) and follow
// their policies. On a Cluster every master is pinged, and one answer
// means Redis is there (global.Store.Ping).
func (l *Limiter) probe(set *limitSet) {
	err := l.ping()
	for _, ls := range set.order {
		if ls.Mode != Local && ls.degraded.Load() {
			ls.sent(1)
			if err != nil {
				ls.m.redisErrors.Inc()
			}
		}
	}
	if err != nil {
		l.setAllDegraded(true, &cause{err: err})
		return
	}
	l.health.ok(time.Now())
	l.setAllDegraded(false, nil)
}

// ping sends one PING, bounded by RedisTimeout.
func (l *Limiter) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	defer cancel()
	return l.store.Ping(ctx)
}

// releaseAll releases every lease this instance holds, in pipelines, and
// forgets every key. It runs after the loop has stopped.
func (l *Limiter) releaseAll(ctx context.Context) error {
	var b batch
	// Limits SetLimits removed or changed since the last tick first.
	set := l.reconcile(time.Now(), l.members.Count(), &b)
	for _, ls := range set.order {
		l.retire(ls, &b)
	}
	if len(b.asks) == 0 {
		return nil
	}
	b.out = make([]global.LeaseGrant, len(b.asks))
	// In pipelines of releaseChunk: one pipeline of every key's release
	// outlasts a client's write timeout when there are very many.
	for i := 0; i < len(b.asks); i += releaseChunk {
		j := min(i+releaseChunk, len(b.asks))
		if err := l.store.AskLeases(ctx, b.asks[i:j], b.out[i:j]); err != nil {
			return err
		}
		for _, r := range b.refs[i:j] {
			r.ls.m.leasesReleased.Inc()
		}
	}
	return nil
}

// askChunk is how many asks the loop sends in one pipeline.
const askChunk = 256

// releaseChunk is how many releases Close sends in one pipeline.
const releaseChunk = 4096
