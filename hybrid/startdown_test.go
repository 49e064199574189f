package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/membership"
)

// TestDegradedFromNew is invariant 5 at start: with Redis down when New
// runs, every limit that uses Redis is degraded from the start and its
// first decisions follow its policy (a FailClosed limit admits nothing),
// and once Redis is up the limits recover without any decision to tell
// them: a Global limit through its probe, a Hybrid-only configuration too.
func TestDegradedFromNew(t *testing.T) {
	const rate, burst = 100, 10
	ctx := context.Background()
	for _, tc := range []struct {
		policy  hybrid.Policy
		allowed bool
		source  hybrid.Source
	}{
		{hybrid.FailLocal, true, hybrid.SourceLocal},
		{hybrid.FailOpen, true, hybrid.SourceFailOpen},
		{hybrid.FailClosed, false, hybrid.SourceFailClosed},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			srv := redistest.Start(t)
			srv.Kill(t)
			limits := []hybrid.Limit{
				{Name: "h", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: tc.policy},
				{Name: "g", Rate: rate, Burst: burst, Mode: hybrid.Global, OnOutage: tc.policy},
				{Name: "l", Rate: rate, Burst: burst, Mode: hybrid.Local, OnOutage: tc.policy},
			}
			l := newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Members: membership.NewStatic("me", 2),
				Limits: limits, UncontendedTTL: time.Second})
			for _, name := range []string{"h", "g"} {
				st := mustStatus(t, l, name)
				if !st.Degraded {
					t.Errorf("%s: not degraded right after New with Redis down", name)
				}
				if want := local.Split(rate, burst, 2); st.LocalShare != want {
					t.Errorf("%s: local share %+v, want rate/N %+v", name, st.LocalShare, want)
				}
				for i := range 3 {
					d, err := l.Allow(ctx, name, "new-key")
					if err != nil || d.Allowed != tc.allowed || d.Source != tc.source {
						t.Errorf("%s: decision %d right after New: %+v, %v; want allowed %v from %v", name, i, d, err, tc.allowed, tc.source)
					}
				}
			}
			if mustStatus(t, l, "l").Degraded {
				t.Error("the Local limit is degraded")
			}

			srv.Restart(t)
			eventually(t, 5*time.Second, "both limits back to normal", func() bool {
				return !mustStatus(t, l, "h").Degraded && !mustStatus(t, l, "g").Degraded
			})
			eventually(t, 5*time.Second, "a lease for h, the bucket for g", func() bool {
				dh, errh := l.Allow(ctx, "h", "new-key")
				dg, errg := l.Allow(ctx, "g", "new-key")
				return errh == nil && errg == nil && dh.Source == hybrid.SourceLease && dg.Source == hybrid.SourceGlobal
			})
		})
	}

	// Recovery comes from lease renewals, or for Global limits from a
	// probe; a Hybrid limit without keys has neither, and must be probed
	// too.
	t.Run("Hybrid only, no decisions", func(t *testing.T) {
		srv := redistest.Start(t)
		srv.Kill(t)
		l := newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Members: membership.NewStatic("me", 1),
			Limits: []hybrid.Limit{{Name: "h", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed}}})
		if !mustStatus(t, l, "h").Degraded {
			t.Fatal("not degraded right after New with Redis down")
		}
		srv.Restart(t)
		eventually(t, 5*time.Second, "back to normal with no decision", func() bool { return !mustStatus(t, l, "h").Degraded })
	})
}
