package global

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"
)

// ExactRequest asks for N tokens of a key's pool, the part of the rate and
// burst that no lease and no default share holds, for one instance that
// decides the key exactly: every request in Redis.
//
// The instance becomes an exact user of the key: a record "x:<Instance>" in
// the key's lease hash, which lives until TTL after its latest take, and
// counts it as having given its default share, Rate/Instances, to the pool
// (with ExactBursts, the demand its takes measure; see
// LeaseRequest.ExactBursts).
// If it drops a lease below that share, or takes the record while waiting
// out the release of such a lease (see Lease.Expires), the record keeps
// when the leases granted to others meanwhile end: a release of the record
// lets it run its default share only then, and at once otherwise.
// Its lease, if it had one, is dropped: it must stop running that lease
// before it asks; unless KeepLease is set, for an instance on its way from
// exact decisions to a lease. Store.Release, or a Lease with Want 0, ends
// the record; a Lease request turns it into a lease record in the same
// step.
type ExactRequest struct {
	// Limit and Key name the lease hash, see Store.LeaseKey.
	Limit, Key string
	// Instance is the id of the asking instance, as in LeaseRequest. It must
	// not be empty.
	Instance string
	// Rate is the limit's global rate in tokens per second, at least 0.
	Rate float64
	// Burst is the limit's global burst in tokens, at least 0.
	Burst int
	// Instances is N-hat, the largest instance count seen lately, at least
	// 1. The instances beyond those with a lease or an exact record (this
	// one included) are counted at their default share, Rate/Instances,
	// unless ExactBursts is set.
	Instances int
	// N is the number of tokens to take, at least 0. 0 takes nothing and
	// is always allowed: it reports the pool and joins it.
	N int
	// TTL is how long the instance's exact record lives after this take, at
	// least one microsecond. Zero is invalid.
	TTL time.Duration
	// Give is the number of tokens, at least 0, this instance hands the pool
	// from its local bucket when it joins, that is on the take that creates
	// its record; the pool holds at most its burst. It is ignored on later
	// takes.
	Give float64
	// ExactBursts is set for limits whose burst must be honoured wherever it
	// lands: no instance runs a default share on a key without asking Redis
	// first, so instances without a record are counted at 0, and a pool
	// that does not exist yet is full. Zero (split bursts) counts them at
	// their default share and starts a pool at Give.
	ExactBursts bool
	// KeepLease is set while the instance may hold a lease of the key that
	// it does not run yet: it keeps deciding exactly until the grant of a
	// lease it asked for is in force (make before break), or this take was
	// sent before that lease request and reaches Redis after it. A live
	// lease record of the instance is then kept and counted at what it may
	// run, as the others' are, the pool being what all the leases leave,
	// and no exact record is written while the lease lives: a take that
	// lands after the lease request cannot undo it. Once the lease has
	// ended, or if there is none, the take records an exact user as usual.
	// Zero drops the instance's lease record: the instance stopped running
	// it before asking.
	KeepLease bool
	// Credit is the most tokens, at least 0, to hand the instance beyond N
	// when the take is allowed: credit it may admit locally, without a
	// Redis call, until CreditTTL after the take, and never after. It is
	// handed only from a pool that stays at least half full (a key near its
	// limit gets none), and the pool holds at most its burst less the live
	// credits of all instances, so credit admits no more than the pool
	// would. Zero asks for none.
	Credit int
	// Return is the number of tokens, at least 0, of its credit that the
	// instance gives back to the pool: it stopped admitting them before it
	// asked. Credit that has ended in Redis is not given back.
	Return int
	// CreditTTL is how long a credit handed by this take lasts in Redis. It
	// must be at least one microsecond when Credit is above 0; the instance
	// must stop admitting it earlier, as its clock may run slow.
	CreditTTL time.Duration
	// Held is the demand, in tokens, of the requests the instance denied
	// without asking since its last take, because an earlier answer told
	// it to wait (a deny cache): each request's tokens decayed over
	// DemandTau from when it was asked to when this take is sent, see
	// DecayHeld. With ExactBursts the take records it in the instance's
	// demand as if each of those requests had been a take, so that a
	// caller waiting its turn shows what it wants. At least 0 and at most
	// MaxHeld; zero adds nothing.
	Held float64
}

// MaxHeld is the most ExactRequest.Held may be: far above any demand a
// deny cache holds, far below what would overflow the demand Redis
// records.
const MaxHeld = 1e12

// DemandTau is the time constant over which Redis forgets an exact user's
// past takes when it measures the user's demand (exact.lua's demand_tau):
// a take of n tokens counts n·e^(-age/DemandTau) tokens per second, age
// after it.
const DemandTau = time.Second

// DecayHeld returns held, the demand of requests denied without asking
// (ExactRequest.Held), decayed over age, plus n tokens asked for now: what
// Redis would have recorded of them had each been a take.
func DecayHeld(held float64, age time.Duration, n int) float64 {
	if age > 0 {
		held *= math.Exp(-float64(age) / float64(DemandTau))
	}
	return held + float64(n)
}

// validate checks r fully, so that no request Lua would reject reaches Redis.
func (r *ExactRequest) validate() error {
	switch {
	case r.Instance == "":
		return fmt.Errorf("%w: empty instance", ErrInvalid)
	case !finite(r.Rate) || r.Rate < 0:
		return fmt.Errorf("%w: rate %v is not a non-negative finite number", ErrInvalid, r.Rate)
	case r.Burst < 0:
		return fmt.Errorf("%w: burst %d is negative", ErrInvalid, r.Burst)
	case r.Instances < 1:
		return fmt.Errorf("%w: instances %d is less than 1", ErrInvalid, r.Instances)
	case r.N < 0:
		return fmt.Errorf("%w: n %d is negative", ErrInvalid, r.N)
	case r.TTL < time.Microsecond:
		return fmt.Errorf("%w: ttl %v is less than 1µs", ErrInvalid, r.TTL)
	case !finite(r.Give) || r.Give < 0:
		return fmt.Errorf("%w: give %v is not a non-negative finite number", ErrInvalid, r.Give)
	case r.Credit < 0:
		return fmt.Errorf("%w: credit %d is negative", ErrInvalid, r.Credit)
	case r.Return < 0:
		return fmt.Errorf("%w: return %d is negative", ErrInvalid, r.Return)
	case r.CreditTTL < 0 || (r.Credit > 0 && r.CreditTTL < time.Microsecond):
		return fmt.Errorf("%w: credit ttl %v is less than 1µs", ErrInvalid, r.CreditTTL)
	case !finite(r.Held) || r.Held < 0 || r.Held > MaxHeld:
		return fmt.Errorf("%w: held %v is not a number from 0 to %g", ErrInvalid, r.Held, float64(MaxHeld))
	}
	return nil
}

// TakeExact takes r.N tokens from the pool of (r.Limit, r.Key) if they are
// all there, in one script call on Redis server time, and records r.Instance
// as an exact user of the key (see ExactRequest). A denial takes nothing.
//
// The pool's rate is Rate minus what the leases of the other instances
// (and a lease of its own that KeepLease keeps) may be running, minus Rate/Instances for each instance without a record
// (none with ExactBursts), and never less than 0; while Redis is known to
// have lost leases (see LeaseRequest.Held), at most Rate/Instances for each
// exact user. Its burst is Burst in the same proportion to Rate, less the
// tokens of Burst's remainder that the instances without a record may hold
// by their ranks beyond Burst/Instances each (the default shares hand
// Burst mod Instances out one token per rank, see local.Split; Redis does
// not know the ranks and counts the most they may hold), so that the
// pool, the leases and the default shares never hold more than Burst
// between them. It refills
// at its rate up to its burst; a missing pool starts with r.Give tokens, or
// full with ExactBursts; it holds at most its burst less the live credits
// of all instances (see ExactRequest.Credit). A take records the demand of
// its N tokens and of ExactRequest.Held. The result reports both (Take.PoolRate,
// Take.PoolBurst); RetryAfter is Never when r.N exceeds the pool's burst or
// its rate is 0, so a caller may ask again once the leases have shrunk.
//
// Callers the pool cannot serve again at once are given turns: a denial's
// RetryAfter, and an admission's Turn when it left the pool less than one
// token, is one take's refill (r.N tokens at the pool's rate)
// after the turn handed out before it, from when the tokens would first be
// there, at most r.Instances-1 refills later and fewer than the pool's
// burst holds. A caller that waits for its turn before asking again (as
// the hybrid package does) leaves the next tokens to the one whose turn it
// is, so that a key whose requests land on every instance costs about one
// call per admission rather than one per instance at each refill. Turns
// are hints only: tokens go to whoever asks first.
//
// An invalid request returns an error wrapping ErrInvalid without calling
// Redis. Any other error means Redis could not decide; the Take is then
// zero.
func (s *Store) TakeExact(ctx context.Context, r ExactRequest) (Take, error) {
	if err := r.validate(); err != nil {
		return Take{}, fmt.Errorf("global: exact %q: %w", r.Key, err)
	}
	keys := []string{s.LeaseKey(r.Limit, r.Key)}
	args := []any{
		r.Instance,
		formatFloat(r.Rate),
		strconv.Itoa(r.Burst),
		strconv.Itoa(r.Instances),
		strconv.FormatInt(int64(r.TTL/time.Microsecond), 10),
		strconv.Itoa(r.N),
		formatFloat(r.Give),
		flag(r.ExactBursts),
		flag(r.KeepLease),
		strconv.Itoa(r.Credit),
		strconv.Itoa(r.Return),
		strconv.FormatInt(int64(r.CreditTTL/time.Microsecond), 10),
		formatFloat(r.Held),
	}
	cmd := exactScript.EvalSha(ctx, s.rdb, keys, args...)
	if isNoScript(cmd.Err()) {
		cmd = exactScript.Eval(ctx, s.rdb, keys, args...)
	}
	v, err := cmd.Result()
	if err != nil {
		return Take{}, fmt.Errorf("global: exact %q: %w", r.Key, err)
	}
	t, err := parseExact(v)
	if err != nil {
		return Take{}, fmt.Errorf("global: exact %q: %w", r.Key, err)
	}
	return t, nil
}

// parseExact reads the reply of exact.lua.
func parseExact(v any) (Take, error) {
	f, err := replyStrings(v, 7)
	if err != nil {
		return Take{}, err
	}
	t, err := parseTake([]any{f[0], f[1], f[2]})
	if err != nil {
		return Take{}, err
	}
	rate, err1 := strconv.ParseFloat(f[3], 64)
	burst, err2 := strconv.ParseFloat(f[4], 64)
	credit, err3 := strconv.Atoi(f[5])
	turn, err4 := strconv.ParseInt(f[6], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || !finite(rate) || !finite(burst) ||
		credit < 0 || turn < 0 || (turn > 0 && !t.Allowed) {
		return Take{}, fmt.Errorf("%w: %q", ErrReply, f)
	}
	t.PoolRate, t.PoolBurst, t.Credit, t.Turn = rate, burst, credit, time.Duration(turn)*time.Microsecond
	return t, nil
}
