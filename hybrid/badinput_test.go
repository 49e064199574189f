package hybrid_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redisproc"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// oddKeys are keys a caller may hand us: each must get a decision, never a
// panic or an error, and a bucket of its own that behaves.
var oddKeys = map[string]string{
	"empty":         "",
	"NUL":           "a\x00b",
	"invalid UTF-8": "\xff\xfe\xfd",
	"hash tag":      "}{x}{",
	"1 MiB":         strings.Repeat("k", 1<<20),
}

func TestOddKeysGetTheirOwnBucket(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			l := newLimiter(t, hybrid.Config{Redis: srv.Client(t), Prefix: "odd-" + mode.String(), Limits: []hybrid.Limit{
				{Name: "l", Rate: 0.001, Burst: 2, Mode: mode, OnOutage: hybrid.FailClosed},
			}})
			ctx := context.Background()
			for name, key := range oddKeys {
				for i, want := range []bool{true, true, false} {
					d, err := l.Allow(ctx, "l", key)
					if err != nil {
						t.Fatalf("%s key, call %d: %v", name, i, err)
					}
					if d.Allowed != want || d.Remaining < 0 || d.Remaining > 2 {
						t.Fatalf("%s key, call %d: %+v, want allowed=%v", name, i, d, want)
					}
				}
			}
		})
	}
}

func TestBadCallsAreErrors(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{{Name: "l", Rate: 1, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailOpen}}})
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		limit string
		n     int
		want  error
	}{
		{"empty limit name", "", 1, hybrid.ErrUnknownLimit},
		{"unknown limit", "L", 1, hybrid.ErrUnknownLimit},
		{"n = 0", "l", 0, hybrid.ErrInvalidN},
		{"n < 0", "l", -5, hybrid.ErrInvalidN},
		{"n > burst", "l", 3, hybrid.ErrExceedsBurst},
	} {
		d, err := l.AllowN(ctx, tc.limit, "k", tc.n)
		if !errors.Is(err, tc.want) || d.Allowed {
			t.Errorf("%s: %+v, %v; want a non-admission and %v", tc.name, d, err, tc.want)
		}
	}
	// None of them touched the bucket.
	if d, _ := l.AllowN(ctx, "l", "k", 2); !d.Allowed {
		t.Errorf("bucket drained by rejected calls: %+v", d)
	}
}

// TestRedisErrorsAreDecisions: a value of the wrong type at our key, and a
// Redis user that may not run scripts, make decisions denials (or the
// policy of a Global limit), never errors or panics, and leave the limit's
// other keys and Redis itself alone.
func TestRedisErrorsAreDecisions(t *testing.T) {
	t.Run("WRONGTYPE", func(t *testing.T) {
		srv := redistest.Start(t)
		rdb := srv.Client(t)
		store := global.New(rdb, "hybridlimit")
		ctx := context.Background()
		for _, k := range []string{store.BucketKey("g", "bad"), store.RecordKey("h", "bad")} {
			if err := rdb.Set(ctx, k, "not ours", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		l := newLimiter(t, hybrid.Config{Redis: rdb, Limits: []hybrid.Limit{
			{Name: "g", Rate: 100, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailClosed},
			{Name: "h", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
		}})
		d, err := l.Allow(ctx, "g", "bad")
		if err != nil || d.Allowed || d.Source != hybrid.SourceFailClosed {
			t.Errorf("Global at a WRONGTYPE key: %+v, %v; want the FailClosed policy", d, err)
		}
		if d, err := l.Allow(ctx, "g", "good"); err != nil || !d.Allowed || d.Source != hybrid.SourceGlobal {
			t.Errorf("Global at a good key after a WRONGTYPE: %+v, %v", d, err)
		}
		// A Hybrid key decides exactly first: the bad key's takes and
		// lease asks get reply errors while Redis answers, and its
		// decisions are denials (not the outage policy: Redis is up, and
		// nothing local runs that Redis does not count). The good key
		// leases.
		eventually(t, 5*time.Second, "the Hybrid key at a WRONGTYPE value is denied, the good one leases", func() bool {
			bad := warmKey(t, l, "h", "bad", 10)
			good := warmKey(t, l, "h", "good", 10)
			return !bad.Allowed && bad.Source == hybrid.SourceExact && good.Source == hybrid.SourceLease
		})
		if st, _ := l.Status("h"); st.Degraded {
			t.Errorf("status %+v: want the limit normal", st)
		}
		if v, err := rdb.Get(ctx, store.RecordKey("h", "bad")).Result(); err != nil || v != "not ours" {
			t.Errorf("the value at our key was changed: %q, %v", v, err)
		}
	})
	t.Run("scripting revoked", func(t *testing.T) {
		// New refuses a user who may not run scripts (TestRedisCredentials);
		// one whose right is revoked while the Limiter runs gets NOPERM
		// replies, which are about each command, not an outage.
		srv := redistest.Start(t)
		admin := srv.Client(t)
		ctx := context.Background()
		if err := admin.Do(ctx, "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "noscripts", Password: "pw"})
		t.Cleanup(func() { _ = rdb.Close() })
		l := newLimiter(t, hybrid.Config{Redis: rdb, Limits: []hybrid.Limit{
			{Name: "g", Rate: 100, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailOpen},
			{Name: "h", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailOpen},
		}})
		if err := admin.Do(ctx, "ACL", "SETUSER", "noscripts", "-@scripting").Err(); err != nil {
			t.Fatal(err)
		}
		if d, err := l.Allow(ctx, "g", "k"); err != nil || d.Source != hybrid.SourceFailOpen || !d.Allowed {
			t.Errorf("Global without scripting: %+v, %v; want FailOpen", d, err)
		}
		// The Hybrid key's takes and asks fail while Redis answers PING:
		// its decisions are denials, which keep the bound; only a degraded
		// limit follows FailOpen, and the limit does not degrade.
		for range 20 {
			if d := warmKey(t, l, "h", "k", 10); d.Allowed || d.Source != hybrid.SourceExact {
				t.Fatalf("Hybrid without scripting: %+v; want a denial in Redis", d)
			}
		}
		if st, _ := l.Status("h"); st.Degraded {
			t.Errorf("status %+v: want the limit normal: Redis answers", st)
		}
	})
}

func TestRedisCredentials(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "right")
	limits := []hybrid.Limit{{Name: "h", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}}
	for _, tc := range []struct {
		name     string
		user, pw string
		ok       bool
	}{
		{"right password", "", "right", true},
		{"wrong password", "", "wrong", false},
		{"no password", "", "", false},
		{"a user who may not run scripts", "noscripts", "pw", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.user != "" {
				admin := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "right"})
				t.Cleanup(func() { _ = admin.Close() })
				if err := admin.Do(context.Background(), "ACL", "SETUSER", tc.user, "on", ">"+tc.pw, "~*", "+@all", "-@scripting").Err(); err != nil {
					t.Fatal(err)
				}
			}
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: tc.user, Password: tc.pw})
			t.Cleanup(func() { _ = rdb.Close() })
			l, err := hybrid.New(hybrid.Config{Redis: rdb, Limits: limits})
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				_ = l.Close(context.Background())
				return
			}
			if err == nil {
				_ = l.Close(context.Background())
				t.Fatal("New accepted a client Redis refuses")
			}
			if !errors.Is(err, hybrid.ErrConfig) || !strings.Contains(err.Error(), "Password") {
				t.Errorf("error %q: want ErrConfig saying to check the password", err)
			}
		})
	}
}

// TestACLUser runs a Hybrid and a Global limit as an ACL user with only the
// rights the README lists: connection commands, EVAL, EVALSHA and the
// commands the scripts call, on the keys under the prefix.
func TestACLUser(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := srv.Client(t).Do(ctx, "ACL", "SETUSER", "limiter", "on", ">pw", "~hybridlimit:*", "+@connection", "+eval", "+evalsha",
		"+time", "+hgetall", "+hmget", "+hset", "+hdel", "+pexpire", "+pexpireat", "+pttl", "+del").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	l := newLimiter(t, hybrid.Config{Redis: rdb, Limits: []hybrid.Limit{
		{Name: "g", Rate: 100, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailClosed},
		{Name: "h", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
	}})
	if d, err := l.Allow(ctx, "g", "k"); err != nil || d.Source != hybrid.SourceGlobal || !d.Allowed {
		t.Errorf("Global as a restricted ACL user: %+v, %v", d, err)
	}
	// A key's first decision is an exact one, against its pool, which
	// hands a token of credit with it (the pool is full): the second is
	// admitted from that, the third exactly again.
	for i, want := range []hybrid.Source{hybrid.SourceExact, hybrid.SourceLease, hybrid.SourceExact} {
		if d, err := l.Allow(ctx, "h", "k"); err != nil || d.Source != want || !d.Allowed {
			t.Fatalf("decision %d as a restricted ACL user: %+v, %v; want admitted by %v", i, d, err, want)
		}
	}
	// A busy key leases.
	eventually(t, 5*time.Second, "a lease as a restricted ACL user", func() bool {
		return warmKey(t, l, "h", "k", 10).Source == hybrid.SourceLease
	})
	if st, _ := l.Status("h"); st.FailingKeys != 0 || st.Degraded {
		t.Errorf("status %+v: want no failing key", st)
	}
}

// TestPrefixKeepsApplicationsApart: two applications with the same limit
// and key on one Redis, told apart by prefix, each lease the whole rate.
func TestPrefixKeepsApplicationsApart(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 1000, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	var apps []*hybrid.Limiter
	for _, prefix := range []string{"app1", "app2"} {
		apps = append(apps, newLimiter(t, hybrid.Config{Redis: srv.Client(t), Prefix: prefix,
			Members: membership.NewStatic(prefix+"-instance", 1), Limits: []hybrid.Limit{lim}}))
	}
	stops := []func(){hammerKey(t, apps[0], "api", "k"), hammerKey(t, apps[1], "api", "k")}
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	eventually(t, 5*time.Second, "each application leases the whole rate", func() bool {
		for _, a := range apps {
			if st, _ := a.Status("api"); st.LeasedRate < 999 {
				return false
			}
		}
		return true
	})
}

// TestLogsNeverCarryAKey logs every state change there is (degraded,
// recovered, failing keys, instance count) at debug level and checks that
// no line names a key, in any form: as it is, quoted, or escaped by the log
// handler (keys with quotes, NUL, invalid UTF-8).
func TestLogsNeverCarryAKey(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	var logs redisproc.Output
	members := membership.NewStatic("me", 2)
	// Both keys carry the marker, which any escaping keeps. The odd one (a
	// quote, a backslash, NUL, invalid UTF-8, a newline) is the one in the
	// errors logged: the Hybrid limit's failing key, and the Global
	// decision that finds Redis gone.
	const secret = "user-4711-secret"
	odd := secret + "\"\\\x00\xff\xfe\n"
	ctx := context.Background()
	l := newLimiter(t, hybrid.Config{Redis: rdb, Members: members,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Limits: []hybrid.Limit{
			{Name: "h", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
			{Name: "g", Rate: 100, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailClosed},
		}})
	allow := func(limit, key string) {
		t.Helper()
		if _, err := l.Allow(ctx, limit, key); err != nil {
			t.Fatal(err)
		}
	}
	allow("h", secret)
	members.Set(3)
	srv.Kill(t)
	// The odd key's exact take fails, naming the key in its error: the
	// key is logged as failing, then the limit as degraded.
	allow("h", odd)
	allow("g", odd)
	eventually(t, 5*time.Second, "the outage is logged", func() bool {
		allow("h", secret)
		return strings.Contains(logs.Tail(1<<20), "degraded")
	})
	srv.Restart(t)
	eventually(t, 5*time.Second, "the recovery is logged", func() bool {
		allow("h", secret)
		return strings.Contains(logs.Tail(1<<20), "back to normal")
	})
	out := logs.Tail(1 << 20)
	if !strings.Contains(out, "<key>") {
		t.Errorf("no error naming a key was logged, so the test proves nothing:\n%s", out)
	}
	if strings.Contains(out, secret) {
		t.Errorf("a log line carries a key:\n%s", out)
	}
}

// TestCostAboveTheShareOfTheBurstIsNotNever: a Hybrid request of n tokens,
// n within the limit's burst but above the part of it the key's lease
// holds here, is denied with a wait of a renewal, not Never: that part
// follows the key's lease, which may grow. (Never would tell clients not to
// retry, and the Middleware would state no Retry-After.) Only n above the
// whole burst is never admitted.
func TestCostAboveTheShareOfTheBurstIsNotNever(t *testing.T) {
	srv := redistest.Start(t)
	// Three busy instances lease a third each: 2 tokens of the burst of 8.
	inst := cluster(t, srv, 3, nil, hybrid.Limit{Name: "api", Rate: 100, Burst: 8, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal})
	ctx := context.Background()
	eventually(t, 10*time.Second, "every instance on a lease of a third", func() bool {
		all := true
		for _, l := range inst {
			d := warmKey(t, l, "api", "k", 8)
			st, _ := l.Status("api")
			all = all && d.Source == hybrid.SourceLease && st.LeasedRate < 40
		}
		return all
	})
	d, err := inst[0].AllowN(ctx, "api", "k", 4)
	if err != nil || d.Allowed || d.RetryAfter == hybrid.Never || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
		t.Errorf("AllowN(4) on a lease holding 2 of a burst of 8: %+v, %v; want a denial to look again within a renewal", d, err)
	}
	if d, err := inst[0].AllowN(ctx, "api", "k", 9); !errors.Is(err, hybrid.ErrExceedsBurst) || d.RetryAfter != hybrid.Never {
		t.Errorf("AllowN(9) with a burst of 8: %+v, %v; want Never and ErrExceedsBurst", d, err)
	}
}
