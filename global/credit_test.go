package global_test

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// creditTake is a take of n tokens of key "k" of limit "credit" by inst,
// asking for up to extra tokens of credit living life, and naming the
// credit id as spent.
func creditTake(t *testing.T, store *global.Store, inst string, n int, asked int64, extra int, life time.Duration,
	id uint32, rate float64, burst int) global.Take {
	t.Helper()
	tk, err := store.TakePool(context.Background(), global.PoolTake{Limit: "credit", Key: "k", Instance: inst, Gen: 1,
		Rate: rate, Burst: burst, Instances: 4, N: n, TTL: time.Minute, Asked: asked, Extra: extra,
		CreditTTL: life, CreditID: id})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// TestCreditKeepsTheWindowBound: four instances each take a token of a
// fresh key's pool and are handed a token of credit; the pool is left long
// enough to refill (its rate is known: burst/rate is enough, whatever the
// machine's speed); then every instance spends its credit, and the pool is
// drained by takes that name the credits spent and may be handed new ones.
// What the window from the first of those takes to the last admission
// admits, the credits spent at its start and handed within it included,
// is at most rate·w + burst: Redis counted the credits out of the pool.
// Without that, the pool refilled to its burst beside them, and the
// window held burst + rate·w + 4 less a token at most.
func TestCreditKeepsTheWindowBound(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	const rate, burst = 100.0, 20
	insts := []string{"a", "b", "c", "d"}
	ids := map[string]uint32{}
	asked := map[string]int64{}
	take := func(inst string) global.Take {
		asked[inst]++
		tk := creditTake(t, store, inst, 1, asked[inst], 1, time.Minute, ids[inst], rate, burst)
		if tk.Credit > 0 {
			ids[inst] = tk.CreditID
		}
		return tk
	}
	for _, inst := range insts {
		if tk := take(inst); !tk.Allowed || tk.Credit != 1 {
			t.Fatalf("%s's first take: %+v, want a token and a token of credit", inst, tk)
		}
	}
	time.Sleep(time.Duration(burst / rate * float64(time.Second))) // the pool's whole refill, and more

	// The window: every instance spends its credit at its start, and the
	// pool is drained.
	admitted := len(insts)
	var first, last time.Time
	for i := 0; ; i++ {
		tk := take(insts[i%len(insts)])
		if first.IsZero() {
			first = tk.At
		}
		if !tk.Allowed {
			break
		}
		admitted += 1 + tk.Credit
		last = tk.At
	}
	w := last.Sub(first).Seconds()
	if bound := rate*w + burst; float64(admitted) > bound+1e-9 {
		t.Errorf("a window of %.6fs admitted %d tokens, above rate·w + burst = %.3f", w, admitted, bound)
	}
}

// TestCreditEndRefillsFromThen: a pool capped below its burst by a live
// credit (a refund fills it up to that cap, not above) refills from the
// credit's end on at its rate: it does not jump to its burst when the
// credit ends, however long it sat at the cap before.
func TestCreditEndRefillsFromThen(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	const rate, burst, life = 1.0, 10, 500 * time.Millisecond
	creditTake(t, store, "a", 0, 0, 0, life, 0, rate, burst) // joins the key: a demand of 0
	// Asked 1000 since: a demand of 1000/s, a credit of up to 4 tokens.
	tk := creditTake(t, store, "a", 1, 1000, 4, life, 0, rate, burst)
	if !tk.Allowed || tk.Credit != 4 || tk.Remaining != 5 {
		t.Fatalf("the take: %+v, want a token and 4 of credit, 5 left", tk)
	}
	end := tk.At.Add(life)
	if left, err := store.GivePool(context.Background(), "credit", "k", rate, burst, 2, tk.At); err != nil || left != 6 {
		t.Fatalf("a refund of 2 beside a credit of 4: %d left, %v; want the pool's burst less the credit, 6", left, err)
	}
	if h := readPlacement(t, rdb, store.RecordKey("credit", "k")); h.now >= end.UnixMicro() {
		t.Skipf("the refund landed after the credit ended (a slow machine)")
	}
	time.Sleep(time.Until(end) + 10*time.Millisecond) // past the credit's end: any time after will do
	creditTake(t, store, "a", 0, 1000, 0, life, 0, rate, burst)
	h := readPlacement(t, rdb, store.RecordKey("credit", "k"))
	want := min(burst, 6+rate*float64(h.poolAt-end.UnixMicro())/1e6)
	if !near(h.tokens, want, 1e-6) {
		t.Errorf("the pool %dus after the credit ended holds %v, want %v: refilled from the end at %v/s",
			h.poolAt-end.UnixMicro(), h.tokens, want, rate)
	}
}

// TestCreditEndedByItsID: a take that names the instance's live credit
// ends it from now: the tokens the pool holds then stay as they are, and
// it refills into the room from then on. A take that names another id
// ends nothing.
func TestCreditEndedByItsID(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	key := store.RecordKey("credit", "k")
	const rate, burst = 1.0, 10
	creditTake(t, store, "a", 0, 0, 0, time.Minute, 0, rate, burst)
	tk := creditTake(t, store, "a", 1, 1000, 4, time.Minute, 0, rate, burst)
	if !tk.Allowed || tk.Credit != 4 {
		t.Fatalf("the take: %+v, want 4 of credit", tk)
	}
	if left, err := store.GivePool(context.Background(), "credit", "k", rate, burst, 2, tk.At); err != nil || left != 6 {
		t.Fatalf("a refund: %d left, %v; want 6", left, err)
	}
	creditTake(t, store, "a", 0, 1000, 0, time.Minute, tk.CreditID+1, rate, burst)
	h := readPlacement(t, rdb, key)
	if r := h.records["a"]; r.credit != 4 || r.creditUS != tk.At.Add(time.Minute).UnixMicro() || r.creditID != int64(tk.CreditID) ||
		!near(h.tokens, 6, 1e-9) {
		t.Fatalf("after a take naming another id: record %+v, pool %v; want the credit kept, the pool at 6", r, h.tokens)
	}
	creditTake(t, store, "a", 0, 1000, 0, time.Minute, tk.CreditID, rate, burst)
	h = readPlacement(t, rdb, key)
	if r := h.records["a"]; r.creditAt(h.now) != 0 || !near(h.tokens, 6, 1e-9) {
		t.Fatalf("after a take naming the credit: record %+v, pool %v; want no credit, the pool still at 6", r, h.tokens)
	}
	ended := h.poolAt
	creditTake(t, store, "a", 0, 1000, 0, time.Minute, 0, rate, burst)
	h = readPlacement(t, rdb, key)
	if want := min(burst, 6+rate*float64(h.poolAt-ended)/1e6); !near(h.tokens, want, 1e-6) {
		t.Errorf("the pool after the credit ended: %v, want %v", h.tokens, want)
	}
}

// TestAskCarriesCredit: a grant leaves the pool room for the other
// instances' live credits, and an ask that replaces an exact record by a
// lease record carries the instance's live credit over, which it may spend
// until it hears the grant; a lease's part of the burst covers its credit,
// which then leaves the others' grants alone.
func TestAskCarriesCredit(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	const rate, burst = 10.0, 10
	creditTake(t, store, "a", 0, 0, 0, time.Minute, 0, rate, burst)
	tk := creditTake(t, store, "a", 1, 1, 4, time.Minute, 0, rate, burst)
	if !tk.Allowed || tk.Credit != 4 {
		t.Fatalf("a's take: %+v, want 4 of credit", tk)
	}
	// b wants the whole rate: contended with a's demand of 1/s, a fair
	// share of 9, of which the pool keeps a's credit's part of the burst.
	gb := ask(t, store, global.LeaseAsk{Limit: "credit", Key: "k", Instance: "b", Gen: 1, Want: rate, Rate: rate,
		Burst: burst, Instances: 2, TTL: time.Minute, MaxTTL: time.Minute})
	if !near(gb.Granted, rate*(1-4.0/burst), 1e-9) {
		t.Errorf("b's grant beside a's credit of 4: %v, want %v", gb.Granted, rate*(1-4.0/burst))
	}
	// a asks for 5/s and gets what b leaves, 4/s: 4 tokens of the burst,
	// which cover its credit.
	g := ask(t, store, global.LeaseAsk{Limit: "credit", Key: "k", Instance: "a", Gen: 3, Want: 5, Rate: rate,
		Burst: burst, Instances: 2, TTL: time.Minute, MaxTTL: time.Minute, Drain: true})
	if !near(g.Granted, 4, 1e-9) {
		t.Errorf("a's grant: %v, want 4", g.Granted)
	}
	h := readPlacement(t, rdb, store.RecordKey("credit", "k"))
	if r := h.records["a"]; !r.lease || r.credit != 4 || r.creditUS != tk.At.Add(time.Minute).UnixMicro() ||
		r.creditID != int64(tk.CreditID) {
		t.Errorf("a's record after its ask: %+v, want a lease carrying its credit", r)
	}
	// b's renewal: its fair share of 5 fits beside a's 4.
	g = ask(t, store, global.LeaseAsk{Limit: "credit", Key: "k", Instance: "b", Gen: 3, Want: rate, Rate: rate,
		Burst: burst, Instances: 2, TTL: time.Minute, MaxTTL: time.Minute, Running: gb.Granted, RunningFor: time.Minute})
	if !near(g.Granted, 5, 1e-9) {
		t.Errorf("b's renewal beside a's lease of 4 tokens of the burst and its credit of 4: %v, want 5", g.Granted)
	}
}
