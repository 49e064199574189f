package global_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hybridlimit/hybridlimit/global"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// noNetwork is a Rediser whose every method panics: a Store built on it
// proves that a call never reaches the network.
type noNetwork struct{ global.Rediser }

func nan() float64 { return math.NaN() }
func inf() float64 { return math.Inf(1) }

// waitFor polls cond until it holds, failing the test after 5 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
}

// leaseField is one instance's lease as stored in the hash.
type leaseField struct {
	granted, want float64
	expiryUS      int64
	// running is the larger grant the instance said it was running when it
	// asked, counted until runningUS; zero if none.
	running   float64
	runningUS int64
	// hasBurst says the record counts its burst apart: grantedB, wantB
	// and runningB are then the parts of it granted, wanted and run
	// until runningUS.
	hasBurst                  bool
	grantedB, wantB, runningB float64
}

// holdsBurst is the part of a burst of burst, of a limit of rate rate, that
// the instance of f may hold at nowUS (see holds_burst in records.lua).
func (f leaseField) holdsBurst(nowUS int64, burst, rate float64) float64 {
	if !f.hasBurst {
		if rate > 0 {
			return burst * f.holds(nowUS) / rate
		}
		return 0
	}
	return f.holdsOf(nowUS, f.grantedB, f.runningB)
}

// claimSlackUS is how long before its end a running grant is no longer
// counted by holds. An instance states how much longer it runs a grant, so
// Redis counts it until a little after it truly ends -- by the time the
// request took to reach Redis, less the time the grant's own request took:
// microseconds, which may overlap what another instance was granted once
// the grant's lease ran out in Redis. That is Redis erring on the safe side
// for a moment, not an instance running more than the rate (the check on
// what the instances run is exact).
const claimSlackUS = 1000

// holds is what the instance may be running at server time nowUS.
func (f leaseField) holds(nowUS int64) float64 { return f.holdsOf(nowUS, f.granted, f.running) }

// holdsOf is what the instance may hold at server time nowUS of something
// granted and, until runningUS, running: its rate or its part of the burst.
func (f leaseField) holdsOf(nowUS int64, granted, running float64) float64 {
	h := 0.0
	if f.expiryUS > nowUS {
		h = granted
	}
	if f.runningUS > nowUS+claimSlackUS {
		h = max(h, running)
	}
	return h
}

// parseLeaseField parses one i:<instance> value of the lease hash.
func parseLeaseField(v string) (leaseField, error) {
	var f leaseField
	if head, tail, ok := strings.Cut(v, " | "); ok {
		bs := strings.Fields(tail)
		if len(bs) != 3 {
			return leaseField{}, fmt.Errorf("%q: want 3 burst fields", v)
		}
		var errs [3]error
		f.grantedB, errs[0] = strconv.ParseFloat(bs[0], 64)
		f.wantB, errs[1] = strconv.ParseFloat(bs[1], 64)
		f.runningB, errs[2] = strconv.ParseFloat(bs[2], 64)
		if err := errors.Join(errs[:]...); err != nil {
			return leaseField{}, err
		}
		f.hasBurst, v = true, head
	}
	fs := strings.Fields(v)
	if len(fs) != 3 && len(fs) != 5 && len(fs) != 6 {
		return leaseField{}, fmt.Errorf("%q: want 3, 5 or 6 fields", v)
	}
	var errs [5]error
	f.granted, errs[0] = strconv.ParseFloat(fs[0], 64)
	f.want, errs[1] = strconv.ParseFloat(fs[1], 64)
	f.expiryUS, errs[2] = strconv.ParseInt(fs[2], 10, 64)
	if len(fs) >= 5 {
		f.running, errs[3] = strconv.ParseFloat(fs[3], 64)
		f.runningUS, errs[4] = strconv.ParseInt(fs[4], 10, 64)
	}
	return f, errors.Join(errs[:]...)
}

// snapshotScript reads a lease hash and the server time in one step, so
// that whether a lease is live is judged at the instant it was read.
var snapshotScript = redis.NewScript(`
local t = redis.call('TIME')
return {t[1], t[2], redis.call('HGETALL', KEYS[1])}`)

// hashState is a lease hash as read in one step with the server time.
type hashState struct {
	now    int64                 // server time, us
	leases map[string]leaseField // by instance
	exact  map[string]int64      // exact users' record expiry (us), by instance
	pool   string                // the pool, "" if none
	credit map[string]string     // exact users' credit, "tokens until_us", by instance
	lost   int64                 // until when Redis lost leases, 0 if not
	queue  string                // the latest turn handed out, "at_us instance", "" if none
	wait   map[string]int64      // when instances that released a lower record may run their default share (us), by instance
}

// readHash reads the hash at key and the server time in one step.
func readHash(rdb *redis.Client, key string) (hashState, error) {
	v, err := snapshotScript.Run(context.Background(), rdb, []string{key}).Slice()
	if err != nil {
		return hashState{}, err
	}
	if len(v) != 3 {
		return hashState{}, fmt.Errorf("snapshot: %v", v)
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
	us, err2 := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return hashState{}, err
	}
	kv, _ := v[2].([]any)
	h := hashState{now: sec*1_000_000 + us, leases: map[string]leaseField{}, exact: map[string]int64{}, credit: map[string]string{},
		wait: map[string]int64{}}
	for i := 0; i+1 < len(kv); i += 2 {
		id, val := fmt.Sprint(kv[i]), fmt.Sprint(kv[i+1])
		switch {
		case id == "p":
			h.pool = val
		case id == "lost":
			h.lost, err = strconv.ParseInt(val, 10, 64)
		case id == "q":
			h.queue = val
		case strings.HasPrefix(id, "c:"):
			h.credit[id[2:]] = val
		case strings.HasPrefix(id, "x:"):
			// "expiry_us", or "expiry_us clean_us".
			e, _, _ := strings.Cut(val, " ")
			h.exact[id[2:]], err = strconv.ParseInt(e, 10, 64)
		case strings.HasPrefix(id, "w:"):
			h.wait[id[2:]], err = strconv.ParseInt(val, 10, 64)
		case strings.HasPrefix(id, "i:"):
			h.leases[id[2:]], err = parseLeaseField(val)
		default:
			err = fmt.Errorf("want i:, x:, w:, c:, p, q or lost")
		}
		if err != nil {
			return hashState{}, fmt.Errorf("lease hash field %s=%q: %w", id, val, err)
		}
	}
	return h, nil
}

// snapshot returns the instances' leases at key and the server time (us)
// at which they were read.
func snapshot(rdb *redis.Client, key string) (map[string]leaseField, int64, error) {
	h, err := readHash(rdb, key)
	return h.leases, h.now, err
}

// readLeases reads the lease hash at key back from Redis and parses it.
func readLeases(t *testing.T, rdb *redis.Client, key string) map[string]leaseField {
	t.Helper()
	out, _, err := snapshot(rdb, key)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return out
}

// heldSum is the sum of what the instances of the lease hash at key may be
// running, read in one step with the server time; the lease invariant is
// that it never exceeds the rate.
func heldSum(rdb *redis.Client, key string) (float64, error) {
	fields, now, err := snapshot(rdb, key)
	if err != nil {
		return 0, err
	}
	sum := 0.0
	for _, f := range fields {
		if f.granted < 0 || f.running < 0 {
			return math.Inf(1), fmt.Errorf("negative grant in %+v", f)
		}
		sum += f.holds(now)
	}
	return sum, nil
}

// checkSum fails the test if what the instances of key may be running adds
// up to more than rate. The tolerance covers only floating-point rounding.
func checkSum(t *testing.T, rdb *redis.Client, key string, rate float64, when string) {
	t.Helper()
	sum, err := heldSum(rdb, key)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	if sum > rate*(1+1e-12)+1e-12 {
		t.Fatalf("%s: sum of live grants %v exceeds rate %v", when, sum, rate)
	}
}

// waterFill is the reference max-min fair split of rate over wants.
func waterFill(rate float64, wants []float64) []float64 {
	idx := make([]int, len(wants))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return wants[idx[a]] < wants[idx[b]] })
	alloc := make([]float64, len(wants))
	left := rate
	for k, i := range idx {
		share := left / float64(len(idx)-k)
		if wants[i] > share {
			for _, j := range idx[k:] {
				alloc[j] = share
			}
			break
		}
		alloc[i] = wants[i]
		left -= wants[i]
	}
	return alloc
}

// fairSplit is what the lease script counts as each instance's fair share
// when all n instances have asked with the given wants: the max-min fair
// split when the wants exceed rate; otherwise each want plus an n-th of
// what nobody wants, but at least the default share rate/n while that much
// is free beside the others' wants. A want of 0 (a release) is granted 0.
func fairSplit(rate float64, wants []float64, n int) []float64 {
	sum := 0.0
	for _, w := range wants {
		sum += w
	}
	if sum > rate {
		return waterFill(rate, wants)
	}
	out := make([]float64, len(wants))
	for i, w := range wants {
		if w > 0 {
			left := rate - sum
			out[i] = max(w+left/float64(max(n, len(wants))), min(rate/float64(n), w+left))
		}
	}
	return out
}

func approx(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// eventually polls cond every 5ms until it holds, failing the test after 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}
