package global_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestTakePoolFreshBurst: the pool of a fresh key is full, so a client's
// burst of up to Burst is admitted whole; the next take is denied with a
// turn, and a take larger than the burst never fits.
func TestTakePoolFreshBurst(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	const rate, burst = 1.0, 10
	take := func(inst string, n int) global.Take {
		t.Helper()
		tk, err := store.TakePool(ctx, global.PoolTake{Limit: "fresh", Key: "k", Instance: inst, Gen: 1, Rate: rate,
			Burst: burst, Instances: 4, N: n, TTL: time.Minute, Asked: int64(n)})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	if tk := take("a", burst+1); tk.Allowed || tk.RetryAfter != global.Never {
		t.Errorf("a take of burst+1 = %+v, want Never", tk)
	}
	tk := take("a", burst)
	if !tk.Allowed || tk.Remaining != 0 || tk.PoolRate != rate || tk.PoolBurst != burst {
		t.Fatalf("the whole burst on a fresh key = %+v, want it admitted", tk)
	}
	// It emptied the pool: its next take waits a refill, a second.
	if tk.Turn < 990*time.Millisecond || tk.Turn > time.Second {
		t.Errorf("Turn %v after emptying the pool, want about 1s", tk.Turn)
	}
	tk = take("b", 1)
	// Told when the pool would hold its token, a second; its turn is the
	// one after a's, one refill later.
	if tk.Allowed || tk.RetryAfter < 990*time.Millisecond || tk.RetryAfter > time.Second ||
		tk.Turn <= time.Second || tk.Turn > 2*time.Second {
		t.Errorf("the next take = %+v, want a denial told about 1s, its turn about 2s", tk)
	}
	if tk := take("c", 0); !tk.Allowed {
		t.Errorf("a take of 0 = %+v, want it allowed", tk)
	}
}

// TestTakePoolGens: a take older than (or as old as) the instance's lease
// keeps it and counts it; a newer take replaces it with an exact record,
// and the lease's rate goes to the pool at once; a take older than an
// exact record leaves it alone but takes from the pool; generations wrap.
func TestTakePoolGens(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate = 10.0
	lease := func(key string, gen uint8) {
		t.Helper()
		// Alone, wanting the whole rate: granted it.
		if g := ask(t, store, global.LeaseAsk{Limit: "gens", Key: key, Instance: "a", Gen: gen, Want: rate, Rate: rate,
			Burst: 10, Instances: 2, TTL: time.Minute}); !approx(g.Granted, rate) {
			t.Fatalf("ask = %+v", g)
		}
	}
	take := func(key string, gen uint8, n int) global.Take {
		t.Helper()
		tk, err := store.TakePool(ctx, global.PoolTake{Limit: "gens", Key: key, Instance: "a", Gen: gen, Rate: rate,
			Burst: 10, Instances: 2, N: n, TTL: time.Minute, Asked: int64(n)})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	rec := func(key string) record {
		t.Helper()
		return readPlacement(t, rdb, store.RecordKey("gens", key)).records["a"]
	}

	lease("k", 5)
	for _, gen := range []uint8{4, 5} {
		// Sent before the lease was asked for, or in the placement that
		// asked for it: the instance may run the lease.
		if tk := take("k", gen, 0); tk.PoolRate != 0 || tk.PoolBurst != 0 {
			t.Errorf("take at gen %d beside a lease of gen 5 = %+v, want the lease counted: an empty pool", gen, tk)
		}
		if r := rec("k"); !r.lease || r.gen != 5 {
			t.Errorf("after a take at gen %d: %+v, want the lease of gen 5 kept", gen, r)
		}
	}
	if tk := take("k", 6, 1); !approx(tk.PoolRate, rate) || !approx(tk.PoolBurst, 10) || tk.Allowed {
		t.Errorf("take at gen 6 = %+v, want the whole rate back in the pool (still empty)", tk)
	}
	if r := rec("k"); r.lease || r.gen != 6 {
		t.Errorf("after a take at gen 6: %+v, want an exact record of gen 6", r)
	}

	// A stale take leaves the exact record alone but takes from the pool.
	lease("s", 1)
	take("s", 2, 0) // the lease is dropped: an exact record, an empty pool
	eventually(t, "the pool to refill a token", func() bool { return take("s", 2, 0).Remaining >= 2 })
	before := readPlacement(t, rdb, store.RecordKey("gens", "s")).raw["i:a"]
	if tk := take("s", 1, 1); !tk.Allowed {
		t.Errorf("stale take = %+v, want it to take from the pool", tk)
	}
	if after := readPlacement(t, rdb, store.RecordKey("gens", "s")).raw["i:a"]; after != before {
		t.Errorf("a stale take rewrote the record: %q, then %q", before, after)
	}

	// Around the wrap: 3 is newer than 250, 249 older than 3.
	lease("w", 250)
	if tk := take("w", 3, 0); !approx(tk.PoolRate, rate) {
		t.Errorf("take at gen 3 beside a lease of gen 250 = %+v, want the lease dropped", tk)
	}
	if r := rec("w"); r.lease || r.gen != 3 {
		t.Errorf("after a take at gen 3: %+v, want an exact record of gen 3", r)
	}
	take("w", 249, 0)
	if r := rec("w"); r.gen != 3 {
		t.Errorf("after a take at gen 249: %+v, want the record of gen 3 kept", r)
	}
}

// TestTakePoolDemand: an exact record starts at the demand of its take's
// tokens; a later take adds what Asked grew by since (not less than
// nothing, and a smaller Asked does not move it back), in a newer
// generation too (the instance counts Asked per key); a take that replaces
// the instance's lease starts at that lease's want.
func TestTakePoolDemand(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	take := func(gen uint8, n int, asked int64) record {
		t.Helper()
		if _, err := store.TakePool(context.Background(), global.PoolTake{Limit: "d", Key: "k", Instance: "a", Gen: gen,
			Rate: 100, Burst: 100, Instances: 2, N: n, TTL: time.Minute, Asked: asked}); err != nil {
			t.Fatal(err)
		}
		return readPlacement(t, rdb, store.RecordKey("d", "k")).records["a"]
	}
	decayed := func(prev, r record) float64 {
		return prev.demand * math.Exp(-float64(r.atUS-prev.atUS)/1e6)
	}
	r := take(1, 1, 1)
	if r.demand != 1 || r.asked != 1 || r.gen != 1 {
		t.Errorf("a new record: %+v, want demand 1, asked 1", r)
	}
	prev, r := r, take(1, 1, 51)
	if !approx(r.demand, decayed(prev, r)+50) || r.asked != 51 {
		t.Errorf("asked 1 -> 51: %+v after %+v, want 50 more than the decayed demand", r, prev)
	}
	prev, r = r, take(1, 1, 40)
	if !approx(r.demand, decayed(prev, r)) || r.asked != 51 {
		t.Errorf("asked 51 -> 40 (reordered): %+v after %+v, want the demand decayed, asked kept at 51", r, prev)
	}
	prev, r = r, take(2, 3, 60)
	if !approx(r.demand, decayed(prev, r)+9) || r.asked != 60 || r.gen != 2 {
		t.Errorf("a newer generation, asked 51 -> 60: %+v after %+v, want 9 more than the decayed demand", r, prev)
	}
	g := make([]global.LeaseGrant, 1)
	if err := store.AskLeases(context.Background(), []global.LeaseAsk{{Limit: "d", Key: "k", Instance: "a", Gen: 3, Want: 42,
		Rate: 100, Burst: 100, Instances: 2, TTL: time.Minute}}, g); err != nil || g[0].Err != nil {
		t.Fatal(err, g[0].Err)
	}
	if r := take(4, 1, 70); r.demand != 42 || r.asked != 70 || r.gen != 4 || r.lease {
		t.Errorf("replacing a lease that wanted 42: %+v, want an exact record at demand 42, asked 70", r)
	}
}

// TestTakePoolTurns: callers denied one after another are told to come
// back one refill apart, in the order they were denied, rather than all
// when the next token is there; each that comes back at its turn is
// admitted; and no turn is handed out more than N-hat refills ahead.
func TestTakePoolTurns(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	// A token every 100 ms. A burst of 4 keeps the tokens that refill while
	// a caller that came back late takes its own.
	const rate, burst, n = 10.0, 4, 4
	const stepUS = int64(1e6 / rate)
	asked := map[string]int64{}
	take := func(inst string, tokens int) global.Take {
		t.Helper()
		asked[inst] += int64(tokens)
		tk, err := store.TakePool(ctx, global.PoolTake{Limit: "turns", Key: "k", Instance: inst, Gen: 1, Rate: rate,
			Burst: burst, Instances: n, N: tokens, TTL: 10 * time.Second, Asked: asked[inst]})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	// turn is the latest turn handed out, in server time (us), and whose.
	turn := func() (int64, string) {
		t.Helper()
		var at int64
		var by string
		q := readPlacement(t, rdb, store.RecordKey("turns", "k")).queue
		if _, err := fmt.Sscanf(q, "%d %s", &at, &by); err != nil {
			t.Fatalf("q = %q: %v", q, err)
		}
		return at, by
	}
	tk := take("a", burst)
	if !tk.Allowed || tk.Turn <= 0 {
		t.Fatalf("the first take empties a full pool: %+v, want allowed with a turn", tk)
	}
	last, _ := turn()
	insts := []string{"b", "c", "d"}
	when := map[string]time.Time{}
	for _, inst := range insts {
		tk := take(inst, 1)
		at, by := turn()
		if tk.Allowed || by != inst || at != last+stepUS {
			t.Fatalf("%s: %+v, turn %d for %s: want a denial and the turn a refill after %d", inst, tk, at, by, last)
		}
		last = at
		when[inst] = time.Now().Add(tk.Turn)
	}
	for range 3 * n {
		// a's turn, then b's, c's and d's: e's is at most N-hat refills
		// after the tokens would be there, which is what it is told.
		if tk := take("e", 1); tk.Allowed || tk.Turn > time.Duration(n+1)*time.Duration(stepUS)*time.Microsecond ||
			tk.RetryAfter > time.Duration(stepUS)*time.Microsecond {
			t.Fatalf("e: %+v: want a denial within %d refills", tk, n+1)
		}
	}
	for _, inst := range insts {
		time.Sleep(time.Until(when[inst])) // its turn: the time Redis named, not a synchronisation
		if tk := take(inst, 1); !tk.Allowed {
			t.Errorf("%s came back at its turn and was denied: %+v", inst, tk)
		}
	}
}

// TestTakePoolExpiry: the hash lives until the exact record ends and the
// pool would be full again, then disappears, and the key is fresh again.
func TestTakePoolExpiry(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	// The pool refills 30 tokens in 300 ms; the record lives 100 ms.
	take := func() global.Take {
		t.Helper()
		tk, err := store.TakePool(ctx, global.PoolTake{Limit: "exp", Key: "k", Instance: "a", Gen: 1, Rate: 100,
			Burst: 30, Instances: 1, N: 30, TTL: 100 * time.Millisecond, Asked: 30})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	if tk := take(); !tk.Allowed {
		t.Fatalf("take = %+v", tk)
	}
	key := store.RecordKey("exp", "k")
	h := readPlacement(t, rdb, key)
	if at, want := expiresAt(t, rdb, key), (h.poolAt+300_000+999)/1000; h.tokens != 0 || at != want {
		t.Errorf("the hash expires at %d, want %d: when the pool %+v is full", at, want, h)
	}
	eventually(t, "the hash to expire", func() bool { return rdb.Exists(ctx, key).Val() == 0 })
	if tk := take(); !tk.Allowed {
		t.Errorf("take on the expired key = %+v, want a full pool", tk)
	}
}

func TestTakePoolInvalid(t *testing.T) {
	ok := global.PoolTake{Limit: "l", Key: "k", Instance: "a", Gen: 1, Rate: 10, Burst: 5, Instances: 2, N: 1, TTL: time.Second}
	tests := []struct {
		name string
		edit func(*global.PoolTake)
	}{
		{"empty instance", func(r *global.PoolTake) { r.Instance = "" }},
		{"gen 0", func(r *global.PoolTake) { r.Gen = 0 }},
		{"zero rate", func(r *global.PoolTake) { r.Rate = 0 }},
		{"NaN rate", func(r *global.PoolTake) { r.Rate = nan() }},
		{"infinite rate", func(r *global.PoolTake) { r.Rate = inf() }},
		{"zero burst", func(r *global.PoolTake) { r.Burst = 0 }},
		{"zero instances", func(r *global.PoolTake) { r.Instances = 0 }},
		{"negative n", func(r *global.PoolTake) { r.N = -1 }},
		{"ttl below a microsecond", func(r *global.PoolTake) { r.TTL = time.Nanosecond }},
		{"negative asked", func(r *global.PoolTake) { r.Asked = -1 }},
		{"asked above 2^53", func(r *global.PoolTake) { r.Asked = 1<<53 + 1 }},
	}
	store := global.New(noNetwork{}, "") // any network call panics
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.edit(&r)
			if _, err := store.TakePool(context.Background(), r); !errors.Is(err, global.ErrInvalid) ||
				!strings.HasPrefix(err.Error(), `global: take "k":`) {
				t.Errorf("TakePool(%+v) error = %v, want ErrInvalid", r, err)
			}
		})
	}
}

// TestTakePoolValidatedByLua: the script rejects what TakePool would not
// send, with an error reply.
func TestTakePoolValidatedByLua(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	good := []string{"a", "1", "10", "1", "2", "1000", "1", "1"}
	for i, bad := range map[int]string{0: "", 1: "256", 2: "0", 3: "0.5", 4: "0", 5: "0", 6: "-1", 7: "inf"} {
		args := make([]any, len(good))
		for j, v := range good {
			args[j] = v
		}
		args[i] = bad
		err := rdb.Eval(context.Background(), scriptSource(t, "take.lua"), []string{"v"}, args...).Err()
		if err == nil || !strings.Contains(err.Error(), "invalid take arguments") {
			t.Errorf("ARGV[%d] = %q: %v, want invalid take arguments", i+1, bad, err)
		}
	}
}

func TestTakePoolNoScript(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	for i := range 3 {
		srv.ScriptFlush(t)
		tk, err := store.TakePool(context.Background(), global.PoolTake{Limit: "ns", Key: "k", Instance: "a", Gen: 1,
			Rate: 0.01, Burst: 5, Instances: 1, N: 1, TTL: time.Minute, Asked: int64(i + 1)})
		if err != nil || !tk.Allowed || tk.Remaining != int64(4-i) {
			t.Fatalf("TakePool after SCRIPT FLUSH = %+v, %v; want allowed, remaining %d", tk, err, 4-i)
		}
	}
	if st := srv.CommandStats(t); st["eval"] != 3 {
		t.Errorf("EVAL calls = %d, want 3 (one fallback per flush)", st["eval"])
	}
}

// simPlace is where a simulated instance decides a key.
type simPlace int

const (
	simIdle   simPlace = iota // no record: runs nothing
	simExact                  // takes from the pool, runs nothing locally
	simAsking                 // exact, with an ask for a lease out
	simLeased                 // runs run until until
)

// simInstance is one simulated instance of a key.
type simInstance struct {
	id    string
	gen   uint8
	place simPlace
	run   float64   // simLeased: the grant it runs until until
	until time.Time // simLeased
	asked int64
	// credit is the id of the last credit it was handed.
	credit uint32
	// pending is the answer to its latest ask, on its way: it is heard at
	// a later step if the instance is still where it asked from.
	pending *simAnswer
}

// simAnswer is the answer to an ask, not heard yet.
type simAnswer struct {
	gen     uint8
	granted float64
	until   time.Time // the ask's time plus its TTL
}

// hear applies the answer a, if the instance is still in the generation
// it asked in: an asking instance becomes leased, a leased one runs its
// new grant.
func (s *simInstance) hear(a simAnswer) {
	if s.gen != a.gen || (s.place != simAsking && s.place != simLeased) {
		return
	}
	if s.place == simAsking {
		s.bump()
	}
	s.place, s.run, s.until = simLeased, a.granted, a.until
}

// bump moves the instance to its next generation, skipping 0.
func (s *simInstance) bump() {
	s.gen++
	if s.gen == 0 {
		s.gen = 1
	}
}

// runs is what s runs at now: its grant while it lasts, counted until
// claimSlack before its end, which the clocks of Go and Redis may differ
// by.
func (s *simInstance) runs(now time.Time) float64 {
	const claimSlack = time.Millisecond
	if s.place == simLeased && s.until.After(now.Add(claimSlack)) {
		return s.run
	}
	return 0
}

// simMsg is a message held back in the network: it lands once its
// instance has moved to a later generation, out of order.
type simMsg struct {
	inst *simInstance
	gen  uint8
	ask  *global.LeaseAsk
	take *global.PoolTake
}

// TestTakePoolRefillsAtTheSizeItHad: a lease holding the whole rate leaves
// an empty pool; a take that drops the lease gets the pool's rate back
// from then on, not for the time the lease held it.
func TestTakePoolRefillsAtTheSizeItHad(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	const rate = 1000.0 // a token a millisecond
	take := func(gen uint8) global.Take {
		t.Helper()
		tk, err := store.TakePool(context.Background(), global.PoolTake{Limit: "size", Key: "k", Instance: "a", Gen: gen,
			Rate: rate, Burst: 100, Instances: 1, N: 1, TTL: time.Minute, Asked: 1})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	if g := ask(t, store, global.LeaseAsk{Limit: "size", Key: "k", Instance: "a", Gen: 1, Want: rate, Rate: rate,
		Burst: 100, Instances: 1, TTL: time.Minute}); !approx(g.Granted, rate) {
		t.Fatalf("ask = %+v", g)
	}
	if tk := take(1); tk.Allowed || tk.PoolRate != 0 {
		t.Fatalf("take beside the lease = %+v, want an empty pool", tk)
	}
	time.Sleep(20 * time.Millisecond) // time the lease holds the rate: 20 tokens had it been the pool's
	if tk := take(2); tk.Allowed || tk.PoolRate != rate || tk.Remaining != 0 {
		t.Errorf("take dropping the lease = %+v, want the whole rate, and no token yet", tk)
	}
}

// TestPlacementRandomInvariant: four simulated instances move at random
// between no record, exact takes, asking for a lease, leases renewed,
// dropped for the exact placement or released, at generations moving
// forward (wrapping past 255); a quarter of the answers to asks are lost,
// and some messages are held back and land after later ones. Each instance
// stops running a lease before it says so, and runs a grant only once it
// has heard it. After every step, read from Redis: what the instances run
// plus the pool's rate is at most the rate; and unless the key is lost
// (see placementRandomInvariant), what the lease records hold plus the
// pool's rate is at most the rate, the same of the burst, and the pool
// holds at most its burst less the live credits (takes ask for credit,
// and name the last credit they were handed, even when held back).
//
// The simulated instances bump their generation at every ask, not only at
// every change of placement: of two asks of one generation, the one that
// lands last writes the record, so an ask overtaken by a later one of the
// same generation would replace the grant the instance heard and runs with
// one it never hears.
func TestPlacementRandomInvariant(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rate  float64
		burst int
		seed  uint64
		flush bool
	}{
		{"rate=10/burst=8", 10, 8, 1, false},
		{"rate=1000/burst=1", 1000, 1, 2, false},
		{"rate=0.5/burst=40", 0.5, 40, 3, false},
		{"rate=10/burst=8/flushall", 10, 8, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			placementRandomInvariant(t, srv, tc.rate, tc.burst, tc.seed, tc.flush)
		})
	}
}

// placementRandomInvariant runs TestPlacementRandomInvariant at rate and
// burst. With flush, Redis loses every record (FLUSHALL) now and then:
// what the instances run is then checked against the pool only once every
// lease granted before the loss has ended.
func placementRandomInvariant(t *testing.T, srv *redistest.Server, rate float64, burst int, seed uint64, flush bool) {
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const (
		n      = 4
		steps  = 1500
		maxTTL = 40 * time.Millisecond
	)
	rng := rand.New(rand.NewPCG(seed, 3))
	key := store.RecordKey("inv", "k")
	insts := make([]*simInstance, n)
	for i := range insts {
		// Start near the wrap, so that generations pass 255.
		insts[i] = &simInstance{id: fmt.Sprint("i", i), gen: uint8(240 + rng.IntN(15))}
	}
	var held []simMsg
	var stats [8]int

	send := func(m simMsg) (global.LeaseGrant, bool) {
		if m.ask != nil {
			out := make([]global.LeaseGrant, 1)
			if err := store.AskLeases(ctx, []global.LeaseAsk{*m.ask}, out); err != nil || out[0].Err != nil {
				t.Fatalf("ask %+v: %v %v", *m.ask, err, out[0].Err)
			}
			g := out[0]
			if g.Granted < 0 || g.Granted > rate*(1+1e-12) || g.Drained < 0 || g.Drained > burst {
				t.Fatalf("ask %+v = %+v", *m.ask, g)
			}
			if g.Stale {
				stats[0]++
			}
			if g.Lost {
				stats[1]++
			}
			return g, true
		}
		tk, err := store.TakePool(ctx, *m.take)
		if err != nil {
			t.Fatalf("take %+v: %v", *m.take, err)
		}
		if tk.PoolRate < 0 || tk.PoolRate > rate*(1+1e-12) || tk.PoolBurst > float64(burst)*(1+1e-12) {
			t.Fatalf("take %+v = %+v", *m.take, tk)
		}
		if tk.Allowed {
			stats[2]++
		}
		if tk.Credit > 0 {
			m.inst.credit = tk.CreditID
		}
		return global.LeaseGrant{}, false
	}
	// post sends m, or holds it back one time in eight; it reports the
	// answer to an ask that was delivered, and whether it arrived.
	post := func(m simMsg) (global.LeaseGrant, bool) {
		if rng.IntN(8) == 0 {
			held = append(held, m)
			return global.LeaseGrant{}, false
		}
		g, isAsk := send(m)
		if isAsk && rng.IntN(4) == 0 {
			stats[3]++
			return global.LeaseGrant{}, false // the answer is lost
		}
		return g, isAsk
	}
	newAsk := func(s *simInstance, want float64) *global.LeaseAsk {
		ttl := time.Duration(2+rng.IntN(int(maxTTL/time.Millisecond)-2)) * time.Millisecond
		return &global.LeaseAsk{Limit: "inv", Key: "k", Instance: s.id, Gen: s.gen, Want: want, Rate: rate,
			Burst: burst, Instances: n, TTL: ttl, MaxTTL: maxTTL}
	}
	takeNow := func(s *simInstance) {
		k := rng.IntN(3)
		s.asked += int64(k)
		post(simMsg{inst: s, gen: s.gen, take: &global.PoolTake{Limit: "inv", Key: "k", Instance: s.id, Gen: s.gen,
			Rate: rate, Burst: burst, Instances: n, N: k, TTL: time.Duration(1+rng.IntN(30)) * time.Millisecond, Asked: s.asked,
			Extra: rng.IntN(3), CreditTTL: time.Duration(1+rng.IntN(30)) * time.Millisecond, CreditID: s.credit}})
	}

	// answer has s hear a now, or one time in three at a later step: an
	// asking instance goes on deciding exactly meanwhile.
	answer := func(s *simInstance, a simAnswer) {
		if rng.IntN(3) == 0 {
			s.pending = &a
			return
		}
		s.hear(a)
	}

	var flushed time.Time
	for step := range steps {
		if flush && rng.IntN(200) == 0 {
			srv.FlushAll(t)
			flushed = time.Now()
		}
		s := insts[rng.IntN(n)]
		if s.pending != nil && rng.IntN(2) == 0 {
			stats[7]++
			s.hear(*s.pending)
			s.pending = nil
		}
		now := time.Now()
		switch op := rng.IntN(10); s.place {
		case simIdle:
			s.bump()
			s.place = simExact
			takeNow(s)
		case simExact, simAsking:
			switch {
			case op < 5:
				takeNow(s)
			case op < 8: // ask for a lease (again): exact until it is heard
				s.bump()
				s.place = simAsking
				a := newAsk(s, rng.Float64()*1.5*rate)
				a.Drain = true
				if g, ok := post(simMsg{inst: s, gen: s.gen, ask: a}); ok {
					answer(s, simAnswer{gen: a.Gen, granted: g.Granted, until: now.Add(a.TTL)})
				}
			default:
				a := newAsk(s, 0)
				a.Release = true
				s.place = simIdle
				post(simMsg{inst: s, gen: s.gen, ask: a})
			}
		case simLeased:
			switch {
			case op < 5: // renew, saying what it runs
				s.bump()
				a := newAsk(s, rng.Float64()*1.5*rate)
				if s.until.After(now) {
					a.Running, a.RunningFor = s.run, s.until.Sub(now)
				}
				if g, ok := post(simMsg{inst: s, gen: s.gen, ask: a}); ok {
					answer(s, simAnswer{gen: a.Gen, granted: g.Granted, until: now.Add(a.TTL)})
				}
			case op < 7: // back to exact: stops running the lease first
				s.bump()
				s.place, s.run = simExact, 0
				takeNow(s)
			case op < 8:
				a := newAsk(s, 0)
				a.Release = true
				s.place, s.run = simIdle, 0
				post(simMsg{inst: s, gen: s.gen, ask: a})
			}
		}
		// Held-back messages land once their instance has moved on.
		kept := held[:0]
		for _, m := range held {
			if m.inst.gen != m.gen && rng.IntN(2) == 0 {
				stats[4]++
				send(m)
			} else {
				kept = append(kept, m)
			}
		}
		held = kept

		h := readPlacement(t, rdb, key)
		runs := 0.0
		now = time.Now() // after the read: a grant running now was live when Redis read
		var who []string
		for _, s := range insts {
			runs += s.runs(now)
			who = append(who, fmt.Sprintf("%s(gen %d, place %d, runs %.4g)", s.id, s.gen, s.place, s.runs(now)))
		}
		f := h.poolFrac(rate, n)
		const tol = 1e-9
		// While lost, Redis counts what the instances say they run, which
		// may be more than the rate: grants that ran unseen until the loss
		// was found, or a claim sent before a release and landing after
		// it (an ask that finds no record and says it runs something marks
		// the key lost). And the pool's burst shrinks when an exact record
		// ends, with no script to cap the tokens stored (the next take
		// does).
		if lost := h.lost > h.now; !lost {
			if held := h.held(); held+rate*f > rate*(1+tol) ||
				float64(burst)*held/rate+float64(burst)*f > float64(burst)*(1+tol) {
				t.Fatalf("step %d: the lease records hold %v and the pool %v of the rate %v: %+v", step, held, rate*f, rate, h)
			}
			if c := max(0, float64(burst)*f-h.credits()); h.hasPool && h.tokens > c*(1+tol)+tol {
				t.Fatalf("step %d: the pool holds %v tokens, above its burst %v less the live credits: %+v",
					step, h.tokens, c, h)
			}
		}
		// Leases granted before a loss run unseen until they end; held
		// back messages may state claims of them a little later.
		if runs+rate*f > rate*(1+tol) && now.Sub(flushed) > 2*maxTTL {
			t.Fatalf("step %d: the instances run %v and the pool %v, above the rate %v: %s; %+v",
				step, runs, rate*f, rate, strings.Join(who, " "), h)
		}
		if h.held() > 0 {
			stats[5]++
		}
		if f < 1 && h.hasPool {
			stats[6]++
		}
	}
	t.Logf("stale asks %d, lost %d, takes allowed %d, answers lost %d, late messages %d, steps with leases %d, with a shrunk pool %d, late answers %d",
		stats[0], stats[1], stats[2], stats[3], stats[4], stats[5], stats[6], stats[7])
}

// TestTakePoolCredit: an admission takes up to Extra tokens more, ahead of
// the instance's next requests, only from a pool that stays at least half
// full after them, and only while the instance holds no live credit; a
// take that names its credit ends it and may be handed the next; a denial
// takes none.
func TestTakePoolCredit(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	take := func(n, extra int, id uint32) global.Take {
		t.Helper()
		tk, err := store.TakePool(context.Background(), global.PoolTake{Limit: "credit", Key: "k", Instance: "a", Gen: 1,
			Rate: 0.001, Burst: 10, Instances: 2, N: n, TTL: time.Minute, Asked: 1, Extra: extra,
			CreditTTL: time.Minute, CreditID: id})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	// A full pool of 10: 1 taken, 2 more as credit, 7 left.
	tk := take(1, 2, 0)
	if !tk.Allowed || tk.Credit != 2 || tk.Remaining != 7 || tk.CreditID != uint32(tk.At.UnixMicro()) {
		t.Fatalf("a take with extra 2 from a full pool: %+v, want allowed, credit 2, 7 left", tk)
	}
	// Its credit lives: none more.
	if tk := take(1, 2, 0); !tk.Allowed || tk.Credit != 0 || tk.Remaining != 6 {
		t.Fatalf("a take with a credit live: %+v, want no credit, 6 left", tk)
	}
	// Named, it ends: 1 taken leaves 5, of which 1 more would leave the
	// pool less than half full.
	if tk := take(1, 2, tk.CreditID); !tk.Allowed || tk.Credit != 0 || tk.Remaining != 5 {
		t.Fatalf("a take naming its credit from a pool of 6: %+v, want no credit, 5 left", tk)
	}
	if tk := take(6, 2, 0); tk.Allowed || tk.Credit != 0 {
		t.Fatalf("a denied take: %+v, want no credit", tk)
	}
}
