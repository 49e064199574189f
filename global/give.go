package global

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed give.lua
	giveLua    string
	giveScript = redis.NewScript(placementLua + "\n" + giveLua)
)

// GivePool puts back into the pool of (limit, key) the n tokens that a
// TakePool which ran at takenAt (Take.At) took for a request that did not
// go ahead: n less what the pool could have refilled since (rate per
// second), up to the pool's burst (its fraction of burst, as TakePool
// computes it). Had the request never come, the pool would have been full
// sooner and lost that refill: the give leaves the pool at most where it
// would be, so that what the cluster admits, less the requests given back,
// stays within the limit. A pool that does not exist is full and takes
// nothing back. It changes no instance's record, and returns the whole
// tokens the pool holds after it.
//
// rate must be positive and finite, burst at least 1 and n at least 0;
// otherwise GivePool returns an error wrapping ErrInvalid without calling
// Redis.
func (s *Store) GivePool(ctx context.Context, limit, key string, rate float64, burst, n int, takenAt time.Time) (int64, error) {
	switch {
	case !finite(rate) || rate <= 0:
		return 0, fmt.Errorf("global: give %q: %w: rate %v is not a positive finite number", key, ErrInvalid, rate)
	case burst < 1:
		return 0, fmt.Errorf("global: give %q: %w: burst %d is less than 1", key, ErrInvalid, burst)
	case n < 0:
		return 0, fmt.Errorf("global: give %q: %w: n %d is negative", key, ErrInvalid, n)
	}
	v, err := giveScript.Run(ctx, s.rdb, []string{s.RecordKey(limit, key)}, formatFloat(rate), strconv.Itoa(burst), strconv.Itoa(n), strconv.FormatInt(takenAt.UnixMicro(), 10)).Text()
	if err != nil {
		return 0, fmt.Errorf("global: give %q: %w", key, err)
	}
	tokens, err := strconv.ParseFloat(v, 64)
	if err != nil || !finite(tokens) || tokens < 0 {
		return 0, fmt.Errorf("global: give %q: %w: %q", key, ErrReply, v)
	}
	return int64(tokens), nil
}

// GiveN puts back into the token bucket of (limit, key) the n tokens that a
// TakeN which ran at takenAt (Take.At) took for a request that did not go
// ahead, after refilling it on Redis server time: n less what the bucket
// could have refilled since, up to burst, as GivePool. A bucket that does
// not exist is full and takes nothing back. It returns the whole tokens
// the bucket holds after it.
//
// ratePerSecond must be positive and finite, burst and n non-negative;
// otherwise GiveN returns an error wrapping ErrInvalid without calling
// Redis.
func (s *Store) GiveN(ctx context.Context, limit, key string, ratePerSecond float64, burst, n int, takenAt time.Time) (int64, error) {
	if n < 0 {
		return 0, fmt.Errorf("global: give %q: %w: n %d is negative", key, ErrInvalid, n)
	}
	// tokenbucket.lua takes a negative n as a give.
	t, err := s.takeN(ctx, "give", limit, key, ratePerSecond, burst, -n, strconv.FormatInt(takenAt.UnixMicro(), 10))
	return t.Remaining, err
}
