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
