package hybrid_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
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
				if want := local.Split(rate, burst, 2, local.NoRank); st.LocalShare != want {
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

// TestOutageLogNamesTheCause: the log line of a degrade names why Redis is
// unreachable, connection refused, where the call that found it only saw
// its deadline end (go-redis retries a refused dial in the background and
// returns the caller's context error). At New, with nothing listening, and
// in the loop, after Redis was killed.
func TestOutageLogNamesTheCause(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	limits := []hybrid.Limit{{Name: "h", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailOpen}}
	check := func(t *testing.T, logs *records) {
		t.Helper()
		got := logs.logged("degraded")
		if len(got) != 1 || !strings.Contains(got[0]["error"], "connection refused") {
			t.Errorf("degrade logged as %v; want one line whose error says connection refused", got)
		}
		t.Logf("logged %v", got)
	}

	t.Run("nothing listening at New", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		var logs records
		newLimiter(t, hybrid.Config{Redis: fastClientTo(t, addr), Logger: slog.New(&logs), Limits: limits})
		check(t, &logs)
	})

	t.Run("Redis killed", func(t *testing.T) {
		srv := redistest.Start(t)
		// A pool larger than the failed dials of the test, so that go-redis
		// never starts failing calls at once with its last dial error.
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: 200 * time.Millisecond,
			ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1, PoolSize: 1000})
		t.Cleanup(func() { _ = rdb.Close() })
		var logs records
		l := newLimiter(t, hybrid.Config{Redis: rdb, Logger: slog.New(&logs), Limits: limits, UncontendedTTL: time.Second})
		ctx := context.Background()
		// warmKey makes the key worth a lease: its first decisions are
		// exact, and the next tick asks for one.
		eventually(t, 5*time.Second, "a lease", func() bool {
			return warmKey(t, l, "h", "k", 10).Source == hybrid.SourceLease
		})
		srv.Kill(t)
		eventually(t, 5*time.Second, "the degrade logged", func() bool {
			if _, err := l.Allow(ctx, "h", "k"); err != nil {
				t.Fatal(err)
			}
			return len(logs.logged("degraded")) > 0
		})
		check(t, &logs)
	})
}
