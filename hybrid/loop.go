package hybrid

import (
	"context"
	"math"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/shrink"
)

// store is the part of global.Store the Limiter uses.
type store interface {
	Lease(ctx context.Context, reqs []global.LeaseRequest, out []global.Lease) error
	TakeN(ctx context.Context, limit, key string, rate float64, burst, n int) (global.Take, error)
	TakeExact(ctx context.Context, r global.ExactRequest) (global.Take, error)
	Ping(ctx context.Context) error
	Check(ctx context.Context) error
}

var _ store = (*global.Store)(nil)

// health tells from Redis's answers whether it is gone. Every live key
// renews within UncontendedTTL/renewDivisor, so that long (plus a tick) without any
// answer means Redis is gone, not just the nodes of the keys in one batch.
// Owned by the loop.
type health struct {
	quiet    time.Duration // UncontendedTTL/renewDivisor + Tick
	answered time.Time     // when Redis last answered
}

// ok records an answer at t.
func (h *health) ok(t time.Time) { h.answered = t }

// silent reports whether Redis has not answered for long enough at now that
// the limits should degrade.
func (h *health) silent(now time.Time) bool { return now.Sub(h.answered) >= h.quiet }

// batch is one tick's worth of lease requests, reused across ticks.
type batch struct {
	reqs    []global.LeaseRequest
	out     []global.Lease
	refs    []ref
	calls   []call // one limit's calls, before they join reqs
	evicted []string
	asks    []ask  // asks to yield and freed keys received from the peers
	out2    outbox // asks to yield for the peers
	freed   outbox // keys whose grants this instance gave up in part, for the peers
	quiet   int    // ticks in a row that used a small part of the buffers
}

type ref struct {
	ls   *limitEntry
	le   *lease // nil for a release nothing waits on
	kind callKind
}

// shrinkAfter is how many ticks in a row the batches must have used less
// than 1/shrink.Below of their buffers before these are given back: a
// burst of keys went idle, or a first round of leases for many keys is
// over. Ticks, not one tick, so that a batch that is small every other
// tick keeps its buffers.
const shrinkAfter = 40

// reset empties b for the next tick, giving its buffers back once they have
// been mostly unused for shrinkAfter ticks.
func (b *batch) reset() {
	if shrink.Sparse(len(b.reqs), cap(b.reqs)) {
		b.quiet++
	} else {
		b.quiet = 0
	}
	if b.quiet >= shrinkAfter {
		*b = batch{out2: outbox{version: askVersion}, freed: outbox{version: freedVersion}}
		return
	}
	b.out2.version, b.freed.version = askVersion, freedVersion
	clear(b.reqs)
	b.reqs = b.reqs[:0]
	clear(b.refs)
	b.refs = b.refs[:0]
	clear(b.out) // drops the errors and keys of the last answers
	b.calls = b.calls[:0]
	clear(b.evicted)
	b.evicted = b.evicted[:0]
}

// add moves calls, made for ls, into b.
func (b *batch) add(ls *limitEntry, calls []call) {
	for i := range calls {
		b.reqs = append(b.reqs, calls[i].req)
		b.refs = append(b.refs, ref{ls, calls[i].lease, calls[i].kind})
	}
	clear(calls)
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
// ask every Hybrid limit's engine what to send, send it, hand back the
// answers.
func (l *Limiter) tick(now time.Time, b *batch) {
	b.reset()
	// Redis counts the instances that hold no record of a key by the
	// largest count of PeakWindow, as the default shares are split. The
	// names may change with the count unchanged (one leaves as another
	// joins): look at them at every tick, for the ranks.
	l.observe(now, l.members.Count(), l.roster())
	n := l.peak(now)
	set := l.reconcile(now, n, b)
	resettle := l.resettle.Swap(false)
	l.yield(now, n, set, b)
	probe := false
	for _, ls := range set.order {
		l.logUnlogged(ls)
		degraded := ls.degraded.Load()
		// The largest recent count may have aged out of PeakWindow.
		l.resplit(ls, now, n)
		l.warnBurstBelowN(ls, n)
		// A degraded limit recovers when Redis answers: a renewal, or a
		// probe when there is none (a Global limit, or a Hybrid one whose
		// keys ask for nothing, for example one degraded since New).
		probe = probe || (degraded && ls.Mode != Local)
		if ls.Mode == Hybrid {
			if resettle {
				ls.eng.resettle(now)
			}
			l.evict(now, n, ls, b)
			l.collect(now, n, ls, b)
		}
	}
	suspect := l.exactFailed.Swap(false)
	switch {
	case len(b.reqs) > 0:
		l.renew(now, b)
	case probe:
		l.probe(set)
	case suspect:
		l.check()
	}
	// After the pipeline: a peer that acts on an ask or on a freed grant
	// at once then finds this instance's records in Redis.
	if l.msgr != nil {
		b.out2.flush(l.msgr)
		b.freed.flush(l.msgr)
	}
}

// check degrades every limit that uses Redis if Redis does not answer a
// PING: an exact decision failed, and no renewal is on its way to tell.
// Decisions then stop waiting on Redis (invariant 3) and follow their
// policies, until a probe finds Redis back.
func (l *Limiter) check() {
	if err := l.ping(); err != nil {
		l.setAllDegraded(true, &cause{err: err})
		return
	}
	l.health.ok(time.Now())
}

// yield hands the asks to yield that peers sent since the last tick to the
// engines of their limits.
func (l *Limiter) yield(now time.Time, n int, set *limitSet, b *batch) {
	b.asks = l.in.take(b.asks)
	for _, a := range b.asks {
		if ls := set.byName[a.limit]; ls != nil && ls.eng != nil {
			ls.eng.degraded = ls.degraded.Load()
			if a.freed {
				ls.eng.freed(now, a.key)
			} else {
				ls.eng.yieldAsked(now, a.key, n)
			}
		}
	}
	b.asks = shrink.Slice(b.asks)
}

// reconcile puts the limits as configured now in force in the loop's own
// state, adding to b the releases that takes, and returns them. A limit
// that SetLimits removed has its leases released and its keys forgotten; a
// limit that became Hybrid gets an engine, one that stopped being Hybrid
// loses it (its leases released, its keys back at their default share), and
// the engine of one whose rate or burst changed takes the new values and
// renews every lease at now.
func (l *Limiter) reconcile(now time.Time, n int, b *batch) *limitSet {
	set := l.set.Load()
	if set != l.seen {
		for _, e := range l.seen.order {
			if cur := set.byName[e.Name]; cur == nil || cur.limitState != e.limitState {
				l.retire(n, e, b)
			}
		}
		l.seen = set
	}
	for _, e := range set.order {
		if e.applied != e.Limit {
			l.apply(now, n, e, b)
		}
	}
	return set
}

// apply puts e's Limit in force in the loop's state of e.
func (l *Limiter) apply(now time.Time, n int, e *limitEntry, b *batch) {
	was := e.applied
	e.applied = e.Limit
	switch {
	case e.Mode != Hybrid && e.eng != nil:
		b.add(e, e.eng.drop(now, n, b.calls[:0]))
		e.eng = nil
		e.failing.Store(0)
		e.m.leasedRate.Set(0)
		e.m.contendedKeys.Set(0)
	case e.Mode == Hybrid && e.eng == nil:
		e.eng = newEngine(e.Limit, l.members.Name(),
			timings{tick: l.cfg.Tick, contendedTTL: l.cfg.ContendedTTL, uncontendedTTL: l.cfg.UncontendedTTL, redisTimeout: l.cfg.RedisTimeout},
			creditShares{Limiter: e.loc, book: &e.credits})
	case e.Mode == Hybrid && (was.Rate != e.Rate || was.Burst != e.Burst || was.ExactBursts != e.ExactBursts):
		e.eng.setLimit(e.Rate, e.Burst, e.ExactBursts)
		e.eng.renewAll(now)
	}
}

// retire adds to b the releases of every lease of e, a limit SetLimits
// removed or one the Limiter closes, and forgets its keys.
func (l *Limiter) retire(n int, e *limitEntry, b *batch) {
	if e.eng != nil {
		b.add(e, e.eng.releaseAll(n, b.calls[:0]))
		e.eng = nil
	}
	e.failing.Store(0)
	e.m.leasedRate.Set(0)
	// Every key is idle as seen from this far ahead.
	e.loc.EvictIdle(time.Now().Add(math.MaxInt64), 0, nil)
}

// evict forgets the keys of ls idle for IdleAfter, adding to b the releases
// of their leases.
func (l *Limiter) evict(now time.Time, n int, ls *limitEntry, b *batch) {
	b.evicted = ls.loc.EvictIdle(now, l.cfg.IdleAfter, b.evicted[:0])
	for _, k := range b.evicted {
		var failing bool
		if b.calls, failing = ls.eng.evict(k, n, b.calls[:0]); failing {
			ls.failing.Add(-1)
		}
		b.add(ls, b.calls)
	}
	ls.eng.compact()
}

// collect adds to b the lease requests of ls that are due, and updates the
// limit's gauges.
func (l *Limiter) collect(now time.Time, n int, ls *limitEntry, b *batch) {
	ls.eng.degraded = ls.degraded.Load()
	ls.eng.startTick(now)
	var ts tickStats
	// A shard at a time: the snapshot holds one shard's keys, not every
	// key's, and its buffer stays small.
	for i := range ls.loc.Shards() {
		ls.stats = ls.loc.AppendShardStats(i, ls.stats[:0])
		b.calls = ls.eng.collectKeys(now, n, ls.stats, b.calls[:0], &ts)
		b.add(ls, b.calls)
	}
	if l.msgr != nil && len(ls.eng.asks) > 0 {
		b.out2.add(l.msgr, ls.Name, ls.eng.asks)
	}
	if l.msgr != nil && len(ls.eng.frees) > 0 {
		b.freed.add(l.msgr, ls.Name, ls.eng.frees)
	}
	ls.stats = shrink.Slice(ls.stats)
	ls.m.leasesExpired.Add(float64(ts.expired))
	ls.m.leasedRate.Set(ts.leased)
	ls.m.contendedKeys.Set(float64(ts.contended))
}

// renew sends b, made at sent, in one pipeline and hands the answers to the
// engines.
func (l *Limiter) renew(sent time.Time, b *batch) {
	if cap(b.out) < len(b.reqs) {
		b.out = make([]global.Lease, len(b.reqs))
	}
	b.out = b.out[:len(b.reqs)]
	clear(b.out)
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	err := l.store.Lease(ctx, b.reqs, b.out)
	cancel()
	l.m.renewal.Observe(time.Since(sent).Seconds())
	for _, r := range b.refs {
		r.ls.sent(1)
	}
	if err != nil {
		l.batchFailed(sent, b, err)
		return
	}
	l.health.ok(sent)
	l.setAllDegraded(false, nil)
	at := time.Now()
	for i, r := range b.refs {
		if r.kind == callRelease && b.out[i].Err == nil {
			r.ls.m.leasesReleased.Inc()
		}
		if r.le == nil || r.ls.eng == nil {
			continue
		}
		c := call{req: b.reqs[i], lease: r.le, kind: r.kind}
		if res := &b.out[i]; res.Err != nil {
			r.ls.m.redisErrors.Inc()
			l.keyFailed(sent, r.ls, &c, redact(res.Err, c.req.Key))
			continue
		}
		assigned, recovered := r.ls.eng.answered(at, sent, &c, &b.out[i])
		if recovered {
			l.keyRecovered(r.ls)
		}
		if assigned {
			r.ls.m.leasesGranted.Inc()
		}
	}
}

// batchFailed handles a batch that got no answer at all. Each key of it
// follows its policy once its lease runs out; the limits as a whole degrade
// only when nothing has answered for a while (see health), so that a batch
// that happened to hold only keys of one dead Cluster node does not degrade
// the keys of the live ones. A PING that some node answers says Redis is
// there.
func (l *Limiter) batchFailed(sent time.Time, b *batch, err error) {
	for i, r := range b.refs {
		r.ls.m.redisErrors.Inc()
		if r.le != nil && r.ls.eng != nil {
			l.keyFailed(sent, r.ls, &call{req: b.reqs[i], lease: r.le, kind: r.kind}, err)
		}
	}
	if l.health.silent(sent) && l.ping() == nil {
		l.health.ok(time.Now())
	}
	if l.health.silent(sent) {
		l.setAllDegraded(true, &cause{err: err})
	}
}

// keyFailed records that the request c of ls got no answer, and logs when
// the limit's first key starts failing.
func (l *Limiter) keyFailed(sent time.Time, ls *limitEntry, c *call, cause error) {
	if ls.eng.failed(sent, c) && ls.failing.Add(1) == 1 {
		l.log.Warn("hybridlimit: lease requests failing for some keys; they follow the outage policy once their leases run out",
			"limit", ls.Name, "policy", ls.OnOutage.String(), "error", cause)
	}
}

// keyRecovered records that a failing key of ls got an answer, and logs
// when the limit's last failing key recovers.
func (l *Limiter) keyRecovered(ls *limitEntry) {
	if ls.failing.Add(-1) == 0 {
		l.log.Info("hybridlimit: lease requests succeed again for every key", "limit", ls.Name)
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

// probe checks whether Redis is back, for degraded limits that have no
// lease traffic to tell.
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
	if err == nil {
		l.health.ok(time.Now())
		l.setAllDegraded(false, nil)
	}
}

// ping sends one PING, bounded by RedisTimeout.
func (l *Limiter) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	defer cancel()
	return l.store.Ping(ctx)
}

// releaseAll releases every lease this instance holds in one pipeline and
// forgets every key. It runs after the loop has stopped.
func (l *Limiter) releaseAll(ctx context.Context) error {
	var b batch
	n := l.members.Count()
	// Limits SetLimits removed or changed since the last tick first.
	set := l.reconcile(time.Now(), n, &b)
	for _, ls := range set.order {
		l.retire(n, ls, &b)
	}
	if len(b.reqs) == 0 {
		return nil
	}
	b.out = make([]global.Lease, len(b.reqs))
	// In pipelines of releaseChunk: one pipeline of every key's release
	// outlasts a client's write timeout when there are very many.
	for i := 0; i < len(b.reqs); i += releaseChunk {
		j := min(i+releaseChunk, len(b.reqs))
		if err := l.store.Lease(ctx, b.reqs[i:j], b.out[i:j]); err != nil {
			return err
		}
		for _, r := range b.refs[i:j] {
			r.ls.m.leasesReleased.Inc()
		}
	}
	return nil
}

// releaseChunk is how many releases Close sends in one pipeline.
const releaseChunk = 4096
