package hybrid_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

func TestNewRejectsBadConfig(t *testing.T) {
	ok := hybrid.Limit{Name: "api", Rate: 10, Burst: 5, Mode: hybrid.Local, OnOutage: hybrid.FailLocal}
	with := func(f func(*hybrid.Limit)) hybrid.Limit {
		l := ok
		f(&l)
		return l
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: New does not contact Redis
	t.Cleanup(func() { _ = rdb.Close() })
	for _, tc := range []struct {
		name string
		cfg  hybrid.Config
		want []string // all must appear in the message
	}{
		{"no limits", hybrid.Config{}, []string{"no limits"}},
		{"unset mode", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Mode = hybrid.ModeUnset })}},
			[]string{`"api"`, "Mode is unset", "hybrid.Hybrid"}},
		{"unset outage policy", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.OnOutage = hybrid.PolicyUnset })}},
			[]string{`"api"`, "OnOutage is unset", "hybrid.FailLocal", "hybrid.FailOpen", "hybrid.FailClosed"}},
		{"unknown mode", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Mode = 9 })}}, []string{`"api"`, "Mode(9)"}},
		{"unknown policy", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.OnOutage = 9 })}}, []string{`"api"`, "Policy(9)"}},
		{"zero rate", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Rate = 0 })}}, []string{`"api"`, "Rate 0"}},
		{"negative rate", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Rate = -1 })}}, []string{"Rate -1"}},
		{"NaN rate", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Rate = math.NaN() })}}, []string{"Rate NaN"}},
		{"infinite rate", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Rate = math.Inf(1) })}}, []string{"Rate +Inf"}},
		{"zero burst", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Burst = 0 })}}, []string{`"api"`, "Burst 0", "at least 1"}},
		{"no name", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Name = "" })}}, []string{"#0 has no Name"}},
		{"name with a colon", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Name = "a:b" })}}, []string{`"a:b"`, "without ':'"}},
		{"name with a brace", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Name = "a{b}" })}}, []string{`"a{b}"`, "'{'"}},
		{"name not UTF-8", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Name = "a\xff" })}}, []string{"valid UTF-8"}},
		{"duplicate name", hybrid.Config{Limits: []hybrid.Limit{ok, ok}}, []string{`"api" is defined twice`}},
		{"hybrid without redis", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Mode = hybrid.Hybrid })}},
			[]string{"Redis is nil"}},
		{"global without redis", hybrid.Config{Limits: []hybrid.Limit{with(func(l *hybrid.Limit) { l.Mode = hybrid.Global })}},
			[]string{"Redis is nil"}},
		{"timeout above lease", hybrid.Config{Redis: rdb, Limits: []hybrid.Limit{ok}, RedisTimeout: time.Second},
			[]string{"RedisTimeout 1s must be below ContendedTTL"}},
		{"negative tick", hybrid.Config{Limits: []hybrid.Limit{ok}, Tick: -time.Second}, []string{"Tick is -1s"}},
		{"lease shorter than two ticks", hybrid.Config{Limits: []hybrid.Limit{ok}, Tick: time.Second},
			[]string{"ContendedTTL 600ms must be more than two ticks"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := hybrid.New(tc.cfg)
			if err == nil {
				_ = l.Close(context.Background())
				t.Fatal("New accepted the config")
			}
			if !errors.Is(err, hybrid.ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestEnumsHaveNames(t *testing.T) {
	for _, tc := range []struct {
		s    interface{ String() string }
		want string
	}{
		{hybrid.Local, "local"}, {hybrid.Global, "global"}, {hybrid.Hybrid, "hybrid"}, {hybrid.ModeUnset, "Mode(0)"},
		{hybrid.FailLocal, "fail-local"}, {hybrid.FailOpen, "fail-open"}, {hybrid.FailClosed, "fail-closed"}, {hybrid.PolicyUnset, "Policy(0)"},
		{hybrid.SourceLease, "lease"}, {hybrid.SourceLocal, "local"}, {hybrid.SourceGlobal, "global"},
		{hybrid.SourceFailOpen, "fail_open"}, {hybrid.SourceFailClosed, "fail_closed"}, {hybrid.Source(0), "Source(0)"},
	} {
		if got := tc.s.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

func TestAllowNRejectsBadCalls(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{{Name: "api", Rate: 10, Burst: 5, Mode: hybrid.Local, OnOutage: hybrid.FailOpen}}})
	ctx := context.Background()
	if _, err := l.AllowN(ctx, "nope", "k", 1); !errors.Is(err, hybrid.ErrUnknownLimit) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("unknown limit: %v", err)
	}
	for _, n := range []int{0, -1} {
		if _, err := l.AllowN(ctx, "api", "k", n); !errors.Is(err, hybrid.ErrInvalidN) {
			t.Errorf("n=%d: %v", n, err)
		}
	}
	d, err := l.AllowN(ctx, "api", "k", 6)
	if !errors.Is(err, hybrid.ErrExceedsBurst) || d.Allowed || d.RetryAfter != hybrid.Never {
		t.Errorf("n > burst: %+v, %v", d, err)
	}
	if err := l.Wait(ctx, "api", "k", 6); !errors.Is(err, hybrid.ErrExceedsBurst) {
		t.Errorf("Wait with n > burst: %v", err)
	}
	if _, err := l.Status("nope"); !errors.Is(err, hybrid.ErrUnknownLimit) {
		t.Errorf("Status of unknown limit: %v", err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "api", "k"); !errors.Is(err, hybrid.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	if err := l.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestModesAgree runs one table against every mode on one instance: what a
// single instance admits does not depend on where the bucket lives.
func TestModesAgree(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			l := newLimiter(t, hybrid.Config{Redis: srv.Client(t), Limits: []hybrid.Limit{
				// A rate slow enough that no token comes back during the test.
				{Name: "l", Rate: 0.01, Burst: 3, Mode: mode, OnOutage: hybrid.FailClosed},
			}})
			ctx := context.Background()
			// A Hybrid key's first decisions are exact ones, in Redis.
			want := map[hybrid.Mode]hybrid.Source{hybrid.Local: hybrid.SourceLocal, hybrid.Global: hybrid.SourceGlobal, hybrid.Hybrid: hybrid.SourceExact}[mode]
			for i, step := range []struct {
				n       int
				allowed bool
				remain  int64
			}{{1, true, 2}, {2, true, 0}, {1, false, 0}, {3, false, 0}} {
				d, err := l.AllowN(ctx, "l", "k", step.n)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != step.allowed || d.Remaining != step.remain || d.Source != want {
					t.Fatalf("step %d (n=%d): %+v, want allowed=%v remaining=%d source=%v", i, step.n, d, step.allowed, step.remain, want)
				}
				if !d.Allowed && d.RetryAfter < time.Minute {
					t.Fatalf("step %d: RetryAfter %v, want about %d tokens at 0.01/s", i, d.RetryAfter, step.n)
				}
			}
		})
	}
}

func TestWait(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{{Name: "api", Rate: 50, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailOpen}}})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if err := l.Wait(ctx, "api", "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	// At 50/s with burst 1 the bucket is now empty: a deadline shorter than
	// one token's 20ms cannot be met.
	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	l.Allow(ctx, "api", "k")
	if err := l.Wait(short, "api", "k", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: %v", err)
	}
}
