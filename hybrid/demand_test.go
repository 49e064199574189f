package hybrid

import (
	"math"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
)

// TestDemandWindowCounterWraps: the window keeps the low 32 bits of a key's
// Attempted counter; the rate it measures is the same where the counter
// crosses a multiple of 2^32 between samples as anywhere else.
func TestDemandWindowCounterWraps(t *testing.T) {
	var ep epoch
	in := func(d time.Duration) instant { return ep.instant(t0.Add(d)) }
	for _, base := range []int64{0, math.MaxUint32 - 25, 3*math.MaxUint32 + 7} {
		var w demandWindow
		w.restart(in(0), base)
		// 100/s: 10 tokens every 100 ms, sampled at each.
		for k := int64(1); k <= 3; k++ {
			w.record(in(time.Duration(k)*100*time.Millisecond), base+10*k)
		}
		st := local.KeyStats{Attempted: base + 40}
		if got := w.rate(in(400*time.Millisecond), &st, 25); math.Abs(got-100) > 1e-9 {
			t.Errorf("Attempted from %d: rate %v, want 100", base, got)
		}
	}
}

// TestSurelyBelowAndAbove: a count is below or above a rate only beyond
// two standard deviations of a Poisson count at that rate, so that sparse
// keys need seconds to show either, and a request or two never does.
func TestSurelyBelowAndAbove(t *testing.T) {
	for _, c := range []struct {
		tokens       int64
		span         time.Duration
		perSec       float64
		below, above bool
	}{
		// 1/s over 2.4 s: mean 2.4, two deviations 3.1 — nothing is
		// surely below it, and 6 tokens are surely above.
		{0, 2400 * time.Millisecond, 1, false, false},
		{5, 2400 * time.Millisecond, 1, false, false},
		{6, 2400 * time.Millisecond, 1, false, true},
		// 11.4/s over 2.7 s: mean 30.8, deviation 5.5.
		{19, 2700 * time.Millisecond, 11.4, true, false},
		{20, 2700 * time.Millisecond, 11.4, false, false},
		{41, 2700 * time.Millisecond, 11.4, false, false},
		{42, 2700 * time.Millisecond, 11.4, false, true},
		// No time, no evidence.
		{0, 0, 8, false, false},
	} {
		if got := surelyBelow(c.tokens, c.span, c.perSec); got != c.below {
			t.Errorf("surelyBelow(%d, %v, %v) = %v, want %v", c.tokens, c.span, c.perSec, got, c.below)
		}
		if got := surelyAbove(c.tokens, c.span, c.perSec); got != c.above {
			t.Errorf("surelyAbove(%d, %v, %v) = %v, want %v", c.tokens, c.span, c.perSec, got, c.above)
		}
	}
}

// TestExactHeavyNeedsDecisions: an exact key leaves for a lease only on a
// demand above exactLeaseAbove default shares shown beyond chance and on
// fallTokens decisions or more: a few requests close together on a light
// key pass surelyAbove's two deviations, but say nothing of its rate.
func TestExactHeavyNeedsDecisions(t *testing.T) {
	e := &engine{rate: eRate, burst: eBurst}
	for _, c := range []struct {
		tokens int64
		span   time.Duration
		heavy  bool
	}{
		// Against 4 shares of 25/s, 100/s: two or three requests within a
		// few milliseconds pass surelyAbove but are too few.
		{2, 5 * time.Millisecond, false},
		{3, 10 * time.Millisecond, false},
		{7, 20 * time.Millisecond, false},
		{8, 20 * time.Millisecond, true},
		// Eight over a second: 8/s, no more than chance at 100/s.
		{8, time.Second, false},
		{130, time.Second, true},
	} {
		d := float64(c.tokens) / c.span.Seconds()
		if !surelyAbove(c.tokens, c.span, eDef*exactLeaseAbove) && c.heavy {
			t.Fatalf("case %+v: not surely above; the table is wrong", c)
		}
		if got := e.exactHeavy(d, eDef, c.tokens, c.span); got != c.heavy {
			t.Errorf("exactHeavy(%v/s, %d tokens over %v) = %v, want %v", d, c.tokens, c.span, got, c.heavy)
		}
	}
}
