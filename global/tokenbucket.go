package global

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Never is the RetryAfter of a denial that no amount of waiting can turn
// into an admission: math.MaxInt64, about 292 years.
const Never = time.Duration(math.MaxInt64)

// Take is the outcome of TakeN or TakePool. A denial is a value, not an
// error.
type Take struct {
	// Allowed reports whether the n tokens were taken.
	Allowed bool
	// Remaining is the number of whole tokens left in the bucket (for
	// TakePool, the pool) after the call.
	Remaining int64
	// RetryAfter is 0 when Allowed; otherwise the time until n tokens will be
	// in the bucket if nobody else takes any (for TakePool, in the pool, at
	// the rate the leases leave it from their next renewals). It is Never
	// when n tokens can never be there: n exceeds the burst (for TakePool,
	// the pool's burst as it is now, or the pool's rate is 0).
	RetryAfter time.Duration
	// PoolRate and PoolBurst are, for TakePool, the rate in tokens per
	// second and the capacity in tokens of the key's pool as this call
	// computed them; zero for TakeN.
	PoolRate, PoolBurst float64
	// Turn is, for a denial by TakePool, and for an admission that left
	// the pool less than one token, how long until this caller's turn to
	// take again (see TakePool), at least RetryAfter; zero otherwise, and
	// always for TakeN.
	Turn time.Duration
	// Credit is, for an admission by TakePool, the tokens taken beyond N
	// ahead of the caller's next requests (PoolTake.Extra); zero
	// otherwise, and always for TakeN. Redis counts them out of the pool
	// for PoolTake.CreditTTL from At, or until a take names CreditID.
	Credit int
	// CreditID names the Credit, if any: At in microseconds modulo 2^32,
	// for PoolTake.CreditID. It is 0 without a credit.
	CreditID uint32
	// At is the Redis server time the call ran at: what GiveN and
	// GivePool are told, to give back what a request took.
	At time.Time
}

// TakeN runs the classic atomic token bucket of (limit, key) in Redis: it
// refills the bucket at ratePerSecond tokens per second up to burst, on Redis
// server time, and takes n tokens if they are all there, in one step. A denial
// takes nothing. A bucket that does not exist is full, and the bucket's key
// expires when it would be full again, so idle keys disappear.
//
// ratePerSecond must be positive and finite, burst and n non-negative;
// otherwise TakeN returns an error wrapping ErrInvalid without calling Redis.
// Any other error means Redis could not decide; the Take is then zero.
func (s *Store) TakeN(ctx context.Context, limit, key string, ratePerSecond float64, burst, n int) (Take, error) {
	if n < 0 {
		return Take{}, fmt.Errorf("global: take %q: %w: n %d is negative", key, ErrInvalid, n)
	}
	return s.takeN(ctx, "take", limit, key, ratePerSecond, burst, n, "0")
}

// takeN runs tokenbucket.lua for TakeN (n >= 0) and GiveN (n < 0: a give of
// -n of the tokens taken at sinceUS), what naming the call in its errors.
func (s *Store) takeN(ctx context.Context, what, limit, key string, ratePerSecond float64, burst, n int, sinceUS string) (Take, error) {
	switch {
	case !finite(ratePerSecond) || ratePerSecond <= 0:
		return Take{}, fmt.Errorf("global: %s %q: %w: ratePerSecond %v is not a positive finite number", what, key, ErrInvalid, ratePerSecond)
	case burst < 0:
		return Take{}, fmt.Errorf("global: %s %q: %w: burst %d is negative", what, key, ErrInvalid, burst)
	}
	keys := []string{s.BucketKey(limit, key)}
	args := []any{formatFloat(ratePerSecond), strconv.Itoa(burst), strconv.Itoa(n), sinceUS}
	cmd := tokenBucketScript.EvalSha(ctx, s.rdb, keys, args...)
	if isNoScript(cmd.Err()) {
		cmd = tokenBucketScript.Eval(ctx, s.rdb, keys, args...)
	}
	v, err := cmd.Result()
	if err != nil {
		return Take{}, fmt.Errorf("global: %s %q: %w", what, key, err)
	}
	t, err := parseTake(v)
	if err != nil {
		return Take{}, fmt.Errorf("global: %s %q: %w", what, key, err)
	}
	return t, nil
}

// parseTake reads the reply of tokenbucket.lua.
func parseTake(v any) (Take, error) {
	f, err := replyStrings(v, 4)
	if err != nil {
		return Take{}, err
	}
	return parseTakeFields(f[0], f[1], f[2], f[3])
}

// parseTakeFields reads the fields of a take's reply that tokenbucket.lua
// and take.lua share: allowed, tokens left, retry_us and now_us.
func parseTakeFields(allowed, left, retry, now string) (Take, error) {
	tokens, err1 := strconv.ParseFloat(left, 64)
	retryUS, err2 := strconv.ParseInt(retry, 10, 64)
	nowUS, err3 := strconv.ParseInt(now, 10, 64)
	if (allowed != "0" && allowed != "1") || err1 != nil || err2 != nil || err3 != nil {
		return Take{}, fmt.Errorf("%w: %q", ErrReply, []string{allowed, left, retry, now})
	}
	t := Take{Allowed: allowed == "1", Remaining: int64(math.Floor(tokens)), At: time.UnixMicro(nowUS)}
	switch {
	case t.Allowed:
	case retryUS < 0:
		t.RetryAfter = Never
	default:
		t.RetryAfter = time.Duration(retryUS) * time.Microsecond
	}
	return t, nil
}
