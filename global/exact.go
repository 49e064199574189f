package global

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// ExactRequest asks for N tokens of a key's pool, the part of the rate and
// burst that no lease and no default share holds, for one instance that
// decides the key exactly: every request in Redis.
//
// The instance becomes an exact user of the key: a record "x:<Instance>" in
// the key's lease hash, which lives until TTL after its latest take, and
// counts it as having given its default share, Rate/Instances, to the pool.
// If it drops a lease below that share, the record also lives until the
// leases granted to others meanwhile have ended, so that a release of the
// record lets it run its default share at once.
// Its lease, if it had one, is dropped: it must stop running that lease
// before it asks. Store.Release, or a Lease with Want 0, ends the record.
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
	}
	return nil
}

// TakeExact takes r.N tokens from the pool of (r.Limit, r.Key) if they are
// all there, in one script call on Redis server time, and records r.Instance
// as an exact user of the key (see ExactRequest). A denial takes nothing.
//
// The pool's rate is Rate minus what the leases of the other instances may
// be running, minus Rate/Instances for each instance without a record
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
// full with ExactBursts. The result reports both (Take.PoolRate,
// Take.PoolBurst); RetryAfter is Never when r.N exceeds the pool's burst or
// its rate is 0, so a caller may ask again once the leases have shrunk.
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
	f, err := replyStrings(v, 5)
	if err != nil {
		return Take{}, err
	}
	t, err := parseTake([]any{f[0], f[1], f[2]})
	if err != nil {
		return Take{}, err
	}
	rate, err1 := strconv.ParseFloat(f[3], 64)
	burst, err2 := strconv.ParseFloat(f[4], 64)
	if err1 != nil || err2 != nil || !finite(rate) || !finite(burst) {
		return Take{}, fmt.Errorf("%w: %q", ErrReply, f)
	}
	t.PoolRate, t.PoolBurst = rate, burst
	return t, nil
}
