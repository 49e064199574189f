package global_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// placement is where a simulated instance decides a key.
type placement int

const (
	placeShare  placement = iota // its default share, rate/n, no record asked for
	placeLease                   // a lease (or a yield), run is what it runs
	placeExact                   // the pool: nothing locally
	placeReturn                  // released: nothing until back, then its share
)

// simKey is one simulated instance's state on one key.
type simKey struct {
	place placement
	run   float64   // placeLease: what it runs until until
	runB  float64   // placeLease: the part of the burst it runs until until (bursts counted)
	until time.Time // placeLease: when run ends; placeReturn: when it is back (zero: not yet known)
}

// runs is what the instance runs at now, with default share def.
func (s simKey) runs(now time.Time, def float64) float64 { return s.runsOf(now, def, s.run) }

// runsOf is what the instance runs at now of something whose default is
// def and whose lease gives it lease: its rate or its part of the burst.
func (s simKey) runsOf(now time.Time, def, lease float64) float64 {
	switch s.place {
	case placeShare:
		return def
	case placeLease:
		if s.until.After(now) {
			return lease
		}
	case placeReturn:
		if !s.until.IsZero() && !s.until.After(now) {
			return def
		}
	}
	return 0
}

// poolRate is the rate of the pool of the hash h for n instances: what the
// leases and the unrecorded instances (none with exact bursts) leave. It is
// there even when no instance is exact: a take that keeps its instance's
// lease (ExactRequest.KeepLease) draws from it without an exact record.
func poolRate(h hashState, rate float64, n int, exactBursts bool) float64 {
	recorded := map[string]bool{}
	held := 0.0
	for id, f := range h.leases {
		if max(f.expiryUS, f.runningUS) > h.now {
			recorded[id] = true
		}
		if f.expiryUS > h.now {
			held += f.granted
		}
		if f.runningUS > h.now && f.running > f.granted*boolFloat(f.expiryUS > h.now) {
			held += f.running - f.granted*boolFloat(f.expiryUS > h.now)
		}
	}
	for id, e := range h.exact {
		if e > h.now {
			recorded[id] = true
		}
	}
	unrecorded := max(0, n-len(recorded))
	if exactBursts {
		unrecorded = 0
	}
	return max(0, rate-held-float64(unrecorded)*rate/float64(n))
}

// runsBurst is the part of the burst the instance runs at now, with
// default part defB.
func (s simKey) runsBurst(now time.Time, defB float64) float64 { return s.runsOf(now, defB, s.runB) }

// defaultBurst is the default part of a burst of burst of the instance
// named id ("w<worker>-i<i>") among n, by its rank worker*perWorker+i:
// burst/n rounded down, and one token of the remainder for the lowest
// ranks, as hybrid's ranks hand them out.
func defaultBurst(id string, burst, n, perWorker int) float64 {
	var w, i int
	if _, err := fmt.Sscanf(id, "w%d-i%d", &w, &i); err != nil {
		panic(err)
	}
	b := burst / n
	if w*perWorker+i < burst%n {
		b++
	}
	return float64(b)
}

// poolBurst is the burst of the pool of the hash h: what the leases (their
// parts of the burst, see leaseField.holdsBurst, counted until their
// running claims end as Redis counts them) and the unrecorded instances
// (burst/n each, and the remainder tokens their ranks may give them; none
// with exact bursts) leave.
func poolBurst(h hashState, burst, rate float64, n int, exactBursts bool) float64 {
	recorded := map[string]bool{}
	held := 0.0
	for id, f := range h.leases {
		if max(f.expiryUS, f.runningUS) > h.now {
			recorded[id] = true
		}
		g := f
		g.runningUS += claimSlackUS // holdsBurst counts a claim until claimSlackUS before its end; Redis, to its end
		held += g.holdsBurst(h.now, burst, rate)
	}
	for id, e := range h.exact {
		if e > h.now {
			recorded[id] = true
		}
	}
	unrecorded := float64(max(0, n-len(recorded)))
	if exactBursts {
		unrecorded = 0
	}
	frac := max(0, min(1, (float64(n)-unrecorded)/float64(n)-held/burst))
	rem := float64(int(burst) % n)
	extra := min(unrecorded, rem) - unrecorded*rem/float64(n)
	return max(0, burst*frac-extra)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// TestPoolRandomInvariant: simulated instances move at random between
// their default share, leases, yields, releases and exact takes, and lose
// a quarter of the lease answers; each lowers what it runs before it asks,
// and raises it only on an answer. Some exact takes keep the instance's
// lease (KeepLease), as a take on its way when the instance's lease
// request overtook it, with the grant perhaps already in force. At every
// step, what the instances run on a key plus the rate of its pool is at
// most the key's rate. With the burst counted apart (LeaseRequest.Burst),
// the instances ask for random parts of it, and the parts they run plus
// the pool's burst are at most the burst. With exact bursts no instance
// runs its default share unasked (one that has not acted, or released,
// runs nothing) and Redis counts an exact user at its measured demand.
func TestPoolRandomInvariant(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	for _, tc := range []struct {
		name        string
		burst       int
		exactBursts bool
	}{
		{"burst=proportional", 0, false},
		{"burst=counted", poolBurstSize, false},
		{"burst=exact", poolBurstSize, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb.FlushAll(context.Background())
			poolRandomInvariant(t, rdb, tc.burst, tc.exactBursts)
		})
	}
}

// poolBurstSize is the burst of the keys of TestPoolRandomInvariant.
const poolBurstSize = 10

// poolRandomInvariant is TestPoolRandomInvariant with the burst counted
// apart if burst is above zero, for a limit with exact bursts if
// exactBursts.
func poolRandomInvariant(t *testing.T, rdb *redis.Client, burst int, exactBursts bool) {
	store := global.New(rdb, "")
	const (
		workers   = 3
		perWorker = 2 // instances
		n         = workers * perWorker
		calls     = 300
		keys      = 2
	)
	rates := [keys]float64{10, 0.5}
	var mu sync.Mutex // guards sim, and orders each check after the updates before it
	sim := map[[2]string]simKey{}
	var wg sync.WaitGroup
	var failed atomic.Bool
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for c := 0; c < calls && !failed.Load(); c++ {
				k := rng.IntN(keys)
				key, rate := fmt.Sprint(k), rates[k]
				id := [2]string{fmt.Sprintf("w%d-i%d", w, rng.IntN(perWorker)), key}
				ttl := time.Duration(1+rng.IntN(200)) * time.Millisecond
				if err := simStep(rng, store, &mu, sim, id, rate, n, ttl, burst, perWorker, exactBursts); err != nil {
					t.Errorf("worker %d call %d: %v", w, c, err)
					failed.Store(true)
					return
				}
				if err := checkPool(rdb, store, &mu, sim, key, rate, n, burst, perWorker, exactBursts); err != nil {
					t.Errorf("worker %d call %d: %v", w, c, err)
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
}

// simStep makes instance id do one random thing on its key.
func simStep(rng *rand.Rand, store *global.Store, mu *sync.Mutex, sim map[[2]string]simKey, id [2]string, rate float64, n int, ttl time.Duration, burst, perWorker int, exactBursts bool) error {
	ctx := context.Background()
	def := rate / float64(n)
	// What it runs of its default share and burst part where it may run
	// them: none with exact bursts.
	runDef, runDefB := def, defaultBurst(id[0], burst, n, perWorker)
	if exactBursts {
		runDef, runDefB = 0, 0
	}
	mu.Lock()
	s := sim[id]
	now := time.Now()
	if s.place == placeReturn && !s.until.IsZero() && !s.until.After(now) {
		s = simKey{place: placeShare}
	}
	cur, curB := s.runs(now, runDef), s.runsBurst(now, runDefB)
	if burst == 0 {
		curB = 0
	}
	req := global.LeaseRequest{Limit: "pool", Key: id[1], Instance: id[0], Rate: rate, Instances: n,
		TTL: ttl, MaxTTL: 200 * time.Millisecond, Burst: burst, ExactBursts: exactBursts}
	switch op := rng.IntN(10); {
	case op < 4: // lease: says what it runs, held if a grant
		req.Want = rng.Float64() * 2 * rate
		if burst > 0 {
			req.WantBurst = rng.Float64() * float64(burst)
		}
		if cur > 0 || curB > 0 {
			req.Running, req.RunningBurst, req.Held = cur, curB, s.place == placeLease
			req.RunningFor = ttl
			if s.place == placeLease {
				req.RunningFor = s.until.Sub(now)
			}
			s = simKey{place: placeLease, run: cur, runB: curB, until: now.Add(req.RunningFor)}
		} else {
			s = simKey{place: placeLease}
		}
	case op < 6: // yield: lowers what it runs first
		req.Want, req.Yield = rng.Float64()*def, true
		if rng.IntN(3) == 0 {
			req.Want = 0
		}
		low, lowB := min(cur, req.Want), 0.0
		if burst > 0 {
			lowB = min(curB, rng.Float64()*defaultBurst(id[0], burst, n, perWorker))
			req.WantBurst, req.RunningBurst = lowB, lowB
		}
		if low > 0 || lowB > 0 {
			req.Running, req.Held, req.RunningFor = low, s.place == placeLease, ttl
			if s.place == placeLease {
				req.RunningFor = s.until.Sub(now)
			}
		}
		s = simKey{place: placeLease, run: low, runB: lowB, until: now.Add(req.RunningFor)}
	case op < 8: // release: stops first, back once the answer says so
		sim[id] = simKey{place: placeReturn}
		mu.Unlock()
		out := make([]global.Lease, 1)
		if err := store.Lease(ctx, []global.LeaseRequest{req}, out); err != nil || out[0].Err != nil {
			return fmt.Errorf("release: %v %v", err, out[0].Err)
		}
		mu.Lock()
		sim[id] = simKey{place: placeReturn, until: out[0].Expires}
		mu.Unlock()
		return nil
	default: // exact: stops its lease first, or keeps it
		keep := rng.IntN(2) == 0
		if !keep || s.place != placeLease {
			// A take that keeps a lease it runs is one sent before the
			// lease request, landing after it; otherwise the instance
			// decides exactly and runs nothing locally.
			sim[id] = simKey{place: placeExact}
		}
		mu.Unlock()
		_, err := store.TakeExact(ctx, global.ExactRequest{Limit: "pool", Key: id[1], Instance: id[0], Rate: rate,
			Burst: poolBurstSize, Instances: req.Instances, N: rng.IntN(3), TTL: ttl, KeepLease: keep,
			ExactBursts: exactBursts})
		return err
	}
	sim[id] = s
	mu.Unlock()
	out := make([]global.Lease, 1)
	if err := store.Lease(ctx, []global.LeaseRequest{req}, out); err != nil || out[0].Err != nil {
		return fmt.Errorf("lease %+v: %v %v", req, err, out[0].Err)
	}
	if out[0].Granted < 0 || out[0].Granted > rate*(1+1e-12) || (req.Yield && out[0].Granted > req.Want*(1+1e-12)) ||
		(burst > 0) != (out[0].Burst >= 0) || out[0].Burst > float64(burst)*(1+1e-12) {
		return fmt.Errorf("lease %+v = %+v", req, out[0])
	}
	if rng.IntN(4) != 0 {
		// The answer arrived: the grant is in force from now until a TTL
		// after the request went out.
		mu.Lock()
		sim[id] = simKey{place: placeLease, run: out[0].Granted, runB: max(0, out[0].Burst), until: now.Add(ttl)}
		mu.Unlock()
	}
	return nil
}

// checkPool reads key's hash and checks, in one step with the simulated
// instances, that what they run plus the pool's rate is at most rate.
// With burst above zero, it checks the same of the parts of the burst.
func checkPool(rdb *redis.Client, store *global.Store, mu *sync.Mutex, sim map[[2]string]simKey, key string, rate float64, n, burst, perWorker int, exactBursts bool) error {
	mu.Lock()
	defer mu.Unlock()
	h, err := readHash(rdb, store.LeaseKey("pool", key))
	if err != nil {
		return err
	}
	now := time.Now()
	// The default share and burst parts an instance may run without
	// asking: none with exact bursts.
	def := rate / float64(n)
	defB := func(inst string) float64 { return defaultBurst(inst, burst, n, perWorker) }
	if exactBursts {
		def, defB = 0, func(string) float64 { return 0 }
	}
	runs := 0.0
	var who []string
	for id, s := range sim {
		if id[1] == key {
			r := s.runs(now, def)
			runs += r
			who = append(who, fmt.Sprintf("%s:%d/%.3g", id[0], s.place, r))
		}
	}
	// Instances that have not acted yet run their default share.
	runs += float64(n-len(who)) * def
	pool := poolRate(h, rate, n, exactBursts)
	if runs+pool > rate*(1+1e-9)+1e-9 {
		return fmt.Errorf("key %s: the instances run %v and the pool %v, above the rate %v: %s; hash %+v",
			key, runs, pool, rate, strings.Join(who, " "), h)
	}
	if burst == 0 {
		return nil
	}
	runsB := 0.0
	who = who[:0]
	for w := range n / perWorker {
		for i := range perWorker {
			inst := fmt.Sprintf("w%d-i%d", w, i)
			s, ok := sim[[2]string{inst, key}]
			if !ok {
				s = simKey{place: placeShare} // has not acted yet
			}
			b := s.runsBurst(now, defB(inst))
			runsB += b
			who = append(who, fmt.Sprintf("%s:%d/%.3g", inst, s.place, b))
		}
	}
	poolB := poolBurst(h, float64(burst), rate, n, exactBursts)
	if runsB+poolB > float64(burst)*(1+1e-9)+1e-9 {
		return fmt.Errorf("key %s: the instances run bursts of %v and the pool %v, above the burst %v: %s; hash %+v",
			key, runsB, poolB, burst, strings.Join(who, " "), h)
	}
	return nil
}
