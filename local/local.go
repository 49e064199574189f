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

	"github.com/hybridlimit/hybridlimit/internal/shrink"
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
	// Zero means 1.
	Instances int
	// Shards is the number of map shards, rounded up to a power of two.
	// Zero means DefaultShards.
	Shards int
}

// Share is the rate and burst one key runs at on this instance.
type Share struct {
	Limit rate.Limit // tokens per second
	Burst int        // tokens, at least 1
}

// Split returns the default share of a limit of rate limit and burst burst on
// one of n instances: limit/n and burst/n, the burst rounded down but at
// least 1. An n below 1 counts as 1.
func Split(limit rate.Limit, burst, n int) Share {
	if n < 1 {
		n = 1
	}
	b := burst / n
	if b < 1 {
		b = 1
	}
	return Share{Limit: limit / rate.Limit(n), Burst: b}
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
	// here: Allowed is false and the caller decides.
	Mark uint8
	// Hold, for a marked key, is how long the caller asked (SetHold) that
	// its requests be denied without asking again; 0 when it did not or
	// that time has passed.
	Hold time.Duration
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
	// Denied is the total number of tokens denied on this key by its
	// share (marked keys are not decided here, and deny nothing).
	Denied int64
	// Mark is the key's mark, see SetMark.
	Mark uint8
	// Lapsed reports whether the key's last assigned share ended without
	// an Unassign: it runs the smaller of that share and the default.
	Lapsed bool
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

// params are the limit's rate and burst, the instance count its default
// share is split by, and that share.
type params struct {
	limit rate.Limit
	burst int
	n     int
	def   Share
}

type shard struct {
	mu   sync.RWMutex
	m    map[string]*entry // guarded by mu
	size shrink.Tracker    // guarded by mu
	_    [32]byte          // keep shards on separate cache lines
}

type entry struct {
	mu        sync.Mutex
	lim       *rate.Limiter // guarded by mu, like every field below
	last      time.Time     // latest time fed to lim; never moves backwards
	created   time.Time     // time of the key's first decision
	seen      time.Time     // time of the key's latest decision
	attempted int64
	assigned  bool
	until     time.Time
	flagged   bool  // the caller's flag, see SetFlag
	mark      uint8 // the caller's mark, see SetMark
	lapsed    bool  // the assigned share ended: the key runs at most the default
	evicted   bool
	denied    int64
	hold      time.Time // see SetHold
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
		l.shards[i].m = make(map[string]*entry)
	}
	inst := max(cfg.Instances, 1)
	l.params.Store(&params{limit: cfg.Limit, burst: cfg.Burst, n: inst, def: Split(cfg.Limit, cfg.Burst, inst)})
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
// (Config.Instances, or the last SetInstances), at least 1.
func (l *Limiter) Instances() int { return l.params.Load().n }

// Default returns the current default share.
func (l *Limiter) Default() Share { return l.params.Load().def }

func (l *Limiter) shard(key string) *shard {
	return &l.shards[maphash.String(l.seed, key)&l.mask]
}

// Allow is shorthand for AllowN(t, key, 1).
func (l *Limiter) Allow(t time.Time, key string) Result { return l.AllowN(t, key, 1) }

// AllowN decides whether n tokens may be taken from key at time t, creating
// the key at the default share if it is new. n must be at least 1; a smaller
// n is denied. Deciding on an existing key does not allocate.
func (l *Limiter) AllowN(t time.Time, key string, n int) Result {
	if n < 1 {
		return Result{RetryAfter: math.MaxInt64}
	}
	for {
		sh := l.shard(key)
		sh.mu.RLock()
		e := sh.m[key]
		sh.mu.RUnlock()
		if e == nil {
			e = l.insert(sh, key, t)
		}
		e.mu.Lock()
		if e.evicted {
			// Lost a race with EvictIdle: decide on the key's new entry.
			e.mu.Unlock()
			continue
		}
		t = e.advance(t)
		e.seen = t
		e.attempted += int64(n)
		if e.assigned && !t.Before(e.until) {
			e.lapse(t, l.Default())
		}
		r := Result{Assigned: e.assigned, Flagged: e.flagged, Mark: e.mark}
		if e.mark != 0 {
			if t.Before(e.hold) {
				r.Hold = e.hold.Sub(t)
			}
			e.mu.Unlock()
			return r
		}
		r.Allowed = e.lim.AllowN(t, n)
		if !r.Allowed {
			e.denied += int64(n)
		}
		tokens := e.lim.TokensAt(t)
		if tokens > 0 {
			r.Remaining = int64(tokens)
		}
		if !r.Allowed {
			r.RetryAfter = retryAfter(e.lim.Limit(), e.lim.Burst(), tokens, n)
		}
		e.mu.Unlock()
		return r
	}
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

func (l *Limiter) insert(sh *shard, key string, t time.Time) *entry {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[key]; e != nil {
		return e
	}
	def := l.Default()
	// A new rate.Limiter has never been advanced, so it starts full.
	e := &entry{lim: rate.NewLimiter(def.Limit, def.Burst), last: t, created: t, seen: t}
	sh.m[key] = e
	sh.size.Grew(len(sh.m))
	return e
}

// advance clamps t so that the times fed to e.lim never move backwards.
// Requires e.mu held.
func (e *entry) advance(t time.Time) time.Time {
	if t.Before(e.last) {
		return e.last
	}
	e.last = t
	return t
}

// fallBack moves e back to the default share. Requires e.mu held.
func (e *entry) fallBack(t time.Time, def Share) {
	e.assigned, e.lapsed = false, false
	e.until = time.Time{}
	e.setShare(t, def)
}

// lapse ends e's assigned share at t: it runs the smaller of that share
// and def until Unassign. Requires e.mu held.
func (e *entry) lapse(t time.Time, def Share) {
	e.assigned, e.lapsed = false, true
	e.until = time.Time{}
	e.setShare(t, e.capped(def))
}

// capped is the smaller of e's share and def, rate and burst apart.
// Requires e.mu held.
func (e *entry) capped(def Share) Share {
	return Share{Limit: min(e.lim.Limit(), def.Limit), Burst: min(e.lim.Burst(), def.Burst)}
}

// setShare changes the rate and burst of e at t. Requires e.mu held.
func (e *entry) setShare(t time.Time, s Share) {
	if e.lim.Limit() != s.Limit {
		e.lim.SetLimitAt(t, s.Limit)
	}
	if e.lim.Burst() != s.Burst {
		e.lim.SetBurstAt(t, s.Burst)
	}
}

// Assign runs key at share s from t until until. After until the key
// runs the smaller of s and the default share (it lapses), until Unassign:
// whoever assigned s may still be counted at s elsewhere, not at the
// default share. It reports false, and does nothing, if the key does not
// exist (never seen, or evicted). A share with a positive rate and a
// burst below 1 runs at burst 1; the zero Share admits nothing.
func (l *Limiter) Assign(t time.Time, key string, s Share, until time.Time) bool {
	s = fixShare(s)
	return l.with(key, func(e *entry) { l.assign(e, t, s, until) })
}

// AssignNew is Assign, creating key at t first if it does not exist.
func (l *Limiter) AssignNew(t time.Time, key string, s Share, until time.Time) bool {
	s = fixShare(s)
	for {
		sh := l.shard(key)
		sh.mu.RLock()
		e := sh.m[key]
		sh.mu.RUnlock()
		if e == nil {
			e = l.insert(sh, key, t)
		}
		e.mu.Lock()
		if e.evicted {
			e.mu.Unlock()
			continue
		}
		l.assign(e, t, s, until)
		e.mu.Unlock()
		return true
	}
}

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

// assign puts s in force on e from t until until. Requires e.mu held.
func (l *Limiter) assign(e *entry, t time.Time, s Share, until time.Time) {
	t = e.advance(t)
	e.assigned, e.lapsed = true, false
	e.until = until
	e.setShare(t, s)
	if !t.Before(until) {
		e.lapse(t, l.Default())
	}
}

// SetMark sets key's mark, a small number the caller gives a meaning to
// (package hybrid marks keys decided in Redis); 0 clears it. A marked key
// is not decided here: AllowN counts its attempt and reports its mark. It
// reports false if the key does not exist.
func (l *Limiter) SetMark(key string, m uint8) bool {
	return l.with(key, func(e *entry) {
		e.mark = m
		e.hold = time.Time{}
	})
}

// SetHold asks that AllowN report Hold for the marked key until until: a
// denial that said nothing is available until then. It reports false if
// the key does not exist.
func (l *Limiter) SetHold(key string, until time.Time) bool {
	return l.with(key, func(e *entry) {
		if until.After(e.hold) {
			e.hold = until
		}
	})
}

// Unassign moves key back to the default share at t, lapsed or not. It
// reports false if the key does not exist.
func (l *Limiter) Unassign(t time.Time, key string) bool {
	return l.with(key, func(e *entry) { e.fallBack(e.advance(t), l.Default()) })
}

// SetFlag sets or clears a mark on key that later decisions report in
// Result.Flagged; the caller gives it a meaning (package hybrid marks keys
// whose last lease request failed). It reports false if the key does not
// exist.
func (l *Limiter) SetFlag(key string, on bool) bool {
	return l.with(key, func(e *entry) { e.flagged = on })
}

// with runs f on key's entry with the entry locked, and reports false if the
// key does not exist.
func (l *Limiter) with(key string, f func(*entry)) bool {
	sh := l.shard(key)
	sh.mu.RLock()
	e := sh.m[key]
	sh.mu.RUnlock()
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.evicted {
		return false
	}
	f(e)
	return true
}

// SetInstances re-splits the default share for n live instances (n below 1
// counts as 1) and moves every key that runs at the default share to the new
// share at once. Keys with an assigned share keep it until it ends.
func (l *Limiter) SetInstances(t time.Time, n int) {
	n = max(n, 1)
	l.setMu.Lock()
	defer l.setMu.Unlock()
	cur := l.params.Load()
	def := Split(cur.limit, cur.burst, n)
	if cur.n == n && cur.def == def {
		return
	}
	p := *cur
	p.n, p.def = n, def
	l.set(t, &p)
}

// SetLimit changes the limit's global rate and burst at t, as if the
// Limiter had been created with them: the default share is split anew by
// the instance count of Config.Instances or the last SetInstances
// (replacing a share given to SetDefault), and every key that runs at the
// default share moves to it at once, keeping the tokens it has (up to the
// new burst). Keys with an assigned share keep it until it ends: the caller
// assigns shares of the new limit. SetLimit returns an error wrapping
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
	p.def = Split(limit, burst, p.n)
	l.set(t, &p)
	return nil
}

// SetDefault sets the default share to s (a burst below 1 runs at 1) and
// moves every key that runs at the default share to it at once. The share
// holds until the next SetDefault, SetInstances or SetLimit.
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
func (l *Limiter) set(t time.Time, p *params) {
	old := l.params.Swap(p)
	s := p.def
	if old.def == s {
		return
	}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.RLock()
		for _, e := range sh.m {
			e.mu.Lock()
			switch {
			case e.lapsed:
				e.setShare(e.advance(t), e.capped(s))
			case !e.assigned:
				e.setShare(e.advance(t), s)
			}
			e.mu.Unlock()
		}
		sh.mu.RUnlock()
	}
}

// AppendStats appends a snapshot of every key to dst and returns it. The
// order is unspecified.
func (l *Limiter) AppendStats(dst []KeyStats) []KeyStats {
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.RLock()
		for k, e := range sh.m {
			e.mu.Lock()
			dst = append(dst, KeyStats{
				Key:       k,
				Attempted: e.attempted,
				LastSeen:  e.seen,
				Created:   e.created,
				Assigned:  e.assigned && e.last.Before(e.until),
				Until:     e.until,
				Share:     Share{Limit: e.lim.Limit(), Burst: e.lim.Burst()},
				Denied:    e.denied,
				Mark:      e.mark,
				Lapsed:    e.lapsed,
			})
			e.mu.Unlock()
		}
		sh.mu.RUnlock()
	}
	return dst
}

// EvictIdle removes every key whose latest decision is older than t minus
// idle and whose assigned share, if any, has ended by t, appends the
// removed keys to dst and returns it. A later decision on a removed key
// starts it afresh at the default share. Once most of the
// keys a shard held are gone, the memory they took is given back.
func (l *Limiter) EvictIdle(t time.Time, idle time.Duration, dst []string) []string {
	cutoff := t.Add(-idle)
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			e.mu.Lock()
			if e.seen.Before(cutoff) && !(e.assigned && t.Before(e.until)) {
				e.evicted = true
				delete(sh.m, k)
				dst = append(dst, k)
			}
			e.mu.Unlock()
		}
		sh.m = shrink.Map(sh.m, &sh.size)
		sh.mu.Unlock()
	}
	return dst
}

// Len returns the number of keys held.
func (l *Limiter) Len() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}
