package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/hybrid/placement"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// newLimiter starts a Limiter and closes it in t.Cleanup.
func newLimiter(t testing.TB, cfg hybrid.Config) *hybrid.Limiter {
	t.Helper()
	l, err := hybrid.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// cluster starts n Limiters on one Redis, each with its own client and a
// static instance count of n, as n service instances would be.
func cluster(t testing.TB, srv *redistest.Server, n int, tune func(*hybrid.Config), limits ...hybrid.Limit) []*hybrid.Limiter {
	t.Helper()
	return clusterEach(t, srv, n, func(_ int, c *hybrid.Config) {
		if tune != nil {
			tune(c)
		}
	}, limits...)
}

// clusterEach is cluster with a tune that sees which instance it sets up,
// for instances that differ: a client through a fault proxy, a registry of
// their own.
func clusterEach(t testing.TB, srv *redistest.Server, n int, tune func(i int, c *hybrid.Config), limits ...hybrid.Limit) []*hybrid.Limiter {
	t.Helper()
	ls := make([]*hybrid.Limiter, n)
	bus := membership.NewBus() // the instances know each other's names: ranks for the local quotas
	for i := range ls {
		cfg := hybrid.Config{
			Redis:   fastClient(t, srv),
			Members: connected(membership.NewStatic(fmt.Sprintf("instance-%d", i), n), bus),
			Limits:  limits,
		}
		tune(i, &cfg)
		ls[i] = newLimiter(t, cfg)
	}
	return ls
}

// connected connects s to bus and returns it.
func connected(s *membership.Static, bus *membership.Bus) *membership.Static {
	s.Connect(bus)
	return s
}

// load is an open-loop arrival schedule: each instance receives arrivals at
// its own fixed rate, whatever the answers, spread round-robin over keys.
type load struct {
	limit    string
	keys     []string
	perInst  []float64 // arrivals per second on each instance
	duration time.Duration
	// during, if set, runs once at duringAt, or at half time if that is 0
	// (fault injection).
	during   func()
	duringAt time.Duration
}

// outcome records what happened to every arrival.
type outcome struct {
	start    time.Time
	elapsed  time.Duration
	arrivals map[string][]time.Duration // per key, offsets from start, all instances
	admitted map[string][]time.Duration
	decided  int
	slow     int // decisions that took longer than 100ms
	sources  map[hybrid.Source]int
	errs     int
	perInst  []int // admitted per instance
}

// drive runs the load against the instances (instance i gets perInst[i]).
func drive(t *testing.T, inst []*hybrid.Limiter, ld load) outcome {
	t.Helper()
	type rec struct {
		arr, adm map[string][]time.Duration
		decided  int
		slow     int
		errs     int
		sources  map[hybrid.Source]int
	}
	recs := make([]rec, len(inst))
	start := time.Now()
	end := start.Add(ld.duration)
	var wg sync.WaitGroup
	for i, l := range inst {
		if ld.perInst[i] <= 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rec{arr: map[string][]time.Duration{}, adm: map[string][]time.Duration{}, sources: map[hybrid.Source]int{}}
			interval := time.Duration(float64(time.Second) / ld.perInst[i])
			next := start.Add(time.Duration(i) * interval / time.Duration(len(inst)))
			k := i
			ctx := context.Background()
			for {
				now := time.Now()
				if !now.Before(end) {
					break
				}
				for ; !next.After(now) && next.Before(end); next = next.Add(interval) {
					key := ld.keys[k%len(ld.keys)]
					k++
					at := next.Sub(start)
					t0 := time.Now()
					d, err := l.Allow(ctx, ld.limit, key)
					if time.Since(t0) > 100*time.Millisecond {
						r.slow++
					}
					r.decided++
					if err != nil {
						r.errs++
						continue
					}
					r.sources[d.Source]++
					r.arr[key] = append(r.arr[key], at)
					if d.Allowed {
						r.adm[key] = append(r.adm[key], at)
					}
				}
				// Pace the open loop: this sleep schedules arrivals, it does
				// not wait for anything to happen.
				time.Sleep(min(time.Until(next), time.Millisecond))
			}
			recs[i] = r
		}()
	}
	if ld.during != nil {
		at := ld.duringAt
		if at == 0 {
			at = ld.duration / 2
		}
		time.Sleep(at) // schedules the fault; waits for nothing
		ld.during()
	}
	wg.Wait()
	o := outcome{start: start, elapsed: time.Since(start), arrivals: map[string][]time.Duration{},
		admitted: map[string][]time.Duration{}, sources: map[hybrid.Source]int{}}
	for _, r := range recs {
		for k, v := range r.arr {
			o.arrivals[k] = append(o.arrivals[k], v...)
		}
		for k, v := range r.adm {
			o.admitted[k] = append(o.admitted[k], v...)
		}
		n := 0
		for _, v := range r.adm {
			n += len(v)
		}
		o.perInst = append(o.perInst, n)
		o.decided += r.decided
		o.slow += r.slow
		o.errs += r.errs
		for s, c := range r.sources {
			o.sources[s] += c
		}
	}
	for _, v := range o.arrivals {
		slices.Sort(v)
	}
	for _, v := range o.admitted {
		slices.Sort(v)
	}
	return o
}

// exact is what one exact token bucket of rate and burst, starting full,
// admits on the given sorted arrivals, counting only admissions at or after
// from.
func exact(rate float64, burst int, arrivals []time.Duration, from time.Duration) int {
	tokens := float64(burst)
	var last time.Duration
	n := 0
	for _, a := range arrivals {
		tokens = math.Min(float64(burst), tokens+(a-last).Seconds()*rate)
		last = a
		if tokens >= 1 {
			tokens--
			if a >= from {
				n++
			}
		}
	}
	return n
}

// since counts the sorted times at or after from.
func since(times []time.Duration, from time.Duration) int {
	i, _ := slices.BinarySearch(times, from)
	return len(times) - i
}

// maxInWindow is the largest number of sorted times within any window of
// length w.
func maxInWindow(times []time.Duration, w time.Duration) int {
	best, j := 0, 0
	for i := range times {
		for times[i]-times[j] > w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

func total(m map[string][]time.Duration) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

// eventually polls cond every 10ms until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("key-%04d", i)
	}
	return ks
}

// logPerSecond logs admissions and arrivals per second of the run.
func logPerSecond(t *testing.T, o outcome) {
	t.Helper()
	n := int(o.elapsed/time.Second) + 1
	adm, arr := make([]int, n), make([]int, n)
	for _, v := range o.admitted {
		for _, a := range v {
			adm[a/time.Second]++
		}
	}
	for _, v := range o.arrivals {
		for _, a := range v {
			arr[a/time.Second]++
		}
	}
	t.Logf("per second admitted %v arrivals %v", adm, arr)
}

// warmKey makes max(burst+1, placement.MinTokens) decisions of key at
// once and returns the last one: a key asked for that often at once is
// worth a lease (see placement), and its burst is spent. A last decision
// by a lease right after an exact one is reported as the exact one: it
// may have spent the exact take's credit rather than a lease.
func warmKey(t *testing.T, l *hybrid.Limiter, limit, key string, burst int) hybrid.Decision {
	t.Helper()
	var d, prev hybrid.Decision
	for range max(burst+1, placement.MinTokens) {
		var err error
		prev = d
		if d, err = l.Allow(context.Background(), limit, key); err != nil {
			t.Fatalf("Allow(%q): %v", limit, err)
		}
	}
	if d.Source == hybrid.SourceLease && prev.Source == hybrid.SourceExact {
		// A lease decision right after an exact one may be the exact
		// take's credit (a lease of rate 0 with one token), not a lease
		// of the key's own: two lease decisions in a row are.
		return prev
	}
	return d
}

// leaseRecord is one instance's lease record in a key's hash (see
// global/placement.lua): its grant, and how much longer it lives.
type leaseRecord struct {
	granted float64
	lives   time.Duration // at Redis's time
}

// leaseRecords reads the hash of (limit, key) and returns the live lease
// records by instance, at Redis's time; exact users' records are left out.
func leaseRecords(t *testing.T, rdb *redis.Client, limit, key string) map[string]leaseRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	fields, err := rdb.HGetAll(ctx, global.New(rdb, "hybridlimit").RecordKey(limit, key)).Result()
	if err != nil {
		t.Fatalf("HGETALL: %v", err)
	}
	out := map[string]leaseRecord{}
	for f, v := range fields {
		inst, ok := strings.CutPrefix(f, "i:")
		if !ok {
			continue
		}
		// "L gen granted want expiry_us claim claim_until_us born_us
		// credit credit_end_us credit_id", or an exact user's "X ...".
		parts := strings.Fields(v)
		if len(parts) > 0 && parts[0] == "X" {
			continue
		}
		if len(parts) != 11 || parts[0] != "L" {
			t.Fatalf("lease record %s = %q", f, v)
		}
		granted, err1 := strconv.ParseFloat(parts[2], 64)
		expiry, err2 := strconv.ParseInt(parts[4], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("lease record %s = %q: %v", f, v, errors.Join(err1, err2))
		}
		if lives := time.Duration(expiry-now.UnixMicro()) * time.Microsecond; lives > 0 {
			out[inst] = leaseRecord{granted: granted, lives: lives}
		}
	}
	return out
}

// leasesOf returns the grants in force of (limit, key) by instance.
func leasesOf(t *testing.T, rdb *redis.Client, limit, key string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for inst, r := range leaseRecords(t, rdb, limit, key) {
		out[inst] = r.granted
	}
	return out
}
