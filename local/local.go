package local

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/internal/table"
)

// ErrInvalid is wrapped by the errors New returns for a bad Config.
var ErrInvalid = errors.New("local: invalid config")

// DefaultShards is the number of map shards used when Config.Shards is 0.
const DefaultShards = 64

// Config configures a Limiter for one limit.
type Config struct {
	// Limit is the limit's global rate in tokens per second. It must be
	// positive and finite.
	Limit rate.Limit
	// Burst is the limit's global burst in tokens. It must be at least 1.
	Burst int
	// Instances is the live instance count N the default share is split by.
	// Zero means 1. The Limiter starts unranked, with a default burst of at
	// least 1 token: Place{Instances: Instances, Rank: NoRank, MinBurst: 1}
	// (see SetPlace to split the burst exactly).
	Instances int
	// Shards is the number of map shards, rounded up to a power of two.
	// Zero means DefaultShards.
	Shards int
}

// Share is the rate and burst one key runs at on this instance.
type Share struct {
	Limit rate.Limit // tokens per second
	// Burst is in tokens. An assigned share runs at least 1 unless it
	// admits nothing; a default share may be 0 (see Split).
	Burst int
}

// NoRank is the rank of an instance that does not know its place among
// the others: it gets no token of the burst's remainder (see Split).
const NoRank = -1

// Split returns the default share of the instance of rank rank among n
// instances, of a limit of rate limit and burst burst: limit/n, and
// burst/n rounded down plus one token of the remainder if rank is below
// burst mod n. The bursts of ranks 0 to n-1 so sum to exactly burst; a
// rank outside [0, n), such as NoRank, gets no remainder token, and n
// instances of distinct ranks never hold more than burst between them. A
// burst below n gives the ranks from burst on a burst of 0: such an
// instance admits nothing at its default share and must ask for more
// first. An n below 1 counts as 1.
func Split(limit rate.Limit, burst, n, rank int) Share {
	if n < 1 {
		n = 1
	}
	b := burst / n
	if rank >= 0 && rank < burst%n {
		b++
	}
	return Share{Limit: limit / rate.Limit(n), Burst: b}
}

// Place is where this instance stands among the instances that split a
// limit, which decides its default share: Split(limit, burst, Instances,
// Rank), its burst raised to MinBurst.
type Place struct {
	// Instances is the instance count N the limit is split by. Below 1
	// counts as 1.
	Instances int
	// Rank is this instance's rank among them, from 0 to Instances-1, the
	// same on every instance's view: the lowest ranks get the burst's
	// remainder (see Split). Instances that split one limit must have
	// distinct ranks, or their bursts may sum above the limit's. NoRank,
	// or any rank outside [0, Instances), gets no remainder. Zero is the
	// first rank.
	Rank int
	// MinBurst is the least burst of the default share, in tokens. Zero
	// lets the split give an instance a burst of 0 (when the limit's burst
	// is below Instances), so that the instances hold at most the limit's
	// burst between them; 1 lets every instance admit at its default share
	// alone, for instances that never ask for more (the shares then sum
	// above a burst below Instances).
	MinBurst int
}

// fix returns p with Instances at least 1 and MinBurst at least 0.
func (p Place) fix() Place {
	p.Instances = max(p.Instances, 1)
	p.MinBurst = max(p.MinBurst, 0)
	return p
}

// share is the default share at p of a limit of rate limit and burst burst.
func (p Place) share(limit rate.Limit, burst int) Share {
	s := Split(limit, burst, p.Instances, p.Rank)
	s.Burst = max(s.Burst, p.MinBurst)
	return s
}

// Result is the outcome of one decision.
type Result struct {
	// Allowed reports whether the n tokens were taken.
	Allowed bool
	// Remaining is the whole number of tokens left in the key's bucket on
	// this instance after the decision.
	Remaining int64
	// RetryAfter is how long until n tokens would be available at the
	// current share; 0 when Allowed. It is math.MaxInt64 when n exceeds the
	// key's burst (the request can never succeed at this share).
	RetryAfter time.Duration
	// Assigned reports whether the decision ran at an assigned share (true)
	// or at the default share (false).
	Assigned bool
	// Flagged reports the key's flag, see SetFlag.
	Flagged bool
	// Mark is the key's mark, see SetMark. A marked key is not decided
	// here: Allowed is false and the caller decides. So is a request on a
	// key with a lease (Lease, with a mark) whose burst can never hold
	// it: Assigned is then true too, and the lease goes on.
	Mark uint8
	// Hold, for a marked key, is how long the caller asked (SetHold) that
	// its requests be denied without asking again; 0 when it did not or
	// that time has passed.
	Hold time.Duration
	// Attempted, for a marked key, is the total number of tokens ever
	// asked for on it, this decision's included (KeyStats.Attempted): the
	// caller that decides it elsewhere can tell what it asked for, held
	// requests included. 0 for a key decided here.
	Attempted int64
	// Credit, for a marked key, is the id of the last credit put in force
	// on it (see Credit), 0 if none: the credit is spent or has ended,
	// since the key is decided by the caller. 0 for a key decided here.
	Credit uint32
}

// Tally says which decisions of AllowNTallyInto a Limiter counts in its
// Counts, and under which share.
type Tally uint8

const (
	// TallyShare counts every decision under the share the key ran it at:
	// Counts.Assigned at an assigned share, Counts.Default otherwise
	// (lapsed shares included). AllowN and AllowNInto count so.
	TallyShare Tally = iota
	// TallyDefault counts every decision under Counts.Default, whatever
	// the share: for a caller that reports all of them alike (package
	// hybrid's Local limits, whose keys may keep an assigned share for a
	// moment after the limit stopped being Hybrid).
	TallyDefault
	// TallyAssigned counts only the decisions at an assigned share: the
	// caller decides the others otherwise and counts them itself (package
	// hybrid's outage policies).
	TallyAssigned
)

// Counts are the decisions a Limiter has counted since New, by the share
// they ran at (see Tally) and their outcome. They only grow. Decisions on
// marked keys, which the caller makes, and on n below 1 are not counted.
type Counts struct {
	DefaultAllowed, DefaultDenied   uint64 // at the default share, or a lapsed one
	AssignedAllowed, AssignedDenied uint64 // at an assigned share
}

// KeyStats is a snapshot of one key, as returned by AppendStats.
type KeyStats struct {
	Key string
	// Attempted is the total number of tokens ever asked for on this key,
	// denied requests included. It only grows; callers compute demand from
	// differences between snapshots.
	Attempted int64
	// LastSeen is the time of the key's latest decision.
	LastSeen time.Time
	// Created is the time of the key's first decision.
	Created time.Time
	// Assigned reports whether the key runs at an assigned share that has
	// not yet expired as of LastSeen.
	Assigned bool
	// Until is when the assigned share ends; zero when not Assigned.
	Until time.Time
	// Share is the share the key currently runs at.
	Share Share
	// Denied counts the tokens denied on this key by its share, modulo
	// 2^32: compare two snapshots for inequality to tell whether a request
	// was denied in between. Marked keys are not decided here and deny
	// nothing.
	Denied uint32
	// Mark is the key's mark, see SetMark.
	Mark uint8
	// Lapsed reports whether the key's last assigned share ended without
	// an Unassign: it runs the smaller of that share and the default.
	Lapsed bool
	// Flagged reports the key's flag, see SetFlag.
	Flagged bool
}

// Limiter holds the keyed limiters of one limit. It is safe for concurrent
// use.
type Limiter struct {
	seed maphash.Seed
	mask uint64

	// setMu serialises the changes of params together with the walk over
	// the keys that puts each in force, so that two changes at once cannot
	// leave a key at the share of the older one.
	setMu  sync.Mutex
	params atomic.Pointer[params] // replaced under setMu, never mutated

	shards []shard
}

// params are the limit's rate and burst, the place its default share is
// split by, and that share.
type params struct {
	limit rate.Limit
	burst int
	place Place
	def   Share
	mark  uint8 // of new keys, see SetNewMark
}

// A shard holds the keys whose hash falls in it. One mutex guards the
// table and every entry in it: a decision takes it once, where a read lock
// on a map and a lock per entry would cost two.
type shard struct {
	mu sync.Mutex
	// counts are the decisions counted in the shard (see Tally), by
	// [assigned][allowed]. The decision holds mu anyway, and the line it
	// sits on is the mutex's: counting here costs a plain increment, where
	// one counter for the whole Limiter would be a line every core writes.
	counts [2][2]uint64 // guarded by mu
	// base is the instant the times of the shard's entries count from. The
	// first key inserted into the empty shard sets it, so that the times
	// keep the monotonic clock reading of the caller's time.Now, if any:
	// a step of the wall clock then moves no key's time.
	base time.Time // guarded by mu
	// The first 64 bytes (mu, counts, base) are what a decision writes;
	// keys, on the second line, it only reads unless it inserts.
	keys table.Table[entry, *entry] // guarded by mu
	// 128 bytes in all: shards sit on cache lines of their own.
}

// An entry is one key, held by value in its shard's table beside the
// key's string. Its times are offsets from the shard's base, 8 bytes each
// where a time.Time takes 24, which keeps the entry at 88 bytes and the
// key at 104 in the table: b takes 32 bytes, the key's string 16, the five
// int64 fields 40, the flags 8 and credit 8 (4 of them padding). Another
// field takes 8 bytes more on every key, unless it fits credit's padding;
// TestEntrySize guards it. Every field is guarded by the shard's mu.
type entry struct {
	b         bucket        // by value: one allocation per key, not two
	last      time.Duration // latest time fed to b; never moves backwards
	created   time.Duration // time of the key's first decision
	seen      time.Duration // time of the key's latest decision
	until     time.Duration // when the assigned share ends, if assigned
	attempted int64
	denied    uint32 // tokens denied, modulo 2^32
	assigned  bool
	flagged   bool   // the caller's flag, see SetFlag
	mark      uint8  // the caller's mark, see SetMark; until then holds the hold (SetHold)
	lapsed    bool   // the assigned share ended: the key runs at most the default
	credit    uint32 // the id of the last credit put in force, see Credit
}

// New returns a Limiter for the limit described by cfg.
func New(cfg Config) (*Limiter, error) {
	if err := check(cfg.Limit, cfg.Burst); err != nil {
		return nil, err
	}
	if cfg.Instances < 0 || cfg.Shards < 0 {
		return nil, fmt.Errorf("%w: instances %d and shards %d must not be negative", ErrInvalid, cfg.Instances, cfg.Shards)
	}
	n := cfg.Shards
	if n == 0 {
		n = DefaultShards
	}
	size := 1
	for size < n {
		size <<= 1
	}
	l := &Limiter{
		seed:   maphash.MakeSeed(),
		mask:   uint64(size - 1),
		shards: make([]shard, size),
	}
	for i := range l.shards {
		l.shards[i].keys = newTable()
	}
	pl := Place{Instances: cfg.Instances, Rank: NoRank, MinBurst: 1}.fix()
	l.params.Store(&params{limit: cfg.Limit, burst: cfg.Burst, place: pl, def: pl.share(cfg.Limit, cfg.Burst)})
	return l, nil
}

// check reports whether limit and burst can describe a limit.
func check(limit rate.Limit, burst int) error {
	if math.IsNaN(float64(limit)) || math.IsInf(float64(limit), 0) || limit <= 0 || limit == rate.Inf {
		return fmt.Errorf("%w: rate %v must be a positive, finite number of tokens per second", ErrInvalid, float64(limit))
	}
	if burst < 1 {
		return fmt.Errorf("%w: burst %d must be at least 1", ErrInvalid, burst)
	}
	return nil
}

// Limit returns the limit's global rate.
func (l *Limiter) Limit() rate.Limit { return l.params.Load().limit }

// Burst returns the limit's global burst.
func (l *Limiter) Burst() int { return l.params.Load().burst }

// Instances returns the instance count the default share was last split by
// (Config.Instances, or the last SetInstances or SetPlace), at least 1.
func (l *Limiter) Instances() int { return l.params.Load().place.Instances }

// Place returns the place the default share was last split by.
func (l *Limiter) Place() Place { return l.params.Load().place }

// Default returns the current default share.
func (l *Limiter) Default() Share { return l.params.Load().def }

// shard returns the shard of key and the key's hash.
func (l *Limiter) shard(key string) (*shard, uint64) {
	h := maphash.String(l.seed, key)
	return &l.shards[h&l.mask], h
}

// Allow is shorthand for AllowN(t, key, 1).
func (l *Limiter) Allow(t time.Time, key string) Result { return l.AllowN(t, key, 1) }

// AllowN decides whether n tokens may be taken from key at time t, creating
// the key at the default share if it is new. n must be at least 1; a smaller
// n is denied. Deciding on an existing key does not allocate.
//
// The zero t means now, read once the key's lock is held: callers that
// decide on one key from many goroutines should pass it. A time read
// before waiting for the lock is stale by the wait; decided at it, the
// key's bucket refills for none of the wait until a fresher time comes,
// and then for all of it at once, and what that refill brings above the
// burst is lost: with callers that saturate the CPU, waits of hundreds of
// milliseconds cost the key a good part of its rate.
func (l *Limiter) AllowN(t time.Time, key string, n int) (r Result) {
	l.AllowNInto(t, key, n, &r)
	return r
}

// AllowNInto is AllowN, writing the result to *r instead of returning it.
// It is for callers on a hot path: a Result has too many fields for the
// compiler to keep in registers, so one returned by value is copied through
// memory on the way, and that copy stalls the processor (a load that spans
// several smaller stores cannot be forwarded from them) for a few
// nanoseconds, a noticeable part of a decision. *r is overwritten whole.
func (l *Limiter) AllowNInto(t time.Time, key string, n int, r *Result) {
	l.AllowNTallyInto(t, key, n, TallyShare, r)
}

// AllowNTallyInto is AllowNInto, counting the decision in Counts as tally
// says.
func (l *Limiter) AllowNTallyInto(t time.Time, key string, n int, tally Tally, r *Result) {
	if n < 1 {
		*r = Result{RetryAfter: math.MaxInt64}
		return
	}
	sh, h := l.shard(key)
	sh.mu.Lock()
	if t.IsZero() {
		t = time.Now()
	}
	e := sh.keys.Get(h, key)
	if e == nil {
		e = l.insert(sh, h, key, t)
	}
	// sh.advance, written out: this is the one place it is hot.
	now := t.Sub(sh.base)
	if now < e.last {
		now = e.last
	}
	e.last, e.seen = now, now
	e.attempted += int64(n)
	if e.assigned && now >= e.until {
		l.expire(e, now)
	}
	if e.mark != 0 && !e.assigned {
		*r = l.marked(e, now)
		sh.mu.Unlock()
		return
	}
	ok, tokens := e.b.allowN(now, n)
	if !ok && e.assigned && e.mark != 0 && l.passOn(e, now, n, r) {
		sh.mu.Unlock()
		return
	}
	// The result is written once, field by field, from values in
	// registers (see AllowNInto): building it elsewhere and copying it in
	// would cost the stall AllowNInto is there to save.
	var remaining int64
	if tokens > 0 {
		remaining = int64(tokens)
	}
	var wait time.Duration
	if !ok {
		wait = e.retryAfter(tokens, n)
		e.denied += uint32(n)
	}
	if a := e.assigned; a || tally != TallyAssigned {
		sh.counts[b2i(a && tally != TallyDefault)][b2i(ok)]++
	}
	r.Allowed, r.Remaining, r.RetryAfter = ok, remaining, wait
	r.Assigned, r.Flagged, r.Mark, r.Hold = e.assigned, e.flagged, 0, 0
	sh.mu.Unlock()
}

// passOn reports whether the decision on n tokens of e, which runs a lease
// with a mark and could not admit them, goes to the caller, and sets *r to
// say so. A lease of rate 0 (credit, see Lease) ends here. A lease whose
// burst can never hold n goes on (Assigned and Mark set); one of burst 0
// decides nothing, its requests waiting for the next grant. Requires the
// shard's mu held.
func (l *Limiter) passOn(e *entry, now time.Duration, n int, r *Result) bool {
	switch {
	case e.b.limit == 0:
		l.expire(e, now)
		*r = l.marked(e, now)
	case e.b.burst >= 1 && n > e.b.burst:
		*r = Result{Assigned: true, Mark: e.mark, Flagged: e.flagged, Attempted: e.attempted}
	default:
		return false
	}
	return true
}

// marked is the result of a decision on the marked key e at offset now:
// the caller decides it. Requires the shard's mu held.
func (l *Limiter) marked(e *entry, now time.Duration) Result {
	r := Result{Mark: e.mark, Flagged: e.flagged, Attempted: e.attempted, Credit: e.credit}
	if now < e.until {
		r.Hold = e.until - now
	}
	return r
}

// expire ends e's assigned share at offset now: it lapses to the smaller
// of that share and the default. Requires the shard's mu held. It is a
// function of its own to keep the decision's frame small; so is retryAfter.
func (l *Limiter) expire(e *entry, now time.Duration) { e.lapse(now, l.Default()) }

// retryAfter is how long until e's tokens grow to n. Requires the shard's mu held.
func (e *entry) retryAfter(tokens float64, n int) time.Duration {
	return retryAfter(e.b.limit, e.b.burst, tokens, n)
}

// retryAfter is how long until tokens grows to n at rate lim.
func retryAfter(lim rate.Limit, burst int, tokens float64, n int) time.Duration {
	if n > burst || lim <= 0 {
		return math.MaxInt64
	}
	missing := float64(n) - tokens
	if missing <= 0 {
		return 0
	}
	d := time.Duration(math.Ceil(missing / float64(lim) * float64(time.Second)))
	if d < 1 {
		d = 1
	}
	return d
}

// insert adds key, whose hash is h, at the default share, first decided on
// at t. Requires sh.mu held and key not in sh.
func (l *Limiter) insert(sh *shard, h uint64, key string, t time.Time) *entry {
	if sh.keys.Len() == 0 {
		sh.base = t // no entry counts from the old base
	}
	p := l.params.Load()
	def := p.def
	now := t.Sub(sh.base)
	e := sh.keys.Put(h, key)
	*e = entry{b: newBucket(def, now), last: now, created: now, seen: now, mark: p.mark}
	return e
}

// advance clamps t so that the times fed to e's bucket never move
// backwards, and returns the offset from sh.base to feed. Requires sh.mu
// held.
func (sh *shard) advance(e *entry, t time.Time) time.Duration {
	now := t.Sub(sh.base)
	if now < e.last {
		return e.last
	}
	e.last = now
	return now
}

// time returns the instant at offset d from sh.base.
func (sh *shard) time(d time.Duration) time.Time { return sh.base.Add(d) }

// fallBack moves e back to the default share at offset now. Requires the
// shard's mu held.
func (e *entry) fallBack(now time.Duration, def Share) {
	e.assigned, e.lapsed = false, false
	e.until = 0
	e.setShare(now, def)
}

// lapse ends e's assigned share at offset now: it runs the smaller of that
// share and def until Unassign. Requires the shard's mu held.
func (e *entry) lapse(now time.Duration, def Share) {
	e.assigned, e.lapsed = false, true
	e.until = 0
	e.setShare(now, e.capped(def))
}

// capped is the smaller of e's share and def, rate and burst apart.
// Requires the shard's mu held.
func (e *entry) capped(def Share) Share {
	return Share{Limit: min(e.b.limit, def.Limit), Burst: min(e.b.burst, def.Burst)}
}

// setShare changes the rate and burst of e at offset now. Requires the
// shard's mu held.
func (e *entry) setShare(now time.Duration, s Share) {
	if e.b.limit != s.Limit {
		e.b.setLimit(now, s.Limit)
	}
	if e.b.burst != s.Burst {
		e.b.setBurst(now, s.Burst)
	}
}

// Assign runs key at share s from t until until. After until the key runs
// the smaller of s and the default share (it lapses), until Unassign:
// whoever assigned s may still be counted at s elsewhere, not at the
// default share. It reports false, and does nothing, if the key does not
// exist (never seen, or evicted). A share with a positive rate and a burst
// below 1 runs at burst 1; the zero Share admits nothing. A marked key
// takes the share for when it is unmarked.
func (l *Limiter) Assign(t time.Time, key string, s Share, until time.Time) bool {
	s = fixShare(s)
	return l.with(key, func(sh *shard, e *entry) { l.assign(sh, e, t, s, until) })
}

// AssignNew is Assign, creating key at t first if it does not exist.
func (l *Limiter) AssignNew(t time.Time, key string, s Share, until time.Time) bool {
	s = fixShare(s)
	sh, h := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys.Get(h, key)
	if e == nil {
		e = l.insert(sh, h, key, t)
	}
	l.assign(sh, e, t, s, until)
	return true
}

// Lease puts s in force on key from t until until, and marks the key with
// next once until has passed: it is decided here, at s, only while the
// share is in force, and by the caller after that (package hybrid's
// leases, which end into the exact placement). A key that did not run an
// assigned share in force until now starts with give tokens (moved to it
// from elsewhere, up to s's burst), not with what its bucket held; one that
// did keeps its tokens, up to the new burst. A share of rate 0 (tokens
// handed ahead, package hybrid's credit) also ends as soon as it cannot
// admit a request: that request, and the next, go to the caller. next
// must not be 0. It reports false, and does nothing, if the key does not
// exist.
func (l *Limiter) Lease(t time.Time, key string, s Share, until time.Time, next uint8, give int) bool {
	s = fixShare(s)
	return l.with(key, func(sh *shard, e *entry) { l.lease(sh, e, t, s, until, next, give) })
}

// Credit puts tokens handed ahead in force on key from t until until, and
// names them id: Lease of a share of rate 0 and burst tokens, starting
// with them. Once they are spent or until has passed, the key's decisions
// report id (Result.Credit), so that the caller can say where it decides
// them that the credit is over. next is the mark the key's decision that
// got the credit was made under, and the mark the key keeps: a key that
// moved on since (another mark, or a share in force, such as a lease put
// in force while the credit's answer was on its way) only records id, and
// the tokens are not admitted here. It reports false, and does nothing,
// if the key does not exist.
func (l *Limiter) Credit(t time.Time, key string, tokens int, until time.Time, next uint8, id uint32) bool {
	s := fixShare(Share{Burst: tokens})
	return l.with(key, func(sh *shard, e *entry) {
		e.credit = id
		if e.mark != next || e.assigned {
			return
		}
		l.lease(sh, e, t, s, until, next, tokens)
	})
}

// lease is Lease on e. Requires sh.mu held.
func (l *Limiter) lease(sh *shard, e *entry, t time.Time, s Share, until time.Time, next uint8, give int) {
	now := sh.advance(e, t)
	fresh := !e.assigned || now >= e.until
	e.mark, e.assigned, e.lapsed = next, true, false
	e.until = until.Sub(sh.base)
	e.setShare(now, s)
	if fresh {
		e.b.tokens = min(float64(max(give, 0)), float64(e.b.burst))
		e.b.last = now
	}
	if now >= e.until {
		e.lapse(now, l.Default())
	}
}

// fixShare makes s a share a key can run: no negative rate, and a burst of
// at least 1 unless s admits nothing at all.
func fixShare(s Share) Share {
	if s.Limit < 0 {
		s.Limit = 0
	}
	switch {
	case s.Limit == 0 && s.Burst <= 0:
		s.Burst = 0
	case s.Burst < 1:
		s.Burst = 1
	}
	return s
}

// assign puts s in force on e from t until until. Requires sh.mu held.
func (l *Limiter) assign(sh *shard, e *entry, t time.Time, s Share, until time.Time) {
	now := sh.advance(e, t)
	if e.mark != 0 {
		// until holds the hold of a marked key: the share waits.
		e.assigned, e.lapsed = false, true
		e.setShare(now, s)
		return
	}
	e.assigned, e.lapsed = true, false
	e.until = until.Sub(sh.base)
	e.setShare(now, s)
	if now >= e.until {
		e.lapse(now, l.Default())
	}
}

// SetNewMark makes every key created from now on start with mark m (see
// SetMark); 0, the default, creates keys unmarked. Keys that exist keep
// their marks.
func (l *Limiter) SetNewMark(m uint8) {
	if l.params.Load().mark == m {
		return // the loop sets it at every tick: no copy, no lock
	}
	l.setMu.Lock()
	defer l.setMu.Unlock()
	p := *l.params.Load()
	p.mark = m
	l.params.Store(&p)
}

// SetMark sets key's mark, a small number the caller gives a meaning to
// (package hybrid marks keys decided in Redis); 0 clears it. A marked key
// is not decided here: AllowN counts its attempt and reports its mark and
// hold. SetMark ends a lease in force (see Lease), even one that would
// have ended into the same mark. Marking or unmarking clears the hold and empties the key's
// bucket; an unmarked key runs the smaller of its share and the default
// until Assign or Unassign. It reports false if the key does not exist.
func (l *Limiter) SetMark(key string, m uint8) bool {
	return l.with(key, func(sh *shard, e *entry) {
		if e.mark == m && !e.assigned {
			return
		}
		e.mark = m
		e.until, e.assigned, e.lapsed = 0, false, true
		// Whatever the key decides here starts from an empty bucket: its
		// tokens were the caller's to spend elsewhere meanwhile.
		b := e.b.burst
		e.b.setBurst(e.last, 0)
		e.b.setBurst(e.last, b)
	})
}

// Give adds tokens to key's bucket at t, up to its burst: tokens that a
// request took and gave back (package hybrid's refunds), which the key may
// spend at once. A key decided elsewhere (marked, with no lease in force)
// takes none. It reports false if the key does not exist.
func (l *Limiter) Give(t time.Time, key string, tokens float64) bool {
	return l.with(key, func(sh *shard, e *entry) {
		now := sh.advance(e, t)
		if !(tokens > 0) || (e.mark != 0 && (!e.assigned || now >= e.until)) {
			return
		}
		e.b.tokens = min(e.b.advance(now)+tokens, float64(e.b.burst))
		e.b.last = now
	})
}

// SetHold asks that AllowN report Hold for key until until, if key is
// marked mark (not 0): a denial that said nothing is available until then.
// The caller passes the mark its decision was made under, so that the
// answer of a decision that lands after the mark changed (SetMark clears
// the hold) holds nothing; one that lands after the mark changed and came
// back to mark still holds. It reports whether the key exists with that
// mark.
func (l *Limiter) SetHold(key string, mark uint8, until time.Time) bool {
	ok := false
	l.with(key, func(sh *shard, e *entry) {
		if mark == 0 || e.mark != mark || e.assigned {
			return // a key that runs a lease (see Lease) holds nothing
		}
		ok = true
		if d := until.Sub(sh.base); d > e.until {
			e.until = d
		}
	})
	return ok
}

// ClearHold ends key's hold (SetHold), if it is marked: tokens came back to
// where its decisions are made (a refund), so its next request asks there
// again. It reports false if the key does not exist.
func (l *Limiter) ClearHold(key string) bool {
	return l.with(key, func(_ *shard, e *entry) {
		if e.mark != 0 && !e.assigned {
			e.until = 0
		}
	})
}

// Unassign moves key back to the default share at t, lapsed or not. It
// reports false if the key does not exist.
func (l *Limiter) Unassign(t time.Time, key string) bool {
	return l.with(key, func(sh *shard, e *entry) {
		e.fallBack(sh.advance(e, t), l.Default())
	})
}

// SetFlag sets or clears a mark on key that later decisions report in
// Result.Flagged; the caller gives it a meaning (package hybrid marks keys
// whose last lease request failed). It reports false if the key does not
// exist.
func (l *Limiter) SetFlag(key string, on bool) bool {
	return l.with(key, func(_ *shard, e *entry) { e.flagged = on })
}

// with runs f on key's entry with its shard locked, and reports false if the
// key does not exist.
func (l *Limiter) with(key string, f func(*shard, *entry)) bool {
	sh, h := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.keys.Get(h, key)
	if e == nil {
		return false
	}
	f(sh, e)
	return true
}

// SetInstances re-splits the default share for n live instances (n below 1
// counts as 1), keeping the rank and MinBurst of the current Place, and
// moves every key that runs at the default share to the new share at once.
// Keys with an assigned share keep it until it ends.
func (l *Limiter) SetInstances(t time.Time, n int) {
	l.setMu.Lock()
	defer l.setMu.Unlock()
	pl := l.params.Load().place
	pl.Instances = n
	l.setPlace(t, pl)
}

// SetPlace re-splits the default share for this instance's place p, all of
// it at once, and moves every key that runs at the default share to the
// new share. Keys with an assigned share keep it until it ends; lapsed keys
// run the smaller of their share and the new default.
func (l *Limiter) SetPlace(t time.Time, p Place) {
	l.setMu.Lock()
	defer l.setMu.Unlock()
	l.setPlace(t, p)
}

// setPlace is SetPlace. Requires l.setMu held.
func (l *Limiter) setPlace(t time.Time, pl Place) {
	pl = pl.fix()
	cur := l.params.Load()
	def := pl.share(cur.limit, cur.burst)
	if cur.place == pl && cur.def == def {
		return
	}
	p := *cur
	p.place, p.def = pl, def
	l.set(t, &p)
}

// SetLimit changes the limit's global rate and burst at t, as if the
// Limiter had been created with them: the default share is split anew by
// the instance count of Config.Instances or the last SetInstances
// (replacing a share given to SetDefault), and every key that runs at the
// default share moves to it at once, keeping the tokens it has (up to the
// new burst). Keys with an assigned share keep it until it ends: the caller
// assigns shares of the new limit. Holds (SetHold) end: they were denials
// under the old limit. SetLimit returns an error wrapping
// ErrInvalid, and changes nothing, if limit is not a positive finite rate
// or burst is below 1.
func (l *Limiter) SetLimit(t time.Time, limit rate.Limit, burst int) error {
	if err := check(limit, burst); err != nil {
		return err
	}
	l.setMu.Lock()
	defer l.setMu.Unlock()
	p := *l.params.Load()
	p.limit, p.burst = limit, burst
	p.def = p.place.share(limit, burst)
	l.setDropping(t, &p, true)
	return nil
}

// SetDefault sets the default share to s (a burst below 1 runs at 1) and
// moves every key that runs at the default share to it at once. The share
// holds until the next SetDefault, SetInstances, SetPlace or SetLimit.
func (l *Limiter) SetDefault(t time.Time, s Share) {
	if s.Burst < 1 {
		s.Burst = 1
	}
	l.setMu.Lock()
	defer l.setMu.Unlock()
	p := *l.params.Load()
	p.def = s
	l.set(t, &p)
}

// set puts p in force at t: every key at the default share moves to p's.
// Requires l.setMu held.
func (l *Limiter) set(t time.Time, p *params) { l.setDropping(t, p, false) }

// setDropping is set, which also ends every hold (SetHold) if drop: the
// holds were denials under the old limit, and the keys' next decisions ask
// again. Requires l.setMu held.
func (l *Limiter) setDropping(t time.Time, p *params, drop bool) {
	old := l.params.Swap(p)
	s := p.def
	if old.def == s && !drop {
		return
	}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.keys.Each(func(_ string, e *entry) {
			switch {
			case e.lapsed:
				e.setShare(sh.advance(e, t), e.capped(s))
			case !e.assigned:
				e.setShare(sh.advance(e, t), s)
			}
			if drop && e.mark != 0 && !e.assigned {
				e.until = 0
			}
		})
		sh.mu.Unlock()
	}
}

// AppendStats appends a snapshot of every key to dst and returns it. The
// order is unspecified.
func (l *Limiter) AppendStats(dst []KeyStats) []KeyStats {
	for i := range l.shards {
		dst = l.AppendShardStats(i, dst)
	}
	return dst
}

// Shards returns how many shards the limiter spreads its keys over: the
// shards of AppendShardStats are numbered from 0 up to it.
func (l *Limiter) Shards() int { return len(l.shards) }

// AppendShardStats appends a snapshot of every key of shard i to dst and
// returns it, in unspecified order; every key is in exactly one shard. A
// caller that looks at every key in turn takes one shard at a time, so that
// its buffer holds about 1/Shards() of the keys, not all of them. It panics
// if i is not in [0, Shards()).
func (l *Limiter) AppendShardStats(i int, dst []KeyStats) []KeyStats {
	sh := &l.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.keys.Each(func(key string, e *entry) { dst = append(dst, sh.stats(key, e)) })
	return dst
}

// Stats returns a snapshot of key, and false if the key does not exist.
func (l *Limiter) Stats(key string) (st KeyStats, ok bool) {
	ok = l.with(key, func(sh *shard, e *entry) { st = sh.stats(key, e) })
	return st, ok
}

// stats is a snapshot of key, whose entry is e. Requires sh.mu held.
func (sh *shard) stats(key string, e *entry) KeyStats {
	var until time.Time
	if e.assigned {
		until = sh.time(e.until)
	}
	return KeyStats{
		Key:       key,
		Attempted: e.attempted,
		LastSeen:  sh.time(e.seen),
		Created:   sh.time(e.created),
		Assigned:  e.assigned && e.last < e.until,
		Until:     until,
		Share:     Share{Limit: e.b.limit, Burst: e.b.burst},
		Denied:    e.denied,
		Mark:      e.mark,
		Flagged:   e.flagged,
		Lapsed:    e.lapsed,
	}
}

// EvictIdle removes every key whose latest decision is older than t minus
// idle, appends the removed keys to dst and returns it. A later decision on
// a removed key starts it afresh at the default share. Once most of the
// keys a shard held are gone, the memory they took is given back.
func (l *Limiter) EvictIdle(t time.Time, idle time.Duration, dst []string) []string {
	cutoff := t.Add(-idle)
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		before, now := cutoff.Sub(sh.base), t.Sub(sh.base)
		sh.removeIf(func(key string, e *entry) bool {
			if e.seen >= before || (e.assigned && e.until > now) {
				return false
			}
			dst = append(dst, key)
			return true
		})
		sh.mu.Unlock()
	}
	return dst
}

// Counts returns the decisions counted since New (see Tally). It takes
// each shard's lock in turn, not all at once: decisions made meanwhile are
// in it or in the next call's.
func (l *Limiter) Counts() Counts {
	var c [2][2]uint64
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for a := range c {
			for ok := range c[a] {
				c[a][ok] += sh.counts[a][ok]
			}
		}
		sh.mu.Unlock()
	}
	return Counts{DefaultAllowed: c[0][1], DefaultDenied: c[0][0], AssignedAllowed: c[1][1], AssignedDenied: c[1][0]}
}

// b2i is 1 for true and 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Len returns the number of keys held.
func (l *Limiter) Len() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += sh.keys.Len()
		sh.mu.Unlock()
	}
	return n
}
