package hybrid

import (
	"context"
	"maps"
	"math"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/local"
)

const (
	// headroom multiplies a key's measured demand into its want, so that a
	// key whose demand grows a little is not starved until its next renewal.
	headroom = 1.1
	// minWantFraction of the rate is the least a live key asks for.
	minWantFraction = 1e-3
	// earlyGrowth is how far demand must outgrow the grant of an
	// uncontended key before it renews early, at most every earlyEvery
	// ticks.
	earlyGrowth = 1.0
	earlyEvery  = 4
	// settleAfter is how many contended renewals in a row must leave a
	// grant unchanged (within 1%) before its lease lifetime starts to grow.
	settleAfter = 3
	// ackShrink of the rate is the least shrink of a grant that the
	// instance tells Redis about at the next tick rather than at its next
	// renewal.
	ackShrink = 0.05
	// A key's demand is measured over the most recent window that holds
	// at least demandTokens tokens (or all its recorded history, demandSamples
	// renewals back): a busy key follows shifts within a renewal or two,
	// while a key that sees a request or two per renewal is averaged over
	// seconds, so that its want is not mostly noise.
	demandTokens  = 20
	demandSamples = 32
)

// lease is this instance's view of one key's rate lease. Owned by the loop.
type lease struct {
	requested   bool                  // a request for this key has gone to Redis
	held        bool                  // a grant is in force locally
	granted     float64               // tokens/s
	fair        float64               // tokens/s; granted < fair means others must still shrink
	contended   bool                  // the key's instances want more than its rate
	until       time.Time             // local end of the grant
	sentAt      time.Time             // when the last request went out
	attemptedAt int64                 // the key's Attempted counter at sentAt
	renewAt     time.Time             // when the next renewal is due
	failed      bool                  // the last request for this key failed on its own
	stable      int                   // consecutive contended renewals that changed nothing
	lastWant    float64               // the want of the last request
	samples     [demandSamples]sample // ring of (time, Attempted) at past requests
	next        int                   // next slot of samples to write
}

type sample struct {
	at        time.Time
	attempted int64
	cold      bool // the key's first request, see demand
}

// record notes the key's Attempted counter at t.
func (le *lease) record(t time.Time, attempted int64) {
	le.samples[le.next] = sample{at: t, attempted: attempted}
	le.next = (le.next + 1) % demandSamples
}

// demand is the key's recent demand in tokens per second at now: measured
// back to the latest recorded sample that leaves at least demandTokens
// tokens in the window, or to the oldest one. def is the key's default
// share, the most a key with one request so far is taken to want.
func (le *lease) demand(now time.Time, st *local.KeyStats, def float64) float64 {
	var from sample
	for i := 1; i <= demandSamples; i++ {
		s := le.samples[(le.next-i+demandSamples)%demandSamples]
		if s.at.IsZero() {
			break
		}
		from = s
		if st.Attempted-s.attempted >= demandTokens {
			break
		}
	}
	if from.at.IsZero() || !now.After(from.at) {
		return 0
	}
	if !from.cold {
		return float64(st.Attempted-from.attempted) / now.Sub(from.at).Seconds()
	}
	// The window opens with the key's first request: count the gaps
	// between requests, not the requests, or a new key with a request every
	// second looks like one with a request per tick.
	since := now.Sub(st.Created).Seconds()
	if st.Attempted <= 1 || !st.LastSeen.After(st.Created) {
		return min(def, 1/since)
	}
	gaps := float64(st.Attempted-1) / st.LastSeen.Sub(st.Created).Seconds()
	return min(gaps, float64(st.Attempted)/since)
}

// batch is one tick's worth of lease requests, reused across ticks.
type batch struct {
	reqs    []global.LeaseRequest
	out     []global.Lease
	refs    []ref
	evicted []string
	quiet   int // ticks in a row that used a small part of the buffers
}

type ref struct {
	ls *limitState
	le *lease // nil for a release
}

// reset empties b for the next tick. Once the batches have needed less
// than 1/shrinkBelow of the buffers for shrinkAfter ticks in a row (a burst
// of keys went idle, or a first round of leases for many keys is over), the
// buffers are given back and grow again to what is needed.
func (b *batch) reset() {
	if cap(b.reqs) >= shrinkFrom && len(b.reqs) < cap(b.reqs)/shrinkBelow {
		b.quiet++
	} else {
		b.quiet = 0
	}
	if b.quiet >= shrinkAfter {
		*b = batch{}
		return
	}
	clear(b.reqs)
	b.reqs = b.reqs[:0]
	clear(b.refs)
	b.refs = b.refs[:0]
	clear(b.out) // drops the errors and keys of the last answers
	clear(b.evicted)
	b.evicted = b.evicted[:0]
}

// A buffer or map that grew with the keys is given back once what it holds
// falls below 1/shrinkBelow of its size, if that size is at least
// shrinkFrom; a batch buffer only after shrinkAfter ticks in a row of that.
const (
	shrinkBelow = 4
	shrinkFrom  = 256
	shrinkAfter = 40
)

// reuse returns s emptied for reuse, with no references left in it, or nil
// if it is much larger than its last use needed.
func reuse[S ~[]E, E any](s S) S {
	if cap(s) >= shrinkFrom && len(s) < cap(s)/shrinkBelow {
		return nil
	}
	clear(s)
	return s[:0]
}

func (b *batch) add(ls *limitState, le *lease, req global.LeaseRequest) {
	b.reqs = append(b.reqs, req)
	b.refs = append(b.refs, ref{ls, le})
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

func (l *Limiter) tick(now time.Time, b *batch) {
	b.reset()
	n := l.members.Count()
	if l.resettle.Swap(false) {
		// The instance count changed: every share is about to move, so
		// leases that had settled into long renewals renew now.
		for _, ls := range l.order {
			for _, le := range ls.leases {
				if le.stable > 0 {
					le.stable = 0
					le.renewAt = now
				}
			}
		}
	}
	probe := false
	for _, ls := range l.order {
		b.evicted = ls.loc.EvictIdle(now, l.cfg.IdleAfter, b.evicted[:0])
		for _, k := range b.evicted {
			if le := ls.leases[k]; le != nil {
				delete(ls.leases, k)
				if le.failed {
					ls.failing.Add(-1)
				}
				if le.requested {
					b.add(ls, nil, l.request(ls, k, 0, n, l.cfg.ContendedTTL))
				}
			}
		}
		if ls.leasesPeak >= shrinkFrom && len(ls.leases) < ls.leasesPeak/shrinkBelow {
			// Go maps keep the memory of deleted entries.
			ls.leases = maps.Collect(maps.All(ls.leases))
			ls.leasesPeak = len(ls.leases)
		}
		if ls.OnOutage == FailLocal && ls.degraded.Load() {
			// The largest recent count may have aged out of PeakWindow.
			l.resplit(ls, now)
		}
		switch ls.Mode {
		case Hybrid:
			l.collect(now, n, ls, b)
		case Global:
			probe = probe || ls.degraded.Load()
		}
	}
	switch {
	case len(b.reqs) > 0:
		l.renew(now, b)
	case probe:
		l.probe()
	}
}

// request builds the lease request of one key. Instances that hold no
// lease on the key yet are counted at rate/N for UncontendedTTL after its
// lease hash is created (or re-created, after a FLUSHALL or a restart):
// every live instance renews within half that, so none can be running on a
// share Redis does not know of by then.
func (l *Limiter) request(ls *limitState, key string, want float64, n int, ttl time.Duration) global.LeaseRequest {
	return global.LeaseRequest{
		Limit: ls.Name, Key: key, Instance: l.members.Name(),
		Want: want, Rate: ls.Rate, Instances: n, TTL: ttl, Cold: l.cfg.UncontendedTTL,
	}
}

// collect adds to b the keys of ls whose lease is due, and updates the
// limit's gauges.
func (l *Limiter) collect(now time.Time, n int, ls *limitState, b *batch) {
	ls.stats = ls.loc.AppendStats(ls.stats[:0])
	var leased float64
	contended := 0
	for i := range ls.stats {
		st := &ls.stats[i]
		le := ls.leases[st.Key]
		if le == nil {
			// Cold start: seen since the last tick, at the default share.
			le = &lease{sentAt: st.Created}
			// A key's first decision opens the window its demand is
			// measured over: one request on a new key says nothing of its
			// rate, so it is not counted as one per tick.
			le.samples[0] = sample{at: st.Created, attempted: 0, cold: true}
			le.next = 1
			ls.leases[st.Key] = le
		}
		if le.held && !now.Before(le.until) {
			le.held = false
			ls.m.leasesExpired.Inc()
		}
		if le.held {
			leased += le.granted
			if le.contended {
				contended++
			}
		}
		elapsed := now.Sub(le.sentAt)
		if elapsed <= 0 {
			continue
		}
		demand := float64(st.Attempted-le.attemptedAt) / elapsed.Seconds()
		// A key without a lease asks as soon as it sees decisions; a leased
		// one renews on schedule.
		due := st.Attempted > le.attemptedAt
		if le.requested {
			due = !now.Before(le.renewAt)
		}
		if !due && elapsed >= earlyEvery*l.cfg.Tick {
			switch {
			case !le.contended:
				// Demand outgrew an uncontended grant: ask now.
				due = demand > le.granted*earlyGrowth
			case le.stable >= settleAfter:
				// A settled contended lease renews rarely; ask now if this
				// instance's demand moved enough to change its share.
				d := le.demand(now, st, ls.Rate/float64(n)) * headroom
				due = d < le.granted*0.75 || (le.lastWant < le.fair && d > le.lastWant*1.25)
			}
		}
		if !due {
			continue
		}
		if le.requested && now.Sub(st.LastSeen) >= l.cfg.UncontendedTTL/2 {
			// Idle for as long as an uncontended lease lasts between
			// renewals: stop renewing. A contended key gives its share back
			// at once, for the others; an uncontended one lets its lease
			// run out, which costs no command. The key runs at its default
			// share again, and asks anew when it is used. (Letting go
			// sooner would make keys with a request or two per renewal
			// flap between a lease and their default share.)
			if le.contended {
				b.add(ls, nil, l.request(ls, st.Key, 0, n, l.cfg.ContendedTTL))
			}
			le.requested, le.held, le.granted = false, false, 0
			ls.loc.Unassign(now, st.Key)
			continue
		}
		want := max(le.demand(now, st, ls.Rate/float64(n))*headroom, ls.Rate*minWantFraction)
		le.record(now, st.Attempted)
		// A key's first lease is asked for as uncontended: most keys are,
		// and a contended one renews two ticks later anyway.
		ttl := l.cfg.UncontendedTTL
		if le.requested && le.contended {
			// A contended lease whose share has settled (settleAfter
			// renewals in a row changed nothing) doubles its lifetime at
			// each further one, up to an uncontended lease's: Redis commands
			// then follow the keys whose shares move, not every contended
			// key.
			ttl = min(l.cfg.ContendedTTL<<min(max(le.stable-settleAfter+1, 0), 16), l.cfg.UncontendedTTL)
		}
		le.lastWant = want
		req := l.request(ls, st.Key, want, n, ttl)
		if le.held && now.Before(le.until) {
			// Until the answer arrives (if ever) this grant stays in
			// force: Redis counts it until it ends.
			req.Running, req.RunningFor = le.granted, le.until.Sub(now)
		}
		b.add(ls, le, req)
		le.requested = true
		le.sentAt = now
		le.attemptedAt = st.Attempted
	}
	ls.leasesPeak = max(ls.leasesPeak, len(ls.leases))
	ls.stats = reuse(ls.stats)
	ls.m.leasedRate.Set(leased)
	ls.m.contendedKeys.Set(float64(contended))
}

// renew sends b in one pipeline and applies the answers.
func (l *Limiter) renew(now time.Time, b *batch) {
	if cap(b.out) < len(b.reqs) {
		b.out = make([]global.Lease, len(b.reqs))
	}
	b.out = b.out[:len(b.reqs)]
	clear(b.out)
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	err := l.store.Lease(ctx, b.reqs, b.out)
	cancel()
	l.m.renewal.Observe(time.Since(now).Seconds())
	for _, r := range b.refs {
		r.ls.sent(1)
	}
	if err != nil {
		// Nothing in the batch got an answer. Each key of it follows its
		// policy once its lease runs out; the limits as a whole degrade when
		// nothing has answered for a while, so that a batch that happened
		// to hold only keys of one dead Cluster node does not degrade the
		// keys of the live ones.
		for i, r := range b.refs {
			r.ls.m.redisErrors.Inc()
			if r.le != nil {
				r.le.renewAt = now.Add(l.cfg.Tick) // try again next tick
				l.setKeyFailed(r.ls, b.reqs[i].Key, r.le, true, err)
			}
		}
		// Every live key renews within UncontendedTTL/2, so that long
		// without an answer means Redis is gone, not just the nodes of the
		// keys in this batch; a PING that some node answers says the same.
		quiet := l.cfg.UncontendedTTL/2 + l.cfg.Tick
		if now.Sub(l.answered) >= quiet && l.ping() == nil {
			l.answered = time.Now()
		}
		if now.Sub(l.answered) >= quiet {
			for _, ls := range l.order {
				if ls.Mode != Local {
					l.setDegraded(ls, true, err)
				}
			}
		}
		return
	}
	l.answered = now
	for _, ls := range l.order {
		if ls.Mode != Local {
			l.setDegraded(ls, false, nil)
		}
	}
	applied := time.Now()
	for i, r := range b.refs {
		if r.le == nil {
			r.ls.m.leasesReleased.Inc()
			continue
		}
		res := &b.out[i]
		if res.Err != nil {
			r.ls.m.redisErrors.Inc()
			r.le.renewAt = now.Add(l.cfg.Tick) // try again next tick
			l.setKeyFailed(r.ls, b.reqs[i].Key, r.le, true, redact(res.Err, b.reqs[i].Key))
			continue
		}
		l.setKeyFailed(r.ls, b.reqs[i].Key, r.le, false, nil)
		l.apply(applied, now, r.ls, b.reqs[i], r.le, res)
	}
}

// setKeyFailed records whether the last lease request of one key failed on
// its own, flags the key so that decisions follow OnOutage once its lease
// runs out, and logs when a limit's first key starts or its last key stops
// failing.
func (l *Limiter) setKeyFailed(ls *limitState, key string, le *lease, failed bool, cause error) {
	if le.failed == failed {
		return
	}
	le.failed = failed
	ls.loc.SetFlag(key, failed)
	switch {
	case failed && ls.failing.Add(1) == 1:
		l.log.Warn("hybridlimit: lease requests failing for some keys; they follow the outage policy once their leases run out",
			"limit", ls.Name, "policy", ls.OnOutage.String(), "error", cause)
	case !failed && ls.failing.Add(-1) == 0:
		l.log.Info("hybridlimit: lease requests succeed again for every key", "limit", ls.Name)
	}
}

// apply puts one granted lease in force. sent is when its request went out:
// Redis started the lease no earlier, so the lease ends locally no later
// than it does in Redis whatever the clocks say.
func (l *Limiter) apply(now, sent time.Time, ls *limitState, req global.LeaseRequest, le *lease, res *global.Lease) {
	first := !le.held && le.granted == 0
	// Redis counts this instance at the grant it ran when it asked, until
	// that ends; once the smaller one is in force, say so at the next tick
	// so that what it gave up goes to the others -- when that is enough to
	// matter: a small shrink is left to the next renewal, which costs no
	// extra command and frees it at the latest when the old grant ends.
	shrank := req.Running-res.Granted > ackShrink*ls.Rate
	settled := res.Contended && res.Granted >= res.Fair*0.99 && le.granted > 0 &&
		math.Abs(res.Granted-le.granted) <= 0.01*le.granted
	if settled {
		le.stable++
	} else {
		le.stable = 0
	}
	le.granted, le.fair, le.contended = res.Granted, res.Fair, res.Contended
	le.until = sent.Add(req.TTL * 9 / 10)
	switch {
	case first && res.Contended:
		// The first grant counts instances not heard from yet at rate/N;
		// they will soon say what they want, so ask again soon.
		le.renewAt = sent.Add(2 * l.cfg.Tick)
	case res.Contended && res.Granted < res.Fair*0.9:
		// Others hold more than their fair share until their next renewal:
		// ask again soon to pick up what they free.
		le.renewAt = sent.Add(2 * l.cfg.Tick)
	case res.Contended && !settled:
		// A share that moved renews on the contended schedule, even if
		// this request was for a longer, settled lease.
		le.renewAt = sent.Add(min(req.TTL, l.cfg.ContendedTTL) / 2)
	default:
		le.renewAt = sent.Add(req.TTL / 2)
	}
	if shrank {
		le.renewAt = now.Add(l.cfg.Tick)
	}
	share := local.Share{
		Limit: rate.Limit(res.Granted),
		Burst: int(float64(ls.Burst) * res.Granted / ls.Rate),
	}
	if ls.loc.Assign(now, req.Key, share, le.until) {
		le.held = true
		ls.m.leasesGranted.Inc()
	}
}

// probe checks whether Redis is back, for Global limits that are degraded
// and have no lease traffic to tell.
func (l *Limiter) probe() {
	err := l.ping()
	if err == nil {
		l.answered = time.Now()
	}
	for _, ls := range l.order {
		if ls.Mode == Global && ls.degraded.Load() {
			ls.sent(1)
			if err != nil {
				ls.m.redisErrors.Inc()
			} else {
				l.setDegraded(ls, false, nil)
			}
		}
	}
}

// ping sends one PING, bounded by RedisTimeout.
func (l *Limiter) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	defer cancel()
	pipe := l.cfg.Redis.Pipeline()
	pipe.Ping(ctx)
	_, err := pipe.Exec(ctx)
	return err
}

// releaseAll releases every lease this instance holds in one pipeline and
// forgets every key. It runs after the loop has stopped.
func (l *Limiter) releaseAll(ctx context.Context) error {
	var b batch
	n := l.members.Count()
	far := time.Now().Add(100 * 365 * 24 * time.Hour)
	for _, ls := range l.order {
		for k, le := range ls.leases {
			if le.requested {
				b.add(ls, nil, l.request(ls, k, 0, n, l.cfg.ContendedTTL))
			}
		}
		clear(ls.leases)
		ls.failing.Store(0)
		ls.loc.EvictIdle(far, 0, nil)
		ls.m.leasedRate.Set(0)
	}
	if len(b.reqs) == 0 {
		return nil
	}
	b.out = make([]global.Lease, len(b.reqs))
	if err := l.store.Lease(ctx, b.reqs, b.out); err != nil {
		return err
	}
	for _, r := range b.refs {
		r.ls.m.leasesReleased.Inc()
	}
	return nil
}
