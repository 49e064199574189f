package local

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// TestBucketAgainstRate runs random decisions and changes of rate and burst
// on a bucket and on an x/time/rate Limiter side by side, at the same
// instants, and requires the same admissions and the same tokens, to the
// bit, after every step. The rates run from none to a billion tokens per
// second, so that deficits of less than a nanosecond's worth (which
// rate.Limiter admits) come up; the instants mostly move forward, by
// nothing at times, and sometimes go back.
func TestBucketAgainstRate(t *testing.T) {
	limits := []rate.Limit{0, 1e-3, 0.5, 1, 3, 10, 333.3, 1e4, 1e9, rate.Inf}
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			pick := func() rate.Limit { return limits[rng.IntN(len(limits))] }
			s := Share{Limit: pick(), Burst: rng.IntN(20)}
			now := time.Duration(rng.Int64N(int64(time.Hour))) - 30*time.Minute
			b := newBucket(s, now)
			lim := rate.NewLimiter(s.Limit, s.Burst)
			for step := range 5000 {
				switch r := rng.IntN(10); {
				case r == 0:
					now -= time.Duration(rng.Int64N(int64(time.Second)))
				case r < 3:
					// the same instant again
				case r < 6:
					now += time.Duration(rng.Int64N(1000))
				default:
					now += time.Duration(rng.Int64N(int64(2 * time.Second)))
				}
				at := t0.Add(now)
				var what string
				switch r := rng.IntN(20); {
				case r == 0:
					l := pick()
					what = fmt.Sprint("setLimit ", l)
					b.setLimit(now, l)
					lim.SetLimitAt(at, l)
				case r == 1:
					n := rng.IntN(20)
					what = fmt.Sprint("setBurst ", n)
					b.setBurst(now, n)
					lim.SetBurstAt(at, n)
				default:
					n := 1 + rng.IntN(3)
					what = fmt.Sprint("allowN ", n)
					ok, left := b.allowN(now, n)
					wantOK := lim.AllowN(at, n)
					wantLeft := lim.TokensAt(at)
					if ok != wantOK || !same(left, wantLeft) {
						t.Fatalf("step %d at %v, %s (limit %v, burst %d): got %v with %v tokens left, rate.Limiter %v with %v",
							step, now, what, lim.Limit(), lim.Burst(), ok, left, wantOK, wantLeft)
					}
				}
				if got, want := b.advance(now), lim.TokensAt(at); !same(got, want) {
					t.Fatalf("step %d at %v, after %s (limit %v, burst %d): %v tokens, rate.Limiter %v",
						step, now, what, lim.Limit(), lim.Burst(), got, want)
				}
				if b.limit != lim.Limit() || b.burst != lim.Burst() {
					t.Fatalf("step %d, after %s: limit %v burst %d, rate.Limiter %v %d", step, what, b.limit, b.burst, lim.Limit(), lim.Burst())
				}
			}
		})
	}
}

// same reports whether a and b are the same number, NaN included (an
// infinite rate over no time makes one in rate.Limiter as well).
func same(a, b float64) bool {
	return a == b || math.IsNaN(a) && math.IsNaN(b)
}
