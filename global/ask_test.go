package global_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// record is one instance's record in a placement hash (see placement.lua).
type record struct {
	lease bool
	gen   int
	// A lease: granted until expiryUS, want, and claim until claimUS.
	granted, want, claim float64
	expiryUS, claimUS    int64
	// An exact user: demand at atUS, asked, until expiryUS.
	demand, asked float64
	atUS          int64
	// bornUS is when the instance's demand on the key began (its first
	// record): younger than an ask's YoungFor, it does not cut the ask's
	// fair share.
	bornUS int64
	// credit tokens handed ahead, live until creditUS, named creditID.
	credit             float64
	creditUS, creditID int64
}

// creditAt is r's live credit at server time nowUS.
func (r record) creditAt(nowUS int64) float64 {
	if r.creditUS > nowUS {
		return r.credit
	}
	return 0
}

// holds is what the instance of r may be running at server time nowUS.
func (r record) holds(nowUS int64) float64 {
	if !r.lease {
		return 0
	}
	h := 0.0
	if r.expiryUS > nowUS {
		h = r.granted
	}
	if r.claimUS > nowUS {
		h = max(h, r.claim)
	}
	return h
}

// live reports whether r has not ended at nowUS.
func (r record) live(nowUS int64) bool {
	return r.expiryUS > nowUS || (r.lease && r.claimUS > nowUS) || r.creditUS > nowUS
}

// parseRecord parses one "i:<instance>" value of a placement hash.
func parseRecord(v string) (record, error) {
	f := strings.Fields(v)
	var r record
	var errs [10]error
	switch {
	case len(f) == 11 && f[0] == "L":
		r.lease = true
		r.gen, errs[0] = strconv.Atoi(f[1])
		r.granted, errs[1] = strconv.ParseFloat(f[2], 64)
		r.want, errs[2] = strconv.ParseFloat(f[3], 64)
		r.expiryUS, errs[3] = strconv.ParseInt(f[4], 10, 64)
		r.claim, errs[4] = strconv.ParseFloat(f[5], 64)
		r.claimUS, errs[5] = strconv.ParseInt(f[6], 10, 64)
		r.bornUS, errs[6] = strconv.ParseInt(f[7], 10, 64)
	case len(f) == 10 && f[0] == "X":
		r.gen, errs[0] = strconv.Atoi(f[1])
		r.demand, errs[1] = strconv.ParseFloat(f[2], 64)
		r.atUS, errs[2] = strconv.ParseInt(f[3], 10, 64)
		r.asked, errs[3] = strconv.ParseFloat(f[4], 64)
		r.expiryUS, errs[4] = strconv.ParseInt(f[5], 10, 64)
		r.bornUS, errs[6] = strconv.ParseInt(f[6], 10, 64)
	default:
		return record{}, fmt.Errorf("%q: want L and 10 fields or X and 9", v)
	}
	n := len(f)
	r.credit, errs[7] = strconv.ParseFloat(f[n-3], 64)
	r.creditUS, errs[8] = strconv.ParseInt(f[n-2], 10, 64)
	r.creditID, errs[9] = strconv.ParseInt(f[n-1], 10, 64)
	if err := errors.Join(errs[:]...); err != nil {
		return record{}, err
	}
	if r.gen < 1 || r.gen > 255 {
		return record{}, fmt.Errorf("%q: gen %d", v, r.gen)
	}
	return r, nil
}

// placementHash is a placement hash as read in one step with the server
// time.
type placementHash struct {
	now     int64             // server time, us
	records map[string]record // by instance
	hasPool bool
	tokens  float64 // the pool's tokens as stored at poolAt, if hasPool
	poolAt  int64
	lost    int64             // until when Redis lost records, 0 if not
	known   float64           // the grants claimed since the loss (see capacity in placement.lua)
	queue   string            // the latest turn, "at_us instance", "" if none
	raw     map[string]string // every field as stored
}

// placementSnapshot reads a hash and the server time in one step, so that
// whether a record is live is judged at the instant it was read.
var placementSnapshot = redis.NewScript(`
local t = redis.call('TIME')
return {t[1], t[2], redis.call('HGETALL', KEYS[1])}`)

// readPlacement reads the placement hash at key and the server time in one
// step, and parses it.
func readPlacement(t testing.TB, rdb redis.Scripter, key string) placementHash {
	t.Helper()
	v, err := placementSnapshot.Run(context.Background(), rdb, []string{key}).Slice()
	if err != nil || len(v) != 3 {
		t.Fatalf("read %s: %v %v", key, v, err)
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
	us, err2 := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	kv, _ := v[2].([]any)
	h := placementHash{now: sec*1_000_000 + us, records: map[string]record{}, raw: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		id, val := fmt.Sprint(kv[i]), fmt.Sprint(kv[i+1])
		h.raw[id] = val
		var err error
		switch {
		case id == "p":
			h.hasPool = true
			_, err = fmt.Sscanf(val, "%g %d", &h.tokens, &h.poolAt)
		case id == "lost":
			_, err = fmt.Sscanf(val, "%d %g", &h.lost, &h.known)
		case id == "q":
			h.queue = val
		case strings.HasPrefix(id, "i:"):
			h.records[id[2:]], err = parseRecord(val)
		default:
			err = errors.New("want i:<instance>, p, q or lost")
		}
		if err != nil {
			t.Fatalf("%s: field %s=%q: %v", key, id, val, err)
		}
	}
	return h
}

// held is what all the lease records of h hold.
func (h placementHash) held() float64 {
	s := 0.0
	for _, r := range h.records {
		s += r.holds(h.now)
	}
	return s
}

// credits is the live credit of all the records of h.
func (h placementHash) credits() float64 {
	s := 0.0
	for _, r := range h.records {
		s += r.creditAt(h.now)
	}
	return s
}

// poolFrac is the fraction of the rate and burst the pool of h holds, n
// being N-hat (see pool_frac in placement.lua).
func (h placementHash) poolFrac(rate float64, n int) float64 {
	f := max(0, min(1, 1-h.held()/rate))
	if h.lost > h.now {
		f = min(f, max(0, h.known-h.held())/rate)
	}
	return f
}

// ask sends one LeaseAsk and fails the test on any error.
func ask(t testing.TB, store *global.Store, a global.LeaseAsk) global.LeaseGrant {
	t.Helper()
	out := make([]global.LeaseGrant, 1)
	if err := store.AskLeases(context.Background(), []global.LeaseAsk{a}, out); err != nil || out[0].Err != nil {
		t.Fatalf("AskLeases(%+v): %v %v", a, err, out[0].Err)
	}
	return out[0]
}

// near reports whether a is within tol of b.
func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestRecordKey(t *testing.T) {
	store := global.New(noNetwork{}, "p")
	if got := store.RecordKey("api", "k"); got != "p:v4:{api:k}" {
		t.Errorf("RecordKey(api, k) = %q", got)
	}
	// Keys named by their hash in BucketKey are named so here too: the
	// record and the bucket of a key share one hash tag, and so one slot.
	for _, key := range []string{"k", strings.Repeat("k", global.MaxKeyBytes+1), "a{b}", "#x"} {
		got, bucket := store.RecordKey("api", key), store.BucketKey("api", key)
		tag := strings.TrimSuffix(strings.TrimPrefix(bucket, "p:"), ":tb")
		if got != "p:v4:"+tag || (key != "k" && !strings.HasPrefix(tag, "{api:#")) {
			t.Errorf("RecordKey(api, %.20q) = %q beside BucketKey %q", key, got, bucket)
		}
	}
	if global.New(noNetwork{}, "").RecordKey("l", "k") != global.DefaultPrefix+":v4:{l:k}" {
		t.Error("an empty prefix is not DefaultPrefix")
	}
}

// TestAskLeasesGrant: alone, an instance is granted its want plus an N-th
// of what nobody wants; a second instance wanting more than is left makes
// the key contended, is granted what the first leaves, and both converge
// on the max-min fair split at their renewals. The record is in the hash
// as placement.lua describes it.
func TestAskLeasesGrant(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	const rate, n = 10.0, 4
	req := func(inst string, want float64) global.LeaseAsk {
		return global.LeaseAsk{Limit: "grant", Key: "k", Instance: inst, Gen: 1, Want: want, Rate: rate, Burst: 10,
			Instances: n, TTL: time.Second}
	}
	a := ask(t, store, req("a", 3))
	if !approx(a.Granted, 4.75) || !approx(a.Fair, 4.75) || !approx(a.Demand, 3) || a.Contended || a.In != time.Second ||
		a.Lost || a.Stale || a.Drained != 0 {
		t.Fatalf("a alone = %+v, want granted 3 + 7/4", a)
	}
	h := readPlacement(t, rdb, store.RecordKey("grant", "k"))
	r := h.records["a"]
	if !r.lease || r.gen != 1 || !approx(r.granted, 4.75) || r.want != 3 || r.claim != 0 || r.claimUS != 0 ||
		r.expiryUS <= h.now || r.expiryUS > h.now+1_000_000 {
		t.Errorf("a's record = %+v at %d", r, h.now)
	}
	// Wants 3 and 10 over 10: the fair level is 7; a still holds 4.75.
	if b := ask(t, store, req("b", 10)); !approx(b.Fair, 7) || !approx(b.Granted, 5.25) || !b.Contended || !approx(b.Demand, 13) {
		t.Fatalf("b beside a = %+v, want fair 7, granted 5.25, contended", b)
	}
	if a := ask(t, store, req("a", 3)); !approx(a.Granted, 3) || !a.Contended {
		t.Fatalf("a renewed = %+v, want its want, 3", a)
	}
	if b := ask(t, store, req("b", 10)); !approx(b.Granted, 7) {
		t.Fatalf("b renewed = %+v, want 7", b)
	}
}

// TestAskLeasesGens: an ask older than the instance's record is stale and
// writes nothing; a release older than the record leaves it; generations
// compare modulo 256, so 3 is newer than 250; and an ask of the same
// generation as an exact record replaces it with a lease.
func TestAskLeasesGens(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	key := store.RecordKey("gens", "k")
	req := func(gen uint8) global.LeaseAsk {
		return global.LeaseAsk{Limit: "gens", Key: "k", Instance: "a", Gen: gen, Want: 2, Rate: 10, Burst: 10,
			Instances: 2, TTL: time.Minute}
	}
	gen := func() int {
		t.Helper()
		r, ok := readPlacement(t, rdb, key).records["a"]
		if !ok {
			return 0
		}
		return r.gen
	}
	if g := ask(t, store, req(5)); g.Stale || g.Granted <= 0 {
		t.Fatalf("gen 5 on a fresh key = %+v", g)
	}
	before := readPlacement(t, rdb, key).raw
	older := req(4)
	older.Want, older.Running, older.RunningFor = 10, 3, time.Minute
	if g := ask(t, store, older); !g.Stale || g.Granted != 0 || g.In != 0 || g.Lost {
		t.Errorf("gen 4 after 5 = %+v, want stale, granted 0", g)
	}
	if after := readPlacement(t, rdb, key).raw; fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a stale ask wrote: %v, then %v", before, after)
	}
	release := req(4)
	release.Release = true
	if g := ask(t, store, release); !g.Stale || gen() != 5 {
		t.Errorf("release at gen 4 = %+v and left gen %d, want stale, record 5 kept", g, gen())
	}
	release.Gen = 5
	if g := ask(t, store, release); g.Stale || g.Granted != 0 || g.In != 0 || gen() != 0 {
		t.Errorf("release at gen 5 = %+v and left gen %d, want the record gone", g, gen())
	}

	// Around the wrap: 3 is newer than 250, and 250 older than 3.
	ask(t, store, req(250))
	if g := ask(t, store, req(3)); g.Stale || gen() != 3 {
		t.Errorf("gen 3 after 250 = %+v, record gen %d: want 3 newer", g, gen())
	}
	if g := ask(t, store, req(250)); !g.Stale || gen() != 3 {
		t.Errorf("gen 250 after 3 = %+v, record gen %d: want stale", g, gen())
	}

	// An exact record of the same generation becomes a lease.
	if _, err := store.TakePool(context.Background(), global.PoolTake{Limit: "gens", Key: "k", Instance: "a", Gen: 4,
		Rate: 10, Burst: 10, Instances: 2, N: 1, TTL: time.Minute, Asked: 1}); err != nil {
		t.Fatal(err)
	}
	if r := readPlacement(t, rdb, key).records["a"]; r.lease || r.gen != 4 {
		t.Fatalf("after a take at gen 4: %+v, want an exact record of gen 4", r)
	}
	if g := ask(t, store, req(4)); g.Stale || g.Granted <= 0 {
		t.Errorf("gen 4 ask over an exact record of gen 4 = %+v", g)
	}
	if r := readPlacement(t, rdb, key).records["a"]; !r.lease || r.gen != 4 {
		t.Errorf("after the ask: %+v, want a lease of gen 4", r)
	}
}

// TestAskLeasesCountsExactDemand: an exact user's measured demand is its
// want in the water-filling, so a lease asking for the whole rate is
// granted what that demand leaves, and the demand follows the growth of
// the user's Asked. Beside an exact user no lease is granted a surplus.
func TestAskLeasesCountsExactDemand(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate = 200.0
	key := store.RecordKey("demand", "k")
	take := func(n int, asked int64) record {
		t.Helper()
		if _, err := store.TakePool(ctx, global.PoolTake{Limit: "demand", Key: "k", Instance: "b", Gen: 1, Rate: rate,
			Burst: 200, Instances: 2, N: n, TTL: time.Minute, Asked: asked}); err != nil {
			t.Fatal(err)
		}
		return readPlacement(t, rdb, key).records["b"]
	}
	// grant asks for want and checks the grant against b's record r: the
	// ask ran after r was written and before the hash was read back, so
	// b's demand had decayed by e^(-age/1s) for an age in between.
	grant := func(want float64, r record) global.LeaseGrant {
		t.Helper()
		g := ask(t, store, global.LeaseAsk{Limit: "demand", Key: "k", Instance: "a", Gen: 1, Want: want, Rate: rate,
			Burst: 200, Instances: 2, TTL: time.Minute})
		later := r.demand * math.Exp(-float64(readPlacement(t, rdb, key).now-r.atUS)/1e6)
		if lo, hi := min(want, rate-r.demand), min(want, rate-later); g.Granted < lo*(1-1e-9) || g.Granted > hi*(1+1e-9) {
			t.Errorf("a wanting %v beside b's demand %v (%v by the time it was read) = %+v, want from %v to %v",
				want, r.demand, later, g, lo, hi)
		}
		return g
	}
	r := take(20, 20)
	if r.demand != 20 {
		t.Fatalf("a new record: %+v, want demand 20", r)
	}
	if g := grant(rate, r); !g.Contended || g.Granted >= rate-1 {
		t.Errorf("a beside b's demand of 20 = %+v, want it contended, granted about 180", g)
	}
	prev := r
	r = take(1, 70) // asked grew by 50
	if want := prev.demand*math.Exp(-float64(r.atUS-prev.atUS)/1e6) + 50; !approx(r.demand, want) {
		t.Errorf("after Asked grew by 50: demand %v, want %v", r.demand, want)
	}
	grant(rate, r) // about 130
	// Uncontended beside an exact user: the want, no surplus.
	if g := grant(10, r); g.Contended || !approx(g.Granted, 10) || !approx(g.Fair, 10) {
		t.Errorf("a wanting 10 beside b = %+v, want 10 and no surplus", g)
	}
}

// TestAskLeasesRunningClaim: a renewal that shrinks a grant keeps the old
// grant counted until RunningFor ends, so another instance is granted what
// it gave up only then.
func TestAskLeasesRunningClaim(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	const rate, claimFor = 10.0, 150 * time.Millisecond
	req := func(inst string, want float64) global.LeaseAsk {
		return global.LeaseAsk{Limit: "claim", Key: "k", Instance: inst, Gen: 1, Want: want, Rate: rate, Burst: 10,
			Instances: 4, TTL: time.Minute}
	}
	if g := ask(t, store, req("a", rate)); !approx(g.Granted, rate) {
		t.Fatalf("a alone = %+v, want the whole rate", g)
	}
	shrink := req("a", 2)
	shrink.Running, shrink.RunningFor = rate, claimFor
	sent := time.Now()
	// Alone: 2 + 8/4.
	if g := ask(t, store, shrink); !approx(g.Granted, 4) {
		t.Fatalf("a shrinking = %+v, want 4", g)
	}
	var g global.LeaseGrant
	eventually(t, "b to be granted what a gave up", func() bool {
		g = ask(t, store, req("b", rate))
		if g.Granted > 0 && time.Since(sent) < claimFor {
			t.Fatalf("b granted %+v %v after a's shrink, before its claim of %v ended", g, time.Since(sent), claimFor)
		}
		return g.Granted > 0
	})
	// Wants 2 and 10: level 8, and a holds 4.
	if !approx(g.Granted, 6) || !approx(g.Fair, 8) {
		t.Errorf("b once a's claim ended = %+v, want 6 (fair 8)", g)
	}
}

// TestAskLeasesLost: after FLUSHALL, an ask that says it runs a grant
// proves that Redis lost its records: until MaxTTL later the grants and
// the pool hold at most what was claimed since (known): an instance that
// claims nothing gets only what a claimer gave up.
func TestAskLeasesLost(t *testing.T) {
	const (
		rate   = 100.0
		n      = 4
		ttl    = 100 * time.Millisecond
		maxTTL = 300 * time.Millisecond
	)
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	req := func(inst string, want, running float64) global.LeaseAsk {
		a := global.LeaseAsk{Limit: "lost", Key: "k", Instance: inst, Gen: 1, Want: want, Rate: rate, Burst: 100,
			Instances: n, TTL: ttl, MaxTTL: maxTTL, Running: running}
		if running > 0 {
			a.RunningFor = ttl
		}
		return a
	}
	if g := ask(t, store, req("a", 50, 0)); !approx(g.Granted, 62.5) || g.Lost {
		t.Fatalf("a alone = %+v, want 50 + 50/4", g)
	}
	srv.FlushAll(t)
	detected := time.Now()
	if g := ask(t, store, req("a", rate, 62.5)); !approx(g.Granted, 62.5) || !g.Lost || !approx(g.Fair, rate) {
		t.Fatalf("a after the loss = %+v, want granted 62.5 (its running), fair 100, lost", g)
	}
	if g := ask(t, store, req("c", rate, 0)); g.Granted != 0 || !g.Lost {
		t.Fatalf("c after the loss = %+v, want granted 0, lost", g)
	}
	// a claimed 62.5 and holds it: nothing is left for the pool.
	take := func() global.Take {
		tk, err := store.TakePool(context.Background(), global.PoolTake{Limit: "lost", Key: "k", Instance: "d", Gen: 1,
			Rate: rate, Burst: 100, Instances: n, N: 1, TTL: time.Second, Asked: 1})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	if tk := take(); tk.PoolRate != 0 {
		t.Fatalf("take while lost = %+v; want a pool without rate: a holds what was claimed", tk)
	}
	// a gives up 22.5 (its claim ends with the ask's RunningFor): the pool
	// may hold what it gave up, and no more.
	short := req("a", 40, 62.5)
	short.RunningFor = time.Microsecond
	if g := ask(t, store, short); !approx(g.Granted, 40) {
		t.Fatalf("a shrinking while lost = %+v, want granted 40", g)
	}
	if tk := take(); !approx(tk.PoolRate, 62.5-40) {
		t.Fatalf("take while lost after a shrank = %+v; want a pool of what a gave up, 22.5/s", tk)
	}
	var g global.LeaseGrant
	eventually(t, "a's grant to grow after MaxTTL", func() bool {
		g = ask(t, store, req("a", rate, 62.5))
		return !g.Lost
	})
	if since := time.Since(detected); since < maxTTL {
		t.Errorf("Lost ended %v after the loss was detected, before MaxTTL %v", since, maxTTL)
	}
	// Wants 100 (a), 0 (c) and d's decayed demand of 1.
	if g.Granted <= 62.5 || !g.Contended {
		t.Errorf("a after Lost ended = %+v, want it to grow", g)
	}
}

// TestAskLeasesLostFoundByARecord: an instance that runs nothing but says
// its last ask left a record (Recorded: a starved asker) proves the loss
// when Redis has none of it, before its ask is granted what a lease Redis
// forgot still runs: granted nothing, the pool holds nothing, and the
// lease's instance keeps what it runs. A record that Redis has proves
// nothing.
func TestAskLeasesLostFoundByARecord(t *testing.T) {
	const rate, n, ttl = 100.0, 2, time.Second
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	req := func(inst string, gen uint8, running float64, recorded bool) global.LeaseAsk {
		a := global.LeaseAsk{Limit: "lost", Key: "k", Instance: inst, Gen: gen, Want: rate, Rate: rate, Burst: 100,
			Instances: n, TTL: ttl, Running: running, Recorded: recorded}
		if running > 0 {
			a.RunningFor = ttl
		}
		return a
	}
	// a leases the whole rate; b asks and gets nothing: a holds it until
	// it renews.
	if g := ask(t, store, req("a", 1, 0, false)); !approx(g.Granted, rate) {
		t.Fatalf("a alone = %+v", g)
	}
	if g := ask(t, store, req("b", 1, 0, false)); g.Granted != 0 || g.Lost {
		t.Fatalf("b while a holds the rate = %+v, want nothing", g)
	}
	if g := ask(t, store, req("b", 3, 0, true)); g.Granted != 0 || g.Lost {
		t.Fatalf("b again, its record there = %+v, want nothing, not lost", g)
	}
	srv.FlushAll(t)
	// b asks first after the flush: a still runs the rate. Without its
	// record, b would be granted the whole rate on top of it.
	if g := ask(t, store, req("b", 5, 0, true)); g.Granted != 0 || !g.Lost {
		t.Fatalf("b after the loss = %+v, want granted nothing, lost", g)
	}
	tk, err := store.TakePool(context.Background(), global.PoolTake{Limit: "lost", Key: "k", Instance: "b", Gen: 7,
		Rate: rate, Burst: 100, Instances: n, N: 1, TTL: time.Second, Asked: 1})
	if err != nil || tk.Allowed || tk.PoolRate != 0 {
		t.Fatalf("b's take after the loss = %+v, %v; want a pool without rate", tk, err)
	}
	// a renews saying it runs the rate: its fair share now that b's record
	// shows b's want, and lost; its claim holds the rest until it ends.
	if g := ask(t, store, req("a", 3, rate, true)); !approx(g.Granted, rate/2) || !g.Lost {
		t.Fatalf("a renewing after the loss = %+v, want its fair share %v, lost", g, rate/2)
	}
	if g := ask(t, store, req("b", 7, 0, true)); g.Granted != 0 || !g.Lost {
		t.Fatalf("b while a's claim lasts = %+v, want nothing", g)
	}
}

// TestAskLeasesDrain: an exact user leasing with Drain moves the lease's
// part of the burst from the pool, rounded down, and never more than the
// pool holds; without Drain, or without a grant, nothing moves. The pool
// keeps the rest, at most its new burst.
func TestAskLeasesDrain(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate, burst, n = 0.1, 10, 4 // a token in ten seconds: no refill to speak of
	for _, tc := range []struct {
		key     string
		take    int // from the full pool of 10, before the ask
		want    float64
		drain   bool
		drained int
		pool    float64 // after the ask
	}{
		// Alone: granted 0.02 + 0.08/4 = 0.04, whose part of the burst is 4.
		{"plenty", 1, 0.02, true, 4, 5},
		{"scarce", 9, 0.02, true, 1, 0},
		// The pool keeps its 9, down to its new burst 6.
		{"none", 1, 0.02, false, 0, 6},
		// Want 0: no grant, nothing moves.
		{"nogrant", 1, 0, true, 0, 9},
	} {
		t.Run(tc.key, func(t *testing.T) {
			if tk, err := store.TakePool(ctx, global.PoolTake{Limit: "drain", Key: tc.key, Instance: "a", Gen: 1, Rate: rate,
				Burst: burst, Instances: n, N: tc.take, TTL: time.Minute, Asked: int64(tc.take)}); err != nil || !tk.Allowed {
				t.Fatal(tk, err)
			}
			g := ask(t, store, global.LeaseAsk{Limit: "drain", Key: tc.key, Instance: "a", Gen: 2, Want: tc.want,
				Rate: rate, Burst: burst, Instances: n, TTL: time.Minute, Drain: tc.drain})
			if g.Drained != tc.drained {
				t.Errorf("ask = %+v, want %d drained", g, tc.drained)
			}
			h := readPlacement(t, rdb, store.RecordKey("drain", tc.key))
			if !h.hasPool || !near(h.tokens, tc.pool, 0.05) {
				t.Errorf("pool %v (%v) after the ask, want %v", h.tokens, h.hasPool, tc.pool)
			}
		})
	}
}

// expiresAt is when key expires, in Unix milliseconds (PEXPIRETIME): -1
// without an expiry, -2 if there is no key.
func expiresAt(t testing.TB, rdb *redis.Client, key string) int64 {
	t.Helper()
	ms, err := rdb.Do(context.Background(), "PEXPIRETIME", key).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// TestAskLeasesExpiry: a hash lives as long as its records, then
// disappears; a release whose rate goes back to the pool leaves the pool
// refilling, and the hash lives until it would be full again.
func TestAskLeasesExpiry(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	req := global.LeaseAsk{Limit: "exp", Key: "k", Instance: "a", Gen: 1, Want: 100, Rate: 100, Burst: 30,
		Instances: 1, TTL: ttl}
	if g := ask(t, store, req); !approx(g.Granted, 100) {
		t.Fatalf("ask = %+v", g)
	}
	key := store.RecordKey("exp", "k")
	h := readPlacement(t, rdb, key)
	if at, want := expiresAt(t, rdb, key), (h.records["a"].expiryUS+999)/1000; at != want {
		t.Errorf("the hash expires at %d, want %d: with its lease %+v", at, want, h.records["a"])
	}
	eventually(t, "the hash to expire with its lease", func() bool { return rdb.Exists(ctx, key).Val() == 0 })

	// The lease held the whole rate, so the pool held nothing: released, it
	// refills from empty, 30 tokens at 100/s.
	ask(t, store, req)
	req.Release = true
	if g := ask(t, store, req); g.Granted != 0 || g.In != 0 {
		t.Fatalf("release = %+v", g)
	}
	h = readPlacement(t, rdb, key)
	if _, ok := h.records["a"]; ok || !h.hasPool || h.tokens != 0 {
		t.Fatalf("after the release: %+v, want no record and an empty pool", h)
	}
	if at, want := expiresAt(t, rdb, key), (h.poolAt+300_000+999)/1000; at != want {
		t.Errorf("the hash expires at %d, want %d: when the pool stored at %d is full", at, want, h.poolAt)
	}
	eventually(t, "the hash to expire once the pool is full", func() bool { return rdb.Exists(ctx, key).Val() == 0 })
}

func TestAskLeasesInvalid(t *testing.T) {
	ok := global.LeaseAsk{Limit: "l", Key: "k", Instance: "a", Gen: 1, Want: 1, Rate: 10, Burst: 1, Instances: 2, TTL: time.Second}
	tests := []struct {
		name string
		edit func(*global.LeaseAsk)
	}{
		{"empty instance", func(a *global.LeaseAsk) { a.Instance = "" }},
		{"gen 0", func(a *global.LeaseAsk) { a.Gen = 0 }},
		{"NaN want", func(a *global.LeaseAsk) { a.Want = nan() }},
		{"infinite want", func(a *global.LeaseAsk) { a.Want = inf() }},
		{"negative want", func(a *global.LeaseAsk) { a.Want = -1 }},
		{"zero rate", func(a *global.LeaseAsk) { a.Rate = 0 }},
		{"NaN rate", func(a *global.LeaseAsk) { a.Rate = nan() }},
		{"infinite rate", func(a *global.LeaseAsk) { a.Rate = inf() }},
		{"zero burst", func(a *global.LeaseAsk) { a.Burst = 0 }},
		{"zero instances", func(a *global.LeaseAsk) { a.Instances = 0 }},
		{"ttl below a microsecond", func(a *global.LeaseAsk) { a.TTL = time.Nanosecond }},
		{"NaN running", func(a *global.LeaseAsk) { a.Running = nan() }},
		{"negative running", func(a *global.LeaseAsk) { a.Running = -1 }},
		{"negative running for", func(a *global.LeaseAsk) { a.RunningFor = -1 }},
		{"invalid release", func(a *global.LeaseAsk) { a.Release, a.Rate = true, 0 }},
	}
	store := global.New(noNetwork{}, "") // any network call panics
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := ok
			tt.edit(&a)
			out := make([]global.LeaseGrant, 1)
			if err := store.AskLeases(context.Background(), []global.LeaseAsk{a}, out); err != nil {
				t.Fatalf("AskLeases: %v, want the error in out", err)
			}
			if !errors.Is(out[0].Err, global.ErrInvalid) || !strings.HasPrefix(out[0].Err.Error(), `global: ask "k":`) {
				t.Errorf("AskLeases(%+v) error = %v, want ErrInvalid", a, out[0].Err)
			}
		})
	}
	if err := store.AskLeases(context.Background(), []global.LeaseAsk{ok}, nil); !errors.Is(err, global.ErrInvalid) {
		t.Errorf("AskLeases with no room for the answer: %v, want ErrInvalid", err)
	}
	// MaxTTL below TTL, even negative, means TTL: valid.
	a := ok
	a.MaxTTL = -time.Second
	srv := redistest.Start(t)
	if g := ask(t, global.New(srv.Client(t), ""), a); g.Granted <= 0 {
		t.Errorf("ask with MaxTTL below TTL = %+v", g)
	}
}

// TestAskLeasesValidatedByLua: the script rejects what AskLeases would
// not send, with an error reply.
func TestAskLeasesValidatedByLua(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	good := []string{"a", "1", "1", "10", "1", "2", "1000", "1000", "0", "0", "0", "0"}
	for i, bad := range map[int]string{0: "", 1: "0", 2: "-1", 3: "0", 4: "0", 5: "0", 6: "0", 7: "999", 8: "nan", 9: "-1", 10: "x", 11: "2"} {
		args := make([]any, len(good))
		for j, v := range good {
			args[j] = v
		}
		args[i] = bad
		// The script as AskLeases runs it: a Store would not send invalid
		// arguments.
		err := rdb.Eval(context.Background(), scriptSource(t, "ask.lua"), []string{"v"}, args...).Err()
		if err == nil || !strings.Contains(err.Error(), "invalid ask arguments") {
			t.Errorf("ARGV[%d] = %q: %v, want invalid ask arguments", i+1, bad, err)
		}
	}
}

func TestAskLeasesNoScript(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	asks := make([]global.LeaseAsk, 5)
	for i := range asks {
		asks[i] = global.LeaseAsk{Limit: "ns", Key: fmt.Sprint(i), Instance: "a", Gen: 1, Want: 1, Rate: 10, Burst: 1,
			Instances: 1, TTL: time.Second}
	}
	out := make([]global.LeaseGrant, len(asks))
	for round := range 3 {
		srv.ScriptFlush(t)
		if err := store.AskLeases(context.Background(), asks, out); err != nil {
			t.Fatalf("round %d: AskLeases after SCRIPT FLUSH: %v", round, err)
		}
		for i, g := range out {
			if g.Err != nil || !approx(g.Granted, 10) {
				t.Fatalf("round %d: out[%d] = %+v", round, i, g)
			}
		}
	}
	if st := srv.CommandStats(t); st["eval"] != 3*int64(len(asks)) {
		t.Errorf("EVAL calls = %d, want %d (the whole batch, once per flush)", st["eval"], 3*len(asks))
	}
}

// TestAskLeasesOnePipeline: a batch goes out in one pipeline, and a
// failure of one ask (WRONGTYPE at its key) stays in its answer.
func TestAskLeasesOnePipeline(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	if err := rdb.Set(ctx, store.RecordKey("pipe", "bad"), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	asks := make([]global.LeaseAsk, 100)
	for i := range asks {
		asks[i] = global.LeaseAsk{Limit: "pipe", Key: fmt.Sprint(i), Instance: "a", Gen: 1, Want: 5, Rate: 10, Burst: 1,
			Instances: 2, TTL: time.Second}
	}
	asks[50].Key = "bad"
	asks[60].Gen = 0       // invalid, not sent
	ask(t, store, asks[0]) // loads the script
	var hook pipelines
	rdb.AddHook(&hook)
	out := make([]global.LeaseGrant, len(asks))
	if err := store.AskLeases(ctx, asks, out); err != nil {
		t.Fatal(err)
	}
	for i, g := range out {
		switch i {
		case 50:
			if g.Err == nil || !strings.Contains(g.Err.Error(), "WRONGTYPE") || !global.IsReplyError(g.Err) {
				t.Errorf("out[50] = %+v, want WRONGTYPE", g)
			}
		case 60:
			if !errors.Is(g.Err, global.ErrInvalid) {
				t.Errorf("out[60] = %+v, want ErrInvalid", g)
			}
		default:
			if g.Err != nil || !approx(g.Granted, 7.5) {
				t.Errorf("out[%d] = %+v, want 5 + 5/2", i, g)
			}
		}
	}
	if p, c, s := hook.pipelines.Load(), hook.cmds.Load(), hook.singles.Load(); p != 1 || c != 99 || s != 0 {
		t.Errorf("client sent %d pipelines of %d commands and %d single commands, want 1 of 99 and 0", p, c, s)
	}
}

// TestAskLeasesCluster: asks and takes over keys spread across the slots
// of a three-master Redis Cluster, through a ClusterClient: every master
// arbitrates its keys.
func TestAskLeasesCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	store := global.New(cl.Client(t), "")
	asks := make([]global.LeaseAsk, 60)
	for i := range asks {
		asks[i] = global.LeaseAsk{Limit: "cl", Key: fmt.Sprint(i), Instance: "a", Gen: 2, Want: 5, Rate: 10, Burst: 10,
			Instances: 2, TTL: time.Minute, Drain: true}
		tk, err := store.TakePool(context.Background(), global.PoolTake{Limit: "cl", Key: asks[i].Key, Instance: "a", Gen: 1,
			Rate: 10, Burst: 10, Instances: 2, N: 2, TTL: time.Minute, Asked: 2})
		if err != nil || !tk.Allowed {
			t.Fatalf("take %d: %+v %v", i, tk, err)
		}
	}
	out := make([]global.LeaseGrant, len(asks))
	if err := store.AskLeases(context.Background(), asks, out); err != nil {
		t.Fatal(err)
	}
	for i, g := range out {
		// 5 + 5/2, whose part of the burst is 7; the pool holds 8.
		if g.Err != nil || !approx(g.Granted, 7.5) || g.Drained != 7 {
			t.Errorf("out[%d] = %+v", i, g)
		}
	}
	for _, m := range cl.Masters {
		if m.CommandStats(t)["evalsha"] == 0 {
			t.Errorf("master %s ran no script", m.Addr)
		}
	}
}

// scriptSource is the script in file as the Store runs it, placement.lua
// prepended.
func scriptSource(t testing.TB, file string) string {
	t.Helper()
	helpers, err1 := os.ReadFile("placement.lua")
	script, err2 := os.ReadFile(file)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	return string(helpers) + "\n" + string(script)
}

// pipelines counts the pipelines a client sends and their commands, and
// the commands it sends alone.
type pipelines struct {
	pipelines, cmds, singles atomic.Int64
}

func (c *pipelines) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *pipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.singles.Add(1)
		return next(ctx, cmd)
	}
}

func (c *pipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.pipelines.Add(1)
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestAskLeasesYoungDemand: another instance's demand counts in an ask's
// fair share only once it has lasted the ask's YoungFor, from its first
// record on, whichever placement its records are in: a pulse that may end
// before a cut lands takes only what is free.
func TestAskLeasesYoungDemand(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate = 100.0
	key := store.RecordKey("young", "k")
	// b's demand begins: an exact record, then a lease it asks for.
	if _, err := store.TakePool(ctx, global.PoolTake{Limit: "young", Key: "k", Instance: "b", Gen: 1, Rate: rate,
		Burst: 10, Instances: 2, N: 1, TTL: time.Minute, Asked: 50}); err != nil {
		t.Fatal(err)
	}
	born := readPlacement(t, rdb, key).records["b"].bornUS
	ask(t, store, global.LeaseAsk{Limit: "young", Key: "k", Instance: "b", Gen: 3, Want: rate, Rate: rate, Burst: 10,
		Instances: 2, TTL: time.Minute})
	if r := readPlacement(t, rdb, key).records["b"]; !r.lease || r.bornUS != born {
		t.Fatalf("b's lease %+v: want it born when its exact record was, %d", r, born)
	}
	a := func(young time.Duration) global.LeaseGrant {
		return ask(t, store, global.LeaseAsk{Limit: "young", Key: "k", Instance: "a", Gen: 1, Want: rate, Rate: rate, Burst: 10,
			Instances: 2, TTL: time.Minute, YoungFor: young})
	}
	// b's demand is young for a minute: a's fair share is all it wants.
	if g := a(time.Minute); g.Fair != rate || g.Contended {
		t.Errorf("a beside b's young want: %+v, want a fair share of the whole rate, uncontended", g)
	}
	// Counted at once: half each.
	if g := a(0); g.Fair != rate/2 || !g.Contended {
		t.Errorf("a beside b's want, counted: %+v, want a fair share of half the rate, contended", g)
	}
}
