package local

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/time/rate"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustNew(t testing.TB, cfg Config) *Limiter {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Limit: 0, Burst: 1},
		{Limit: -1, Burst: 1},
		{Limit: rate.Limit(math.NaN()), Burst: 1},
		{Limit: rate.Inf, Burst: 1},
		{Limit: 1, Burst: 0},
		{Limit: 1, Burst: 1, Instances: -1},
		{Limit: 1, Burst: 1, Shards: -1},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
}

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		limit rate.Limit
		burst int
		n     int
		rank  int
		want  Share
	}{
		{100, 10, 1, 0, Share{100, 10}},
		{100, 10, 4, 0, Share{25, 3}},
		{100, 10, 4, 1, Share{25, 3}},
		{100, 10, 4, 2, Share{25, 2}},
		{100, 10, 4, 3, Share{25, 2}},
		{100, 5, 4, 0, Share{25, 2}},
		{100, 5, 4, 1, Share{25, 1}},
		{100, 3, 4, 2, Share{25, 1}},
		{100, 3, 4, 3, Share{25, 0}},
		{100, 1, 4, 0, Share{25, 1}},
		{100, 1, 4, 1, Share{25, 0}},
		{100, 10, 4, NoRank, Share{25, 2}},
		{100, 3, 4, NoRank, Share{25, 0}},
		{100, 10, 4, 4, Share{25, 2}}, // outside [0, n): no remainder
		{100, 10, 0, 0, Share{100, 10}},
		{100, 10, -3, NoRank, Share{100, 10}},
	} {
		if got := Split(tc.limit, tc.burst, tc.n, tc.rank); got != tc.want {
			t.Errorf("Split(%v, %d, %d, %d) = %+v, want %+v", tc.limit, tc.burst, tc.n, tc.rank, got, tc.want)
		}
	}
}

// TestSplitSumsToBurst checks that the bursts of ranks 0 to n-1 sum to
// exactly the burst, differ by at most one token, and that the ranks a
// view may hold (any distinct ranks, a subset of them, or none) never sum
// above it.
func TestSplitSumsToBurst(t *testing.T) {
	for burst := 1; burst <= 70; burst++ {
		for n := 1; n <= 20; n++ {
			sum, lo, hi := 0, burst, 0
			for rank := range n {
				b := Split(100, burst, n, rank).Burst
				sum += b
				lo, hi = min(lo, b), max(hi, b)
				if b < 0 {
					t.Fatalf("burst %d n %d rank %d: negative burst %d", burst, n, rank, b)
				}
			}
			if sum != burst {
				t.Errorf("burst %d over %d instances: ranks sum to %d", burst, n, sum)
			}
			if hi-lo > 1 {
				t.Errorf("burst %d over %d instances: bursts from %d to %d", burst, n, lo, hi)
			}
			if u := n * Split(100, burst, n, NoRank).Burst; u > burst {
				t.Errorf("burst %d over %d unranked instances: %d", burst, n, u)
			}
		}
	}
}

// step is one decision at t0+at.
type step struct {
	at      time.Duration
	n       int
	allowed bool
	remain  int64
}

func run(t *testing.T, l *Limiter, key string, steps []step) {
	t.Helper()
	for i, s := range steps {
		r := l.AllowN(t0.Add(s.at), key, s.n)
		if r.Allowed != s.allowed || r.Remaining != s.remain {
			t.Fatalf("step %d (at %v, n %d): allowed %v remaining %d, want %v %d", i, s.at, s.n, r.Allowed, r.Remaining, s.allowed, s.remain)
		}
		if r.Allowed && r.RetryAfter != 0 {
			t.Fatalf("step %d: RetryAfter %v on an allowed decision", i, r.RetryAfter)
		}
		if !r.Allowed && r.RetryAfter <= 0 {
			t.Fatalf("step %d: RetryAfter %v on a denial", i, r.RetryAfter)
		}
	}
}

func TestAllowN(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"burst then deny", Config{Limit: 10, Burst: 3}, []step{
			{0, 1, true, 2}, {0, 1, true, 1}, {0, 1, true, 0}, {0, 1, false, 0},
		}},
		{"refill at rate", Config{Limit: 10, Burst: 3}, []step{
			{0, 3, true, 0}, {50 * time.Millisecond, 1, false, 0}, {100 * time.Millisecond, 1, true, 0},
			{time.Second, 3, true, 0},
		}},
		{"n above burst never", Config{Limit: 10, Burst: 3}, []step{
			{0, 4, false, 3}, {time.Hour, 4, false, 3},
		}},
		{"default share of four", Config{Limit: 100, Burst: 8, Instances: 4}, []step{
			{0, 2, true, 0}, {0, 1, false, 0}, {40 * time.Millisecond, 1, true, 0},
		}},
		{"time going backwards gives nothing back", Config{Limit: 10, Burst: 1}, []step{
			{time.Second, 1, true, 0}, {500 * time.Millisecond, 1, false, 0}, {1050 * time.Millisecond, 1, false, 0},
			{1100 * time.Millisecond, 1, true, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run(t, mustNew(t, tc.cfg), "k", tc.steps)
		})
	}
}

func TestRetryAfter(t *testing.T) {
	l := mustNew(t, Config{Limit: 10, Burst: 2})
	l.AllowN(t0, "k", 2)
	r := l.AllowN(t0, "k", 1)
	if r.Allowed || r.RetryAfter != 100*time.Millisecond {
		t.Fatalf("got %+v, want denial with RetryAfter 100ms", r)
	}
	if r := l.AllowN(t0, "k", 3); r.RetryAfter != math.MaxInt64 {
		t.Fatalf("n above burst: RetryAfter %v, want MaxInt64", r.RetryAfter)
	}
	if r := l.AllowN(t0, "k", 0); r.Allowed {
		t.Fatal("n = 0 was allowed")
	}
}

func TestKeysAreIndependent(t *testing.T) {
	l := mustNew(t, Config{Limit: 1, Burst: 1})
	for i := 0; i < 100; i++ {
		if !l.Allow(t0, fmt.Sprint("k", i)).Allowed {
			t.Fatalf("key %d denied on its first request", i)
		}
	}
	if l.Len() != 100 {
		t.Fatalf("Len = %d, want 100", l.Len())
	}
}

func TestAssignAndExpiry(t *testing.T) {
	l := mustNew(t, Config{Limit: 100, Burst: 10, Instances: 4})
	if l.Assign(t0, "k", Share{50, 5}, t0.Add(time.Second)) {
		t.Fatal("Assign on an unknown key reported true")
	}
	l.AllowN(t0, "k", 2) // default share 25/s burst 2: now empty
	if !l.Assign(t0, "k", Share{50, 5}, t0.Add(time.Second)) {
		t.Fatal("Assign on a known key reported false")
	}
	r := l.AllowN(t0.Add(100*time.Millisecond), "k", 5) // 5 tokens at 50/s
	if !r.Allowed || !r.Assigned {
		t.Fatalf("at the assigned share: %+v", r)
	}
	st := l.AppendStats(nil)
	if len(st) != 1 || !st[0].Assigned || st[0].Share != (Share{50, 5}) || st[0].Attempted != 7 {
		t.Fatalf("stats %+v", st)
	}
	if one, ok := l.Stats("k"); !ok || one != st[0] {
		t.Fatalf("Stats(k) = %+v, %v; want AppendStats's %+v", one, ok, st[0])
	}
	// After until the key is back at the default share, with its burst.
	r = l.AllowN(t0.Add(2*time.Second), "k", 2)
	if !r.Allowed || r.Assigned {
		t.Fatalf("after expiry: %+v", r)
	}
	if r := l.AllowN(t0.Add(2*time.Second), "k", 1); r.Allowed {
		t.Fatalf("default burst 2 exceeded after expiry: %+v", r)
	}
	l.Assign(t0.Add(2*time.Second), "k", Share{50, 5}, t0.Add(3*time.Second))
	l.Unassign(t0.Add(2*time.Second), "k")
	if st := l.AppendStats(nil); st[0].Assigned || st[0].Share != (Share{25, 2}) {
		t.Fatalf("after Unassign: %+v", st[0])
	}
}

func TestSetInstancesResplitsDefaultKeysOnly(t *testing.T) {
	l := mustNew(t, Config{Limit: 120, Burst: 12, Instances: 3})
	l.Allow(t0, "default")
	l.Allow(t0, "leased")
	l.Assign(t0, "leased", Share{90, 9}, t0.Add(time.Minute))
	l.SetInstances(t0, 2)
	got := map[string]Share{}
	for _, s := range l.AppendStats(nil) {
		got[s.Key] = s.Share
	}
	if got["default"] != (Share{60, 6}) || got["leased"] != (Share{90, 9}) {
		t.Fatalf("shares after SetInstances(2): %+v", got)
	}
	if l.Default() != (Share{60, 6}) {
		t.Fatalf("Default = %+v", l.Default())
	}
}

// TestSetLimit changes the rate and burst of a limit split over 2
// instances: keys at the default share move to the new split at once,
// keeping their tokens up to the new burst; an assigned key keeps its share
// until it ends, then falls back to the new default; bad values change
// nothing.
func TestSetLimit(t *testing.T) {
	l := mustNew(t, Config{Limit: 100, Burst: 20, Instances: 2})
	l.AllowN(t0, "default", 4) // 10 - 4 = 6 tokens left
	l.Allow(t0, "leased")
	l.Assign(t0, "leased", Share{80, 16}, t0.Add(time.Second))
	if err := l.SetLimit(t0, 10, 8); err != nil {
		t.Fatal(err)
	}
	if l.Limit() != 10 || l.Burst() != 8 || l.Instances() != 2 || l.Default() != (Share{5, 4}) {
		t.Fatalf("after SetLimit(10, 8): limit %v burst %d instances %d default %+v", l.Limit(), l.Burst(), l.Instances(), l.Default())
	}
	got := map[string]KeyStats{}
	for _, s := range l.AppendStats(nil) {
		got[s.Key] = s
	}
	if got["default"].Share != (Share{5, 4}) || got["leased"].Share != (Share{80, 16}) {
		t.Fatalf("shares after SetLimit: %+v", got)
	}
	// 6 tokens, clamped to the new burst of 4.
	for i, want := range []bool{true, true, true, true, false} {
		if r := l.Allow(t0, "default"); r.Allowed != want {
			t.Fatalf("decision %d on the default key at the new burst: %+v, want allowed %v", i, r, want)
		}
	}
	if r := l.Allow(t0.Add(2*time.Second), "leased"); r.Assigned || !r.Allowed {
		t.Fatalf("leased key after its share ended: %+v, want the new default share", r)
	}
	if st := l.AppendStats(nil); len(st) != 2 {
		t.Fatalf("%d keys", len(st))
	}
	for _, bad := range []struct {
		limit rate.Limit
		burst int
	}{{0, 1}, {rate.Inf, 1}, {rate.Limit(math.NaN()), 1}, {1, 0}} {
		if err := l.SetLimit(t0, bad.limit, bad.burst); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetLimit(%v, %d) = %v, want ErrInvalid", bad.limit, bad.burst, err)
		}
	}
	if l.Limit() != 10 || l.Burst() != 8 {
		t.Fatalf("a rejected SetLimit changed the limit to %v burst %d", l.Limit(), l.Burst())
	}
	// A share set with SetDefault holds until SetLimit splits anew.
	l.SetDefault(t0, Share{1, 1})
	if err := l.SetLimit(t0, 12, 8); err != nil || l.Default() != (Share{6, 4}) {
		t.Fatalf("SetLimit(12, 8) after SetDefault: %v, default %+v", err, l.Default())
	}
}

func TestEvictIdle(t *testing.T) {
	l := mustNew(t, Config{Limit: 1, Burst: 1})
	l.Allow(t0, "old")
	l.Allow(t0.Add(time.Minute), "new")
	ev := l.EvictIdle(t0.Add(time.Minute), 30*time.Second, nil)
	if len(ev) != 1 || ev[0] != "old" || l.Len() != 1 {
		t.Fatalf("evicted %v, %d keys left", ev, l.Len())
	}
	// An evicted key starts afresh, full.
	if !l.Allow(t0.Add(time.Minute), "old").Allowed {
		t.Fatal("evicted key did not start afresh")
	}
}

func TestAllowNDoesNotAllocate(t *testing.T) {
	l := mustNew(t, Config{Limit: 1e9, Burst: 1000})
	now := time.Now()
	l.Allow(now, "hot")
	if a := testing.AllocsPerRun(1000, func() { l.Allow(now, "hot") }); a != 0 {
		t.Fatalf("AllowN on an existing key allocates %v times", a)
	}
}

// TestConcurrentNeverOverAdmits drives one key from many goroutines with
// real, racing timestamps: admitted tokens stay within rate*elapsed+burst,
// which a bare rate.Limiter fed out-of-order times breaks.
func TestConcurrentNeverOverAdmits(t *testing.T) {
	const limit, burst, workers, each = 20000, 100, 32, 5000
	l := mustNew(t, Config{Limit: limit, Burst: burst})
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	l.Allow(start, "k")
	admitted.Add(1)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if l.Allow(time.Now(), "k").Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := int64(limit*elapsed.Seconds()) + burst + 1
	if got := admitted.Load(); got > bound {
		t.Fatalf("admitted %d in %v, bound %d", got, elapsed, bound)
	}
}

func TestConcurrentEvictionAndDecisions(t *testing.T) {
	l := mustNew(t, Config{Limit: 1e6, Burst: 10, Shards: 2})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				now := time.Now()
				key := fmt.Sprint(i % 50)
				l.Allow(now, key)
				l.Assign(now, key, Share{10, 2}, now.Add(time.Millisecond))
			}
		}(w)
	}
	for i := 0; i < 200; i++ {
		l.EvictIdle(time.Now(), 0, nil)
		l.SetInstances(time.Now(), 1+i%5)
		if err := l.SetLimit(time.Now(), rate.Limit(1e6+i%3), 10+i%4); err != nil {
			t.Error(err)
		}
		l.AppendStats(nil)
	}
	close(stop)
	wg.Wait()
}

// TestEntrySize keeps an entry at 88 bytes, 104 with the key's string the
// table holds beside it, which is what holds the memory per key under
// twice that of a bare map of limiters: entries are held by value in
// pages, so every byte it grows by is a byte more on every key.
func TestEntrySize(t *testing.T) {
	if got := unsafe.Sizeof(entry{}); got > 88 {
		t.Fatalf("an entry takes %d bytes, more than 88", got)
	}
	// Shards sit on cache lines of their own, so that deciding on keys of
	// different shards from different cores does not bounce one line.
	if got := unsafe.Sizeof(shard{}); got != 128 {
		t.Fatalf("a shard takes %d bytes, not two 64-byte cache lines", got)
	}
	// What a decision writes (the mutex and the counts) shares the first.
	if got := unsafe.Offsetof(shard{}.keys); got != 64 {
		t.Fatalf("a shard's keys start at byte %d, not on its second line", got)
	}
}

// TestStatsTimes checks that the times an entry keeps as offsets come back
// as the instants they were given, for fixed instants and for readings of
// the clock (which carry a monotonic reading), and that a time given out of
// order is clamped.
func TestStatsTimes(t *testing.T) {
	for name, start := range map[string]time.Time{"fixed": t0, "clock": time.Now()} {
		t.Run(name, func(t *testing.T) {
			l := mustNew(t, Config{Limit: 10, Burst: 10, Shards: 1})
			l.Allow(start, "k")
			l.Allow(start.Add(3*time.Second), "k")
			l.Allow(start.Add(2*time.Second), "k") // out of order: counts as 3s
			l.Assign(start.Add(3*time.Second), "k", Share{20, 20}, start.Add(time.Minute))
			st := l.AppendStats(nil)
			if len(st) != 1 {
				t.Fatalf("%d stats", len(st))
			}
			s := st[0]
			if !s.Created.Equal(start) || !s.LastSeen.Equal(start.Add(3*time.Second)) ||
				!s.Until.Equal(start.Add(time.Minute)) || !s.Assigned || s.Attempted != 3 {
				t.Fatalf("stats %+v, want created at the start, last seen 3s later, until 1m later", s)
			}
			l.Unassign(start.Add(4*time.Second), "k")
			if s := l.AppendStats(nil)[0]; s.Assigned || !s.Until.IsZero() {
				t.Fatalf("after Unassign: %+v, want not assigned and a zero Until", s)
			}
		})
	}
}

// TestZeroBurstDefaultShare: a rank that the split gives no token of the
// burst denies every request at its default share, counting the denial
// (the caller asks for more on it), runs an assigned share, and denies
// again once that share lapses.
func TestZeroBurstDefaultShare(t *testing.T) {
	l := mustNew(t, Config{Limit: 100, Burst: 3, Instances: 4})
	l.SetPlace(t0, Place{Instances: 4, Rank: 3})
	if got := l.Default(); got != (Share{25, 0}) {
		t.Fatalf("default share of rank 3: %+v, want {25 0}", got)
	}
	for i := range 3 {
		r := l.Allow(t0.Add(time.Duration(i)*time.Second), "k")
		if r.Allowed || r.RetryAfter != math.MaxInt64 {
			t.Fatalf("decision %d at the default share: %+v, want a denial that never clears", i, r)
		}
	}
	if st := l.AppendStats(nil); len(st) != 1 || st[0].Denied != 3 {
		t.Fatalf("stats: %+v, want 3 tokens denied", st)
	}
	at := t0.Add(3 * time.Second)
	l.Assign(at, "k", Share{Limit: 50, Burst: 2}, at.Add(time.Second))
	if r := l.AllowN(at.Add(100*time.Millisecond), "k", 1); !r.Allowed {
		t.Fatalf("at the assigned share: %+v", r)
	}
	if r := l.Allow(at.Add(2*time.Second), "k"); r.Allowed {
		t.Fatalf("lapsed below a zero default share: %+v", r)
	}
	// Rank 0 of the same split holds a token, and keys at the default share
	// move to it at once.
	l.SetPlace(at.Add(2*time.Second), Place{Instances: 4, Rank: 0})
	if r := l.Allow(at.Add(3*time.Second), "fresh"); !r.Allowed {
		t.Fatalf("rank 0: %+v", r)
	}
}

// The zero time is now, read under the key's lock: a decision made with it
// is dated when it was made.
func TestZeroTimeIsNow(t *testing.T) {
	l := mustNew(t, Config{Limit: 10, Burst: 1, Instances: 1})
	before := time.Now()
	if r := l.AllowN(time.Time{}, "k", 1); !r.Allowed {
		t.Fatalf("first decision at the zero time: %+v", r)
	}
	after := time.Now()
	st, ok := l.Stats("k")
	if !ok || st.LastSeen.Before(before) || st.LastSeen.After(after) {
		t.Errorf("decided at %v, want between %v and %v", st.LastSeen, before, after)
	}
	if r := l.AllowN(time.Time{}, "k", 1); r.Allowed || r.RetryAfter <= 0 || r.RetryAfter > 100*time.Millisecond {
		t.Errorf("second decision: %+v, want a denial for up to 100ms", r)
	}
}
