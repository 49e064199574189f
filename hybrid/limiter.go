package hybrid

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/hybrid/placement"
	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/membership"
)

// Limiter decides requests against a set of named limits. It is safe for
// concurrent use. Create it with New and release it with Close.
type Limiter struct {
	cfg      Config                      // Limits: those given to New; the current ones are in set
	store    store                       // nil when every limit is Local
	diagnose func(context.Context) error // see explain; nil if the client cannot tell
	members  membership.Counter
	log      *slog.Logger
	m        *metrics

	// set holds the limits. Decisions read it without a lock; SetLimits
	// replaces it, under setMu, and never mutates one.
	set   atomic.Pointer[limitSet]
	setMu sync.Mutex

	// down holds why Redis is taken to be unreachable, nil while it is not:
	// limits that start to use Redis while it is down start degraded.
	down atomic.Pointer[outage]

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	quit      chan struct{} // closed by Close to stop the loop
	done      chan struct{} // closed by the loop when it returns
	health    health        // owned by the loop
	seen      *limitSet     // owned by the loop: the limits it last put in force
	resettle  atomic.Bool   // N changed: shares will move, settled leases renew now
	// exactFailed says an exact decision got no answer from Redis since
	// the loop last looked: the loop, which may have no lease to renew,
	// then checks whether Redis is gone.
	exactFailed atomic.Bool
	stopWatch   func()
	// quotasEvicted is when the loop last evicted the idle keys of the
	// local quotas (see quotaEvictEvery). Owned by the loop.
	quotasEvicted time.Time
	// definitionsAt is when the loop last compared the instances'
	// definitions of the limits (compareDefinitions). Owned by the loop.
	definitionsAt time.Time

	peakMu  sync.Mutex
	samples []peerSample // guarded by peakMu: instance counts and names seen within PeakWindow

	// shareMu serialises the changes of the local quotas' shares and of the
	// degraded flags, and the publication of a new set by SetLimits, so
	// that a count change, a degrade and a change of limits at the same
	// moment cannot leave a stale share or flag.
	shareMu sync.Mutex
}

// peerSample is what membership said from at until the next sample's time:
// the live count and, when Members is a membership.Roster, the members'
// names (see rank.go); a graceful leave lowers the samples that counted the
// leaver (see onView).
type peerSample struct {
	at    time.Time
	n     int
	names []string // sorted; nil when unknown
}

// outage is why Redis is taken to be unreachable.
type outage struct{ cause error }

// limitSet is the Limiter's limits at one moment.
type limitSet struct {
	byName map[string]*limitEntry
	order  []*limitEntry // as given to New or SetLimits
}

// limitEntry is one limit as it is configured now: its Limit, fixed for the
// entry's life (SetLimits makes a new entry), and the state that outlives a
// change of it.
type limitEntry struct {
	Limit
	*limitState
}

// limitState is what a limit keeps while SetLimits changes its Limit.
type limitState struct {
	// loc is the local quota, rate/N-hat per key: the decisions of a Local
	// limit, and of FailLocal while Redis is unreachable.
	loc *local.Limiter
	// keys holds the keys of a Hybrid limit (empty otherwise): each one
	// marked with its exact generation, or running a lease (see
	// local.Limiter.Lease). Every key it creates starts marked
	// placement.FirstGen: decided exactly.
	keys        *local.Limiter
	degraded    atomic.Bool // Redis unreachable: exact and Global decisions follow OnOutage; written under shareMu
	m           *limitMetrics
	count       bool          // count the decisions loc and keys do not: metrics are registered somewhere
	commands    atomic.Uint64 // Redis commands sent for this limit
	failingKeys atomic.Int64  // keys flagged failing at the last tick, for Status
	// unlogged holds the cause of a degrade made by a decision, whose log
	// line the loop writes (see explain): a decision does not wait for it.
	unlogged atomic.Pointer[error]
	// failCause is why a key's ask or take last failed, for the log line
	// of the first failing key.
	failCause atomic.Pointer[error]
	// exceedsLogged is set once a request above the burst was logged.
	exceedsLogged atomic.Bool

	// Owned by the lease loop goroutine, and by Close once it has stopped.
	pol     *placement.Policy // nil unless applied.Mode is Hybrid
	applied Limit             // the Limit pol and the loop follow; zero until the loop first sees the limit
	stats   []local.KeyStats
	// disagreement is how the other instances' definitions of the limit
	// differed from this one's when last compared, "" when they agreed.
	disagreement string
}

// New returns a Limiter for cfg and starts its lease loop. It returns an
// error wrapping ErrConfig, naming the limit and what to fix, if cfg is
// invalid. A Hybrid key's first decisions are exact, and its lease is asked
// for at a tick after them. When a Redis client is configured
// New checks it once (a PING and a probe of the right to run scripts),
// within RedisTimeout, so that refused credentials are an
// error here, and so is a server TLS certificate the client reports it
// cannot verify (the error wraps the *tls.CertificateVerificationError); an
// unreachable Redis is not: every limit that uses Redis then starts
// degraded, following its outage policy (Status.Degraded is true), until
// Redis answers the lease loop. go-redis reports a failed dial only after
// DialerRetries attempts DialerRetryTimeout apart (5 and 100ms by default,
// longer than the default RedisTimeout), so with those defaults an
// unverifiable certificate looks unreachable here; a client with
// DialerRetries 1 and a DialerRetryTimeout well below RedisTimeout reports
// it in time.
func New(cfg Config) (*Limiter, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var st store
	var unreachable error
	if cfg.Redis != nil {
		st = global.New(cfg.Redis, cfg.Prefix)
		var err error
		if unreachable, err = checkCredentials(cfg, st); err != nil {
			return nil, err
		}
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("%w: registering metrics: %w", ErrConfig, err)
	}
	l := &Limiter{
		cfg:     cfg,
		store:   st,
		members: cfg.Members,
		log:     cfg.Logger,
		m:       m,
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if cfg.Redis != nil {
		l.diagnose = dialCheck(cfg.Redis)
	}
	now := time.Now()
	l.health = health{quiet: cfg.UncontendedTTL/placement.RenewDivisor + cfg.Tick, answered: now}
	roster := l.firstSample(now)
	if unreachable != nil {
		unreachable = l.explain(unreachable)
		l.down.Store(&outage{cause: unreachable})
	}
	set := &limitSet{byName: make(map[string]*limitEntry, len(cfg.Limits))}
	for _, lim := range cfg.Limits {
		e, err := l.newEntry(lim, now)
		if err != nil {
			return nil, err
		}
		set.byName[lim.Name] = e
		set.order = append(set.order, e)
		if e.degraded.Load() {
			l.log.Warn("hybridlimit: Redis not reachable at start, limit degraded to its outage policy until it answers",
				"limit", e.Name, "policy", e.OnOutage.String(), "error", unreachable)
		}
	}
	l.set.Store(set)
	l.seen = set
	if roster != nil {
		l.stopWatch = roster.WatchView(l.onView)
	} else {
		l.stopWatch = l.members.Watch(l.onPeers)
	}
	go l.loop()
	return l, nil
}

// firstSample records the instance count at now, and the members' names
// when Members is a membership.Roster, which it returns (nil otherwise).
func (l *Limiter) firstSample(now time.Time) membership.Roster {
	n := l.members.Count()
	roster, _ := l.members.(membership.Roster)
	if roster != nil {
		// A leave between this View and WatchView in New is missed: the
		// leaver stays counted for PeakWindow, as a failed one would.
		v := roster.View()
		n = v.Count
		l.samples = []peerSample{{at: now, n: n, names: v.Members}}
	} else {
		l.samples = []peerSample{{at: now, n: n}}
	}
	l.m.peers.Set(float64(n))
	return roster
}

// newEntry returns a new limit for lim at now: degraded from the start if
// it uses Redis and Redis is down.
func (l *Limiter) newEntry(lim Limit, now time.Time) (*limitEntry, error) {
	n, rank := l.place(now)
	cfg := local.Config{Limit: rate.Limit(lim.Rate), Burst: lim.Burst, Instances: n}
	loc, err := local.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: limit %q: %w", ErrConfig, lim.Name, err)
	}
	keys, _ := local.New(cfg) // as loc
	// From the first decision: a key runs nothing Redis does not count.
	keys.SetNewMark(placement.FirstGen)
	e := &limitEntry{Limit: lim, limitState: &limitState{loc: loc, keys: keys,
		m: l.m.forLimit(lim.Name, loc, keys), count: l.cfg.Registerer != nil}}
	if lim.Mode != Local && l.down.Load() != nil {
		e.degraded.Store(true)
		e.m.degraded.Set(1)
	}
	loc.SetPlace(now, placeOf(e, n, rank))
	return e, nil
}

// lookup returns the named limit as configured now, or nil.
func (l *Limiter) lookup(limit string) *limitEntry { return l.set.Load().get(limit) }

// scanLimits is the most limits a set finds by comparing names in order
// rather than in its map: a map hashes the name on every lookup, which costs
// more than comparing a few short names (mostly their lengths).
const scanLimits = 8

// get returns the named limit of s, or nil.
func (s *limitSet) get(name string) *limitEntry {
	if len(s.order) <= scanLimits {
		for _, e := range s.order {
			if e.Name == name {
				return e
			}
		}
		return nil
	}
	return s.byName[name]
}

// checkCredentials checks Redis once (Store.Check: a PING and a script
// probe), within RedisTimeout, so that a wrong
// password, a user without the rights to run scripts, or a server
// certificate that fails the client's TLS verification (unknown CA, wrong
// name, expired) is a clear error at New: they are configuration, which
// waiting does not fix. An unreachable Redis is not an error: checkCredentials
// returns why it is unreachable, and the limits start degraded, as during
// an outage, and recover when it answers.
func checkCredentials(cfg Config, st store) (unreachable, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.RedisTimeout)
	defer cancel()
	err = st.Check(ctx)
	if err == nil {
		return nil, nil
	}
	for _, refusal := range []string{"WRONGPASS", "NOAUTH", "NOPERM"} {
		if strings.Contains(err.Error(), refusal) {
			return nil, fmt.Errorf("%w: Redis refused this client: %v: check the Username and Password of the Redis client, and that its ACL user may run PING, EVAL and EVALSHA", ErrConfig, err)
		}
	}
	var badCert *tls.CertificateVerificationError
	if errors.As(err, &badCert) {
		return nil, fmt.Errorf("%w: the Redis client cannot verify the server's TLS certificate: %w: check the RootCAs and ServerName of the client's TLSConfig", ErrConfig, err)
	}
	return err, nil
}

// Allow is shorthand for AllowN(ctx, limit, key, 1).
func (l *Limiter) Allow(ctx context.Context, limit, key string) (Decision, error) {
	return l.AllowN(ctx, limit, key, 1)
}

// AllowN decides whether n tokens may be taken from key under limit now.
//
// Local decisions, and Hybrid decisions on a key leased here, are made in
// process and never wait on the network. A Global decision, and a Hybrid
// decision on a key decided exactly (its first decisions here, so that a
// client's burst of up to the limit's burst is admitted whole wherever it
// lands; thin keys; keys sprayed near their limit), is one Redis round
// trip, bounded by Config.RedisTimeout and by ctx; while a limit is
// degraded none waits. An exact denial, and an exact admission that left
// the key's pool empty, is followed by a hold: later requests on that key
// are denied in process until the turn Redis gave this instance (when
// tokens would be there for it, the instances that must wait taking
// turns). A denial is a Decision with Allowed false, not an error. AllowN
// returns an error for an unknown limit (ErrUnknownLimit), n below 1
// (ErrInvalidN), after Close (ErrClosed), or when ctx ends during a
// decision in Redis. When n exceeds the limit's burst it returns a denial
// with RetryAfter Never together with ErrExceedsBurst, since waiting can
// never help.
//
// A limit in shadow mode (Limit.Shadow) decides and counts as usual and
// then admits: a denial comes back as Allowed and Shadowed, with no error,
// ErrExceedsBurst included.
//
// A limit changed by SetLimits decides by its new Limit from the moment
// SetLimits returns; a removed one returns ErrUnknownLimit.
//
// A key longer than MaxKeyBytes is held as its SHA-256 digest: what a key
// costs in memory, in Redis and in logs does not grow with its length.
func (l *Limiter) AllowN(ctx context.Context, limit, key string, n int) (d Decision, err error) {
	ls, err := l.entry(limit)
	if err != nil {
		return Decision{}, err
	}
	err = l.decide(ctx, ls, key, n, &d, nil)
	return d, err
}

// entry returns the named limit as configured now, ErrClosed after Close,
// or ErrUnknownLimit.
func (l *Limiter) entry(limit string) (*limitEntry, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	ls := l.lookup(limit)
	if ls == nil {
		return nil, l.unknown(limit)
	}
	return ls, nil
}

// decide is AllowN under the limit ls: it sets *d to the decision, or
// returns the error. A decision in Redis sets *at, if at is not nil, to
// the server time it ran at (see Reservation.Cancel).
//
// Local decisions, and Hybrid ones on a lease, are the hot path: they are
// decided here, in one frame, and their Decision is written once, field by
// field, from values held in registers. A Decision or a local.Result has
// more than four fields, so the compiler keeps one in memory: returned by
// value from function to function, every copy of it cost a
// store-forwarding stall, together about a fifth of the decision.
func (l *Limiter) decide(ctx context.Context, ls *limitEntry, key string, n int, d *Decision, at *time.Time) error {
	key = heldKey(key) // for AllowN, Wait, Middleware and Admit alike
	if n < 1 {
		return fmt.Errorf("%w: got %d", ErrInvalidN, n)
	}
	if n > ls.Burst || (ls.Mode == Local && n > 1 && n > ls.loc.Default().Burst) {
		var err error
		*d, err = l.exceedsBurst(ls, n)
		return err
	}
	switch ls.Mode {
	case Global:
		g, err := l.global(ctx, ls, key, n, at)
		if err != nil {
			return err
		}
		*d = g
		return nil
	case Hybrid:
		return l.hybrid(ctx, ls, key, n, d, at)
	}
	// loc counts the decisions it makes (see decisionsCollector).
	var r local.Result
	ls.loc.AllowNTallyInto(time.Time{}, key, n, local.TallyDefault, &r)
	allowed, wait := r.Allowed, r.RetryAfter
	shadow := !allowed && ls.Shadow
	if shadow {
		allowed, wait = true, 0 // as shadowed makes it
	}
	d.Allowed, d.Remaining, d.RetryAfter, d.Source, d.Shadowed = allowed, r.Remaining, wait, SourceLocal, shadow
	return nil
}

// hybrid is decide for a limit in Hybrid mode: on the key's lease when one
// is in force here, else exactly, with one script against the key's pool in
// Redis, or while the limit is degraded by its outage policy.
func (l *Limiter) hybrid(ctx context.Context, ls *limitEntry, key string, n int, d *Decision, at *time.Time) error {
	var r local.Result
	// keys counts the decisions on a lease (see decisionsCollector). The
	// zero time: the decision's, read once the key's lock is held.
	ls.keys.AllowNTallyInto(time.Time{}, key, n, local.TallyAssigned, &r)
	if r.Mark != 0 {
		var e Decision
		var err error
		switch {
		case ls.degraded.Load():
			e = l.outage(ls, key, n)
		case r.Assigned:
			e, err = l.beyondLease(ctx, ls, key, n, &r, at)
		default:
			e, err = l.exact(ctx, ls, key, n, &r, at)
		}
		*d = e
		return err
	}
	allowed, wait := r.Allowed, r.RetryAfter
	if wait == Never {
		// A lease of no burst at all (a grant too small to hold a
		// token): a renewal may grow it, so look again after one.
		wait = l.cfg.ContendedTTL / placement.RenewDivisor
	}
	shadow := !allowed && ls.Shadow
	if shadow {
		allowed, wait = true, 0 // as shadowed makes it
	}
	d.Allowed, d.Remaining, d.RetryAfter, d.Source, d.Shadowed = allowed, r.Remaining, wait, SourceLease, shadow
	return nil
}

// exceedsBurst is the decision on n tokens under ls when n exceeds the
// limit's burst, or in Local mode this instance's share of it: a denial
// that waiting can never turn, with ErrExceedsBurst unless the limit is in
// shadow mode. It is a mistake in the costs, not a rate limit: counted
// under its own outcome, and logged the first time for each limit.
func (l *Limiter) exceedsBurst(ls *limitEntry, n int) (Decision, error) {
	d := Decision{RetryAfter: Never, Source: SourceLocal}
	switch ls.Mode {
	case Global:
		d.Source = SourceGlobal
	case Hybrid:
		d.Source = SourceLease
	}
	if ls.count {
		ls.m.decisions.exceeds(d.Source)
	}
	err := fmt.Errorf("%w: limit %q: n %d > burst %d", ErrExceedsBurst, ls.Name, n, ls.Burst)
	if n <= ls.Burst {
		err = fmt.Errorf("%w: limit %q: n %d > this instance's share of the burst (%d of %d): Local mode splits the burst over the instances",
			ErrExceedsBurst, ls.Name, n, ls.loc.Default().Burst, ls.Burst)
	}
	if ls.exceedsLogged.CompareAndSwap(false, true) {
		l.log.Error("hybridlimit: a request costs more than the limit can ever admit: check the costs (logged once per limit)",
			"limit", ls.Name, "error", err)
	}
	if ls.Shadow {
		return shadowed(d), nil
	}
	return d, err
}

// outage is the decision on n tokens of key under ls by its outage policy,
// Redis being unreachable: the local quota (FailLocal, counted by loc), or
// admit or reject (counted here).
func (l *Limiter) outage(ls *limitEntry, key string, n int) Decision {
	if ls.OnOutage != FailLocal {
		return ls.finish(l.policy(ls))
	}
	var r local.Result
	ls.loc.AllowNTallyInto(time.Time{}, key, n, local.TallyDefault, &r)
	return ls.shade(fromLocal(r, SourceLocal))
}

// finish counts decision d under ls, which ls.loc did not decide, and
// returns it as the caller gets it (see shade).
func (ls *limitEntry) finish(d Decision) Decision {
	if ls.count {
		ls.m.decisions.count(d.Source, d.Allowed)
	}
	return ls.shade(d)
}

// shade returns decision d under ls as the caller gets it: a denial of a
// limit in shadow mode comes back shadowed.
func (ls *limitEntry) shade(d Decision) Decision {
	if ls.Shadow && !d.Allowed {
		return shadowed(d)
	}
	return d
}

// exact decides n tokens of key, in the exact placement, with one script
// against the key's pool, bounded by RedisTimeout, and counts the
// decision. r is what the key's local limiter said: its mark, the
// generation the take carries; its hold, the deny cache (a denial that
// said "nothing until t" is repeated here until t, without asking); its
// flag, set while its takes fail; and the tokens asked for on the key,
// which Redis measures the key's demand here by.
func (l *Limiter) exact(ctx context.Context, ls *limitEntry, key string, n int, r *local.Result, at *time.Time) (Decision, error) {
	if r.Hold > 0 {
		if r.Flagged {
			// The key's takes fail: an outage, until it tries again.
			return ls.finish(Decision{RetryAfter: r.Hold, Source: SourceFailClosed}), nil
		}
		return ls.finish(Decision{RetryAfter: r.Hold, Source: SourceExact}), nil
	}
	sent := time.Now()
	t, now, err := l.take(ctx, ls, key, n, r.Mark, r.Attempted, creditTokens, r.Credit)
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, fmt.Errorf("hybrid: limit %q: %w", ls.Name, ctx.Err())
		}
		return l.takeFailed(ls, key, r.Mark, now, err), nil
	}
	if r.Flagged {
		ls.keys.SetFlag(key, false)
	}
	setAt(at, &t)
	if t.Credit > 0 {
		// Tokens Redis handed ahead of the key's next requests: a lease
		// of rate 0 that they are admitted from here until it is spent
		// or ends, and then the key is decided exactly again. It ends
		// creditLife after the take was sent, no later than Redis stops
		// counting it, creditLife after the take ran.
		ls.keys.Credit(now, key, t.Credit, sent.Add(creditLife), r.Mark, t.CreditID)
	}
	if hold := l.holdFor(&t); hold > 0 {
		ls.keys.SetHold(key, r.Mark, now.Add(hold))
	}
	return ls.finish(l.fromTake(&t)), nil
}

// beyondLease decides n tokens of key, which its lease here can never
// hold (n is above the lease's part of the burst, but within the burst),
// with one take from the key's pool in Redis, where the cluster's bucket
// may hold them. The take carries the generation of the lease's record
// (the one before its mark), so that Redis keeps the lease and counts it.
func (l *Limiter) beyondLease(ctx context.Context, ls *limitEntry, key string, n int, r *local.Result, at *time.Time) (Decision, error) {
	t, now, err := l.take(ctx, ls, key, n, placement.PrevGen(r.Mark), r.Attempted, 0, 0)
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, fmt.Errorf("hybrid: limit %q: %w", ls.Name, ctx.Err())
		}
		return l.takeFailed(ls, key, r.Mark, now, err), nil
	}
	setAt(at, &t)
	return ls.finish(l.fromTake(&t)), nil
}

// setAt sets *at, if at is not nil, to the server time take t ran at.
func setAt(at *time.Time, t *global.Take) {
	if at != nil {
		*at = t.At
	}
}

// take runs one take of n tokens of key from its pool, under generation
// gen, asking for up to extra tokens of credit and saying that the credit
// named credit (0: none) is over here, bounded by RedisTimeout, and
// returns Redis's answer and when it came (holds count from then, as
// Redis's times do).
func (l *Limiter) take(ctx context.Context, ls *limitEntry, key string, n int, gen uint8, asked int64, extra int, credit uint32) (global.Take, time.Time, error) {
	cctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
	t, err := l.store.TakePool(cctx, global.PoolTake{
		Limit: ls.Name, Key: key, Instance: l.members.Name(), Gen: gen,
		// N-hat, which the loop keeps in loc: an atomic load, where place
		// takes a lock.
		Rate: ls.Rate, Burst: ls.Burst, Instances: max(ls.loc.Instances(), 1), N: n,
		TTL: l.cfg.UncontendedTTL, Asked: asked, Extra: extra, CreditTTL: creditLife, CreditID: credit,
	})
	cancel()
	ls.sent(1)
	return t, time.Now(), err
}

// fromTake is the decision of take t: what the client has left is the
// pool's tokens and the credit taken for its next requests here; tokens
// the pool can never hold as it is are looked for again after a renewal
// period, when the leases may have given it back its part of the burst.
func (l *Limiter) fromTake(t *global.Take) Decision {
	d := Decision{Allowed: t.Allowed, Remaining: t.Remaining + int64(t.Credit), RetryAfter: t.RetryAfter, Source: SourceExact}
	if d.RetryAfter == Never {
		d.RetryAfter = l.cfg.ContendedTTL / placement.RenewDivisor
	}
	return d
}

// takeFailed is the decision on an exact take of key, under mark, that
// failed at now with err, counted.
func (l *Limiter) takeFailed(ls *limitEntry, key string, mark uint8, now time.Time, err error) Decision {
	ls.m.redisErrors.Inc()
	if global.IsReplyError(err) {
		// WRONGTYPE at this key, NOPERM: about this decision only.
		// It is denied, which keeps the bound, and so are the key's
		// next ones for a tick.
		ls.keys.SetHold(key, mark, now.Add(l.cfg.Tick))
		return ls.finish(Decision{RetryAfter: l.cfg.Tick, Source: SourceExact})
	}
	// Redis, or the Cluster node of this key, is unreachable for this
	// key. The loop checks Redis at its next tick, which degrades every
	// limit if Redis is gone (a limit whose keys are all exact has no
	// renewal to tell it), and the policies decide from then on. Until
	// then the key is refused as an outage (SourceFailClosed: the
	// middleware answers 503, not 429), whatever its policy: Redis may
	// still answer the other instances, and what this one admitted on
	// its own would come on top of what Redis hands them. The key is
	// flagged failing and tries Redis again only a renewal period later,
	// so that its decisions do not all wait on a node that is down.
	l.exactFailed.Store(true)
	wait := l.cfg.ContendedTTL / placement.RenewDivisor
	ls.keys.SetFlag(key, true)
	ls.keys.SetHold(key, mark, now.Add(wait))
	err = redact(err, key)
	ls.failCause.Store(&err)
	return ls.finish(Decision{RetryAfter: wait, Source: SourceFailClosed})
}

// An allowed exact decision asks for creditTokens more, ahead of the key's
// next requests here (credit): Redis hands them only from a pool that stays
// at least half full, and counts them out of the pool until they end or the
// key's next take names them (docs/protocol.md#credit). What else was
// tried, and why a token for 2 s: PLACEMENT.md.
const (
	creditTokens = 1
	creditLife   = 2 * time.Second
)

// holdFor is how long after an exact take's answer t the key's next
// decisions are denied in process, without asking Redis: until the turn
// Redis gave a denial, or an admission that emptied the pool; a renewal
// period when the pool has no rate at all; 0 otherwise.
func (l *Limiter) holdFor(t *global.Take) time.Duration {
	switch {
	case !t.Allowed && t.RetryAfter > 0 && t.RetryAfter != Never:
		// Until the turn Redis gave, which the caller is not told: it
		// is told when the pool would hold its tokens.
		return max(t.Turn, t.RetryAfter)
	case !t.Allowed && t.RetryAfter == Never && !(t.PoolRate > 0):
		// The leases hold the whole rate, and the pool gets some back
		// only as they renew, release or end. Until the earliest a
		// contended one renews, every take would be denied: one script
		// per request for nothing.
		return l.cfg.ContendedTTL / placement.RenewDivisor
	case t.Allowed && t.Turn > 0:
		// This admission emptied the pool: the next tokens are for the
		// callers whose turns come first.
		return t.Turn
	}
	return 0
}

// shadowed is the admission a limit in shadow mode makes of denial d.
func shadowed(d Decision) Decision {
	return Decision{Allowed: true, Remaining: d.Remaining, Source: d.Source, Shadowed: true}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func fromLocal(r local.Result, s Source) Decision {
	return Decision{Allowed: r.Allowed, Remaining: r.Remaining, RetryAfter: r.RetryAfter, Source: s}
}

// sent counts n Redis commands sent for the limit.
func (ls *limitState) sent(n int) {
	ls.commands.Add(uint64(n))
	ls.m.redisCommands.Add(float64(n))
}

// policy is the decision of ls's FailOpen or FailClosed policy.
func (l *Limiter) policy(ls *limitEntry) Decision {
	if ls.OnOutage == FailOpen {
		return Decision{Allowed: true, Source: SourceFailOpen}
	}
	return Decision{RetryAfter: l.cfg.Tick, Source: SourceFailClosed}
}

// global decides one request of a Global limit with the Redis token bucket,
// or with the outage policy while Redis is unreachable, and counts it.
func (l *Limiter) global(ctx context.Context, ls *limitEntry, key string, n int, at *time.Time) (Decision, error) {
	if !ls.degraded.Load() {
		cctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
		t, err := l.store.TakeN(cctx, ls.Name, key, ls.Rate, ls.Burst, n)
		cancel()
		ls.sent(1)
		if err == nil {
			setAt(at, &t)
			return ls.finish(Decision{Allowed: t.Allowed, Remaining: t.Remaining, RetryAfter: t.RetryAfter, Source: SourceGlobal}), nil
		}
		if ctx.Err() != nil {
			return Decision{}, fmt.Errorf("hybrid: limit %q: %w", ls.Name, ctx.Err())
		}
		ls.m.redisErrors.Inc()
		if !global.IsReplyError(err) {
			// The loop writes the log line: explaining the cause may take
			// another round trip, which this decision does not wait for.
			l.setDegraded(ls, true, &cause{err: redact(err, key), later: true})
		}
		// A reply error (WRONGTYPE at this key, NOPERM) is about this
		// decision only: Redis is up, so only this decision follows the
		// policy.
	}
	return l.outage(ls, key, n), nil
}

// Wait blocks until n tokens of key under limit are admitted, or ctx ends.
// It returns ctx's error if ctx ends first, and the errors of AllowN. It
// returns ErrExceedsBurst at once if n exceeds the limit's burst, or if n
// exceeds this instance's share of the burst while that share is fixed (a
// Local limit, or FailLocal during an outage): such a wait could never end.
func (l *Limiter) Wait(ctx context.Context, limit, key string, n int) error {
	var timer *time.Timer
	for {
		d, err := l.AllowN(ctx, limit, key, n)
		if err != nil {
			return err
		}
		if d.RetryAfter == Never && d.Source == SourceLocal {
			ls := l.lookup(limit)
			if ls != nil && (ls.Mode == Local || ls.degraded.Load()) {
				return fmt.Errorf("%w: limit %q: n %d exceeds this instance's share of the burst (%d of %d)",
					ErrExceedsBurst, limit, n, ls.loc.Default().Burst, ls.Burst)
			}
		}
		if d.Allowed {
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		wait := d.RetryAfter
		if wait <= 0 || wait > l.cfg.ContendedTTL {
			// Shares change with every renewal: look again then.
			wait = l.cfg.Tick
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}

// Status is a snapshot of one limit on this instance.
type Status struct {
	Limit
	// Degraded reports whether Redis is unreachable and the limit follows
	// its OnOutage policy (for Hybrid limits: for keys whose lease ran out).
	Degraded bool
	// Instances is the live instance count N.
	Instances int
	// LocalShare is the rate and burst of a key without a lease: rate/N,
	// N being the largest count of the last PeakWindow, and this instance's
	// part of the burst, burst/N rounded down plus a token of the remainder
	// for the lowest ranks (see local.Split), so that the instances' parts
	// sum to exactly the burst. A Hybrid limit's part may be 0 (burst below
	// N); a Local limit, or a degraded one, keeps at least 1 token.
	LocalShare local.Share
	// Keys is the number of keys held in memory.
	Keys int
	// LeasedRate is the sum of the rates leased by this instance (Hybrid).
	LeasedRate float64
	// LeasedKeys is the number of keys this instance decides on a lease of
	// a rate (Hybrid); the others of Keys are decided exactly in Redis, or
	// admit the few tokens taken ahead for them (credit).
	LeasedKeys int
	// FailingKeys is the number of keys (Hybrid) whose last request to
	// Redis, a lease ask or an exact decision, failed on its own (for
	// example because the Redis Cluster node that holds it is down) while
	// the limit as a whole is not degraded, as of the lease loop's last
	// tick. Once their leases run out their decisions are denials, which
	// keep the bound while Redis may answer the other instances: only a
	// degraded limit follows OnOutage. They try Redis again a renewal
	// period apart.
	FailingKeys int
	// RedisCommands is the number of Redis commands this instance has sent
	// for the limit since New (for Hybrid limits, one per lease request of a
	// pipeline; for Global limits, one per decision).
	RedisCommands uint64
}

// Status returns a snapshot of the named limit, as configured now.
func (l *Limiter) Status(limit string) (Status, error) {
	ls := l.lookup(limit)
	if ls == nil {
		return Status{}, l.unknown(limit)
	}
	st := Status{
		Limit:      ls.Limit,
		Degraded:   ls.degraded.Load(),
		Instances:  l.members.Count(),
		LocalShare: ls.loc.Default(),
		Keys:       ls.loc.Len(),

		RedisCommands: ls.commands.Load(),
		FailingKeys:   int(ls.failingKeys.Load()),
	}
	if ls.Mode == Hybrid {
		st.Keys = ls.keys.Len()
		for _, k := range ls.keys.AppendStats(nil) {
			if k.Assigned && k.Share.Limit > 0 {
				// A lease of rate 0 is credit, not a lease (see creditTokens).
				st.LeasedRate += float64(k.Share.Limit)
				st.LeasedKeys++
			}
		}
	}
	return st, nil
}

// Instances returns the live instance count N.
func (l *Limiter) Instances() int { return l.members.Count() }

// Close stops deciding (decisions after Close return ErrClosed), stops the
// lease loop and watching membership, releases every lease and exact
// record in pipelines, and then, if Members implements io.Closer, closes it
// (leaving the cluster). Close is idempotent; later calls return the first
// call's error. ctx bounds the release. SetLimits after Close returns
// ErrClosed.
//
// The order is what lets the other instances take this one's share at
// once: when Members is a membership.Roster, an instance that left
// gracefully (membership.View.Left) is dropped from their N-hat
// immediately, where one that failed or is cut off stays counted for
// PeakWindow, since it may still be deciding. So an instance must stop
// deciding and release its records before it leaves. A program that
// closes its membership itself must close the Limiter first; one that
// leaves first lets the others' local quotas (Local limits, FailLocal) grow
// while its own still decides: up to rate/N-hat too much until the Limiter
// is closed. If the release fails (Redis unreachable, ctx ended), the
// records left behind expire within their lease's lifetime; until then
// Redis counts them as running, which only holds the others to less.
func (l *Limiter) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		close(l.quit)
		<-l.done
		l.stopWatch()
		var errs []error
		if err := l.releaseAll(ctx); err != nil {
			errs = append(errs, err)
		}
		if c, ok := l.members.(io.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("hybrid: leaving membership: %w", err))
			}
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// unknown is the error for a limit name l does not have: ErrUnknownLimit,
// with the names it has, so that a misspelling is seen at once.
func (l *Limiter) unknown(limit string) error {
	var names []string
	for _, e := range l.set.Load().order {
		names = append(names, strconv.Quote(e.Name))
	}
	has := "no limits"
	if len(names) > 0 {
		has = "limits " + strings.Join(names, ", ")
	}
	return fmt.Errorf("%w %q (the Limiter has %s)", ErrUnknownLimit, limit, has)
}

// onPeers is called by membership when N changes, if Members is not a
// membership.Roster.
func (l *Limiter) onPeers(n int) {
	now := time.Now()
	l.observe(now, n, nil)
	l.countChanged(now, n)
}

// onView is called by a membership.Roster when N or the members change, or
// members leave gracefully. A member that left gracefully stopped deciding
// and released its records first (Close, then leave), so it no longer
// counts: every sample that counted it is lowered by one, and N-hat drops
// at once. A member that failed, or is cut off by a partition, may still
// be deciding on its leases or local quotas: it stays counted in the samples
// for PeakWindow, as before.
func (l *Limiter) onView(v membership.View) {
	now := time.Now()
	l.peakMu.Lock()
	for _, name := range v.Left {
		for i := range l.samples {
			s := &l.samples[i]
			// Each sample's members are its own (a View's are a copy), so
			// they are changed in place; removing the name makes a later
			// leave of the same name (after it came back) count once here.
			if j, ok := slices.BinarySearch(s.names, name); ok {
				s.names = slices.Delete(s.names, j, j+1)
				s.n = max(s.n-1, 1)
			}
		}
	}
	l.samples = append(l.samples, peerSample{at: now, n: v.Count, names: v.Members})
	l.peakMu.Unlock()
	if len(v.Left) > 0 {
		l.log.Info("hybridlimit: instances left gracefully, no longer counted", "left", v.Left)
	}
	l.countChanged(now, v.Count)
}

// countChanged re-splits the local quotas after the instance count
// changed to n, or N-hat dropped.
func (l *Limiter) countChanged(now time.Time, n int) {
	l.m.peers.Set(float64(n))
	l.resettle.Store(true)
	l.log.Info("hybridlimit: instance count changed", "instances", n)
	l.shareMu.Lock()
	defer l.shareMu.Unlock()
	n, rank := l.place(now)
	for _, ls := range l.set.Load().order {
		ls.loc.SetPlace(now, placeOf(ls, n, rank))
	}
}

// resplit splits the local quota of ls by n, N-hat at now, and this
// instance's rank at now.
func (l *Limiter) resplit(ls *limitEntry, now time.Time, n int) {
	_, rank := l.place(now)
	l.shareMu.Lock()
	defer l.shareMu.Unlock()
	ls.loc.SetPlace(now, placeOf(ls, n, rank))
}

// peak returns the largest instance count seen within PeakWindow of now.
func (l *Limiter) peak(now time.Time) int {
	l.peakMu.Lock()
	defer l.peakMu.Unlock()
	l.prune(now)
	p := 1
	for _, s := range l.samples {
		p = max(p, s.n)
	}
	return p
}

// prune drops the samples that ended before PeakWindow of now. Requires
// peakMu held.
func (l *Limiter) prune(now time.Time) {
	cut := now.Add(-l.cfg.PeakWindow)
	// A sample holds from its time until the next one's: drop those that
	// ended before the window. The latest always holds.
	i := 0
	for i < len(l.samples)-1 && l.samples[i+1].at.Before(cut) {
		i++
	}
	l.samples = l.samples[i:]
}

// redact returns err with every mention of key replaced, for logs: keys
// identify users, and no log line may carry one. A key is mentioned as it
// is or quoted (%q, as package global formats keys in its errors).
func redact(err error, key string) error {
	if err == nil || key == "" {
		return err
	}
	msg := err.Error()
	out := strings.ReplaceAll(strings.ReplaceAll(msg, strconv.Quote(key), "<key>"), key, "<key>")
	if out == msg {
		return err
	}
	return errors.New(out)
}

// cause is why limits degrade, for the log lines: err, explained (see
// explain) when the first line needs it, at most once.
type cause struct {
	err       error
	explained bool
	// later: a decision degraded the limit, and the loop writes the line,
	// so that the decision does not wait for the explanation.
	later bool
}

// why returns c's error, explained.
func (l *Limiter) why(c *cause) error {
	if !c.explained {
		c.err, c.explained = l.explain(c.err), true
	}
	return c.err
}

// setDegraded switches ls between normal and degraded, logging once per
// change; c says why it degrades (nil when it recovers). It acts on the
// limit as configured now: nothing for a limit that SetLimits removed, and
// a Local limit never degrades.
func (l *Limiter) setDegraded(ls *limitEntry, on bool, c *cause) {
	if ls.degraded.Load() == on {
		return
	}
	now := time.Now()
	l.shareMu.Lock()
	cur := l.set.Load().byName[ls.Name]
	if cur == nil || cur.limitState != ls.limitState || (on && cur.Mode == Local) || cur.degraded.Load() == on {
		l.shareMu.Unlock()
		return
	}
	cur.degraded.Store(on)
	cur.m.degraded.Set(float64(b2i(on)))
	n, rank := l.place(now)
	cur.loc.SetPlace(now, placeOf(cur, n, rank))
	l.shareMu.Unlock()
	switch {
	case on && c.later:
		err := c.err
		cur.unlogged.Store(&err)
	case on:
		l.logDegraded(cur, l.why(c))
	default:
		l.logUnlogged(cur)
		l.log.Info("hybridlimit: Redis reachable again, limit back to normal", "limit", cur.Name)
	}
}

// logDegraded writes the line of ls degrading because of err.
func (l *Limiter) logDegraded(ls *limitEntry, err error) {
	l.log.Warn("hybridlimit: Redis unreachable, limit degraded to its outage policy",
		"limit", ls.Name, "policy", ls.OnOutage.String(), "error", err)
}

// logUnlogged writes the line of a degrade of ls that a decision made, if
// it has not been written. Only the loop calls it: explaining the cause may
// take a round trip.
func (l *Limiter) logUnlogged(ls *limitEntry) {
	if err := ls.unlogged.Swap(nil); err != nil {
		l.logDegraded(ls, l.explain(*err))
	}
}
