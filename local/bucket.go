package local

import (
	"math"
	"time"

	"golang.org/x/time/rate"
)

// A bucket is one key's token bucket. Its arithmetic is x/time/rate's
// Limiter's, step for step, so that a key decides exactly as a rate.Limiter
// fed the same times would (TestBucketAgainstRate holds it to that); what
// it leaves out is what a key does not need: its own mutex (the shard's
// guards it), the time of the last event (which only a Reservation's
// Cancel reads), and times as time.Time. Its times are offsets from the
// shard's base, like the entry's, so it takes 32 bytes where a
// rate.Limiter takes 80, and a decision takes no lock of its own and does
// no time.Time arithmetic. The zero value admits nothing.
type bucket struct {
	limit  rate.Limit
	burst  int
	tokens float64
	last   time.Duration // when tokens was last updated
}

// newBucket returns a full bucket of share s at offset now.
func newBucket(s Share, now time.Duration) bucket {
	return bucket{limit: s.Limit, burst: s.Burst, tokens: float64(s.Burst), last: now}
}

// advance returns the tokens b holds at offset now, without changing b:
// rate.Limiter's advance.
func (b *bucket) advance(now time.Duration) float64 {
	last := b.last
	if now < last {
		last = now
	}
	// rate.Limit's tokensFromDuration, written out.
	var delta float64
	if b.limit > 0 {
		delta = (now - last).Seconds() * float64(b.limit)
	}
	tokens := b.tokens + delta
	if burst := float64(b.burst); tokens > burst {
		tokens = burst
	}
	return tokens
}

// allowN takes n tokens at offset now if they are there, as
// rate.Limiter.AllowN does, and reports whether it did and the tokens left
// at now (rate.Limiter.TokensAt right after).
func (b *bucket) allowN(now time.Duration, n int) (ok bool, left float64) {
	if b.limit == rate.Inf {
		// rate.Limiter admits without touching its state.
		return true, b.advance(now)
	}
	tokens := b.advance(now)
	after := tokens - float64(n)
	// rate.Limiter admits when the wait for the missing tokens rounds down
	// to 0: a deficit of less than a nanosecond's worth counts as none.
	var wait time.Duration
	if after < 0 {
		wait = durationFromTokens(b.limit, -after)
	}
	if n > b.burst || wait > 0 {
		return false, tokens
	}
	b.last, b.tokens = now, after
	return true, after
}

// durationFromTokens is rate.Limit's durationFromTokens: how long limit
// takes to make tokens.
func durationFromTokens(limit rate.Limit, tokens float64) time.Duration {
	if limit <= 0 {
		return rate.InfDuration
	}
	d := tokens / float64(limit) * float64(time.Second)
	if d > float64(math.MaxInt64) {
		return rate.InfDuration
	}
	return time.Duration(d)
}

// setLimit changes the rate at offset now, keeping the tokens held then:
// rate.Limiter.SetLimitAt.
func (b *bucket) setLimit(now time.Duration, limit rate.Limit) {
	b.tokens, b.last = b.advance(now), now
	b.limit = limit
}

// setBurst changes the burst at offset now, keeping the tokens held then:
// rate.Limiter.SetBurstAt.
func (b *bucket) setBurst(now time.Duration, burst int) {
	b.tokens, b.last = b.advance(now), now
	b.burst = burst
}
