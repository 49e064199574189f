package placement

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The tests are step tables: a key's statistics and Redis's answers are
// handed to a Policy at t0 + k·tick, and what it returns is compared, as
// text, with what it must return.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const tick = 50 * time.Millisecond

func cfg(rate float64, burst int) Config {
	return Config{Rate: rate, Burst: burst, Tick: tick, ContendedTTL: 600 * time.Millisecond, UncontendedTTL: 5 * time.Second}
}

// at is the instant k ticks after t0.
func at(k int) time.Time { return t0.Add(time.Duration(k) * tick) }

// harness drives one key of a Policy.
type harness struct {
	t       *testing.T
	p       *Policy
	n       int
	created time.Time
	asked   int64
	seen    time.Time
	sent    time.Time // of the last ask
	last    *Out      // the last ask
	g       Gauges
}

func newHarness(t *testing.T, c Config, n int) *harness {
	return &harness{t: t, p: New(c), n: n, created: at(0), seen: at(0)}
}

// tick hands the key's statistics at tick k, after perTick more tokens
// asked for since the last (seen at k when perTick > 0), and returns what
// the policy says, as text.
func (h *harness) tick(k int, perTick int64) string {
	h.t.Helper()
	if perTick > 0 {
		h.asked += perTick
		h.seen = at(k)
	}
	h.g = Gauges{}
	st := Stats{Key: "k", Asked: h.asked, Created: h.created, LastSeen: h.seen}
	out := h.p.Step(at(k), h.n, &st, nil, &h.g)
	for i := range out {
		if out[i].Kind == Ask {
			h.sent, h.last = at(k), &out[i]
		}
	}
	return show(out)
}

// answer hands the answer g to the last ask and returns what the policy
// says.
func (h *harness) answer(g Grant) string {
	h.t.Helper()
	if h.last == nil {
		h.t.Fatal("no ask to answer")
	}
	o := h.last
	h.last = nil
	return show(h.p.Answer(h.sent, o, &g, nil))
}

// fail says the last ask got no answer.
func (h *harness) fail() {
	h.p.Failed(h.sent, h.last)
	h.last = nil
}

func show(out []Out) string {
	var b []string
	for _, o := range out {
		s := fmt.Sprintf("%v gen=%d", o.Kind, o.Gen)
		switch o.Kind {
		case Ask:
			s += fmt.Sprintf(" want=%.4g ttl=%v", o.Want, o.TTL)
			if o.Running > 0 {
				s += fmt.Sprintf(" running=%.4g for=%v", o.Running, o.RunningFor)
			}
			if o.Drain {
				s += " drain"
			}
		case Assign:
			s += fmt.Sprintf(" rate=%.4g burst=%d until=+%v give=%d", o.Rate, o.Burst, o.Until.Sub(t0), o.Give)
		}
		b = append(b, s)
	}
	return strings.Join(b, "; ")
}

func expect(t *testing.T, step string, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n got: %s\nwant: %s", step, got, want)
	}
}

// A key asked for at 1000/s (50 a tick) of a limit of 1000/s, burst 100,
// over four instances: worth a lease from its first tick with enough
// tokens; the grant goes into force with its part of the burst and the
// tokens moved from the pool, and the renewals follow at half the
// lifetime, saying what the key runs until it hears, with lifetimes that
// grow once the grant has settled.
func TestLeaseLifecycle(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	expect(t, "tick 1", h.tick(1, 50), "ask gen=3 want=1050 ttl=600ms drain")
	expect(t, "answer", h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 600 * time.Millisecond, Drained: 7}),
		"assign gen=4 rate=250 burst=25 until=+590ms give=7")
	for k := 2; k < 7; k++ {
		expect(t, fmt.Sprintf("tick %d", k), h.tick(k, 50), "")
	}
	if h.g.Leased != 250 || h.g.Contended != 1 {
		t.Errorf("gauges %+v, want 250 leased, 1 contended", h.g)
	}
	// Renewals at half the lifetime: 600 ms, then 2.4 s and 5 s once three
	// answers in a row left the grant where it was.
	expect(t, "tick 7", h.tick(7, 50), "ask gen=5 want=1050 ttl=600ms running=250 for=240ms")
	expect(t, "renewal 1", h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 600 * time.Millisecond}),
		"assign gen=6 rate=250 burst=25 until=+890ms give=0")
	h.tick(8, 50)
	h.tick(9, 50)
	h.tick(10, 50)
	h.tick(11, 50)
	h.tick(12, 50)
	expect(t, "tick 13", h.tick(13, 50), "ask gen=7 want=1050 ttl=600ms running=250 for=240ms")
	h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 600 * time.Millisecond})
	for k := 14; k < 19; k++ {
		h.tick(k, 50)
	}
	expect(t, "tick 19", h.tick(19, 50), "ask gen=9 want=1050 ttl=2.4s running=250 for=240ms")
	expect(t, "renewal 3", h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 2400 * time.Millisecond}),
		"assign gen=10 rate=250 burst=25 until=+3.11s give=0")
	for k := 20; k < 43; k++ {
		expect(t, fmt.Sprintf("tick %d", k), h.tick(k, 50), "")
	}
	expect(t, "tick 43", h.tick(43, 50), "ask gen=11 want=1050 ttl=5s running=250 for=960ms")
}

// Keys whose lease would split the burst too finely, or cost more
// renewals than their exact decisions, never ask.
func TestNotWorthALease(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rate    float64
		burst   int
		n       int
		perTick int64 // tokens asked per tick (50 ms)
		every   int   // ... every this many ticks
	}{
		// Sprayed near its limit: 8/s burst 5 over four instances, 3/s
		// here. A lease would hold 1.9 tokens of the burst.
		{"sprayed", 8, 5, 4, 1, 7},
		// Thin: 20/s burst 8, 4 instances, 2.8/s here: a lease would fill
		// under 2 tokens per renewal.
		{"thin", 20, 8, 4, 1, 7},
		// A big burst but a trickle: 1/s.
		{"trickle", 1000, 1000, 4, 1, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, cfg(tc.rate, tc.burst), tc.n)
			for k := 1; k <= 200; k++ {
				var a int64
				if k%tc.every == 0 {
					a = tc.perTick
				}
				if got := h.tick(k, a); got != "" {
					t.Fatalf("tick %d: %s, want nothing", k, got)
				}
			}
			if h.p.Len() != 0 {
				t.Errorf("tracks %d keys, want 0", h.p.Len())
			}
		})
	}
}

// A key far above its fair share is worth a lease whatever its part of the
// burst: it is saturated, and a lease admits what the pool would. Zipf's
// hottest keys are so: 10/s burst 10, 125/s here.
func TestSaturatedKeyLeases(t *testing.T) {
	h := newHarness(t, cfg(10, 10), 4)
	got := ""
	for k := 1; k <= 4 && got == ""; k++ {
		got = h.tick(k, 6)
	}
	if !strings.HasPrefix(got, "ask gen=3") {
		t.Fatalf("got %q, want an ask", got)
	}
	// Granted its fair share, 2.5/s and 2 tokens of burst: in force.
	expect(t, "answer", h.answer(Grant{Granted: 2.5, Fair: 2.5, Contended: true, In: 600 * time.Millisecond}),
		"assign gen=4 rate=2.5 burst=2 until=+640ms give=0")
}

// A grant without a whole token of burst, or a stale answer, sends the key
// back to exact decisions under a new generation, whose takes replace the
// record the ask left; it asks again only a renewal period after.
func TestUnusableGrant(t *testing.T) {
	for _, g := range []Grant{
		{Granted: 0, Fair: 5, Contended: true, In: 600 * time.Millisecond},
		{Granted: 5, Fair: 5, Contended: true, In: 600 * time.Millisecond}, // 0.5 token of burst
		{Stale: true},
	} {
		h := newHarness(t, cfg(1000, 100), 4)
		expect(t, "tick 1", h.tick(1, 50), "ask gen=3 want=1050 ttl=600ms drain")
		expect(t, "answer", h.answer(g), "mark gen=4")
		for k := 2; k < 7; k++ {
			expect(t, fmt.Sprintf("tick %d", k), h.tick(k, 50), "")
		}
		expect(t, "tick 7", h.tick(7, 50), "ask gen=6 want=1050 ttl=600ms drain")
	}
}

// A grant too small to run while the fair share would be enough (others
// hold more than theirs until they renew) keeps the key asking, deciding
// exactly, EarlyTicks ticks apart (as often as the others may renew early
// and give back what they hold above their shares): its record shows Redis
// what it wants, and the others' renewals leave it its share.
func TestStarvedAskerKeepsAsking(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	starved := Grant{Granted: 3, Fair: 250, Contended: true, In: 600 * time.Millisecond}
	expect(t, "tick 1", h.tick(1, 50), "ask gen=3 want=1050 ttl=600ms drain")
	expect(t, "answer", h.answer(starved), "")
	expect(t, "tick 2", h.tick(2, 50), "")
	expect(t, "tick 3", h.tick(3, 50), "ask gen=5 want=1050 ttl=600ms drain")
	expect(t, "answer", h.answer(starved), "")
	expect(t, "tick 4", h.tick(4, 50), "")
	expect(t, "tick 5", h.tick(5, 50), "ask gen=7 want=1050 ttl=600ms drain")
	expect(t, "answer", h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 600 * time.Millisecond}),
		"assign gen=8 rate=250 burst=25 until=+790ms give=0")
}

// A renewal that gets no answer keeps the grant until it ends here, asking
// again at every tick; then the key is exact under the mark its grant's end
// gave it, with nothing to release (its record ends by itself).
func TestLapse(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	h.tick(1, 50)
	h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 600 * time.Millisecond})
	for k := 2; k < 7; k++ {
		h.tick(k, 50)
	}
	// The grant ends here at 590 ms, 0.9 of its lifetime. Each ask has a
	// generation of its own; the mark after the last is the key's.
	for k := 7; k < 12; k++ {
		expect(t, fmt.Sprintf("tick %d", k), h.tick(k, 50), fmt.Sprintf("ask gen=%d want=1050 ttl=600ms running=250 for=%v", 2*k-9, at(12).Add(-10*time.Millisecond).Sub(at(k))))
		h.fail()
	}
	expect(t, "tick 12", h.tick(12, 50), "mark gen=14")
	if h.g.Expired != 1 {
		t.Errorf("%d expired, want 1", h.g.Expired)
	}
	if st, gen := h.p.State("k"); st != Exact || gen != 14 {
		t.Errorf("state %v gen %d, want exact 14", st, gen)
	}
}

// A leased key whose decisions stop goes exact and then releases its
// record, once its demand would not fill half a token per renewal period,
// or at the latest when it has been idle for half the uncontended
// lifetime: it never runs a grant Redis has let go. (A busy key whose
// traffic stops keeps its lease until then too, asking for less: see
// TestFallShrinks.)
func TestQuietLeaseReleases(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	for k := 1; k <= 4; k++ {
		h.tick(k, 2) // 40/s
	}
	h.answer(Grant{Granted: 1000, Fair: 1000, In: 5 * time.Second})
	// Idle for half the uncontended lifetime from its last decision at
	// tick 4: its demand decayed, but not below half a token per renewal
	// period (LeaveRenewal) of its long uncontended lease.
	for k := 5; k < 54; k++ {
		expect(t, fmt.Sprintf("tick %d", k), h.tick(k, 0), "")
	}
	expect(t, "tick 54", h.tick(54, 0), "mark gen=4; release gen=4")
}

// A busy key whose traffic stops falls at once: over two looks it saw
// none of the tokens its demand would have brought. A contended lease then
// asks for what it wants now, nearly nothing, so that the others can have
// the rest; it keeps the lease, whose worth goes by the average, until
// that has decayed (clumps a few ticks apart do not churn it).
func TestFallShrinks(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	h.tick(1, 50)
	h.answer(Grant{Granted: 500, Fair: 500, Contended: true, In: 5 * time.Second})
	for k := 2; k < 10; k++ {
		if got := h.tick(k, 50); got != "" {
			h.answer(Grant{Granted: 500, Fair: 500, Contended: true, In: 5 * time.Second})
		}
	}
	got := ""
	for k := 10; k < 13 && got == ""; k++ {
		got = h.tick(k, 0)
	}
	if !strings.HasPrefix(got, "ask ") || !strings.Contains(got, " want=1 ") {
		t.Fatalf("after the traffic stopped: %q, want an ask for the least want (1/s)", got)
	}
	if st, _ := h.p.State("k"); st != Leased {
		t.Errorf("after the fall: %v, want still leased", st)
	}
}

// A contended lease whose demand falls renews early, so that the others
// can have what it no longer uses; one whose demand grows while it is held
// below its fair share asks for more.
func TestEarlyRenewal(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	h.tick(1, 50)
	h.answer(Grant{Granted: 900, Fair: 900, Contended: true, In: 5 * time.Second})
	got := ""
	k := 2
	for ; k < 40 && got == ""; k++ {
		got = h.tick(k, 10) // 200/s
	}
	if !strings.HasPrefix(got, "ask gen=5") || k > 15 {
		t.Fatalf("tick %d: %q, want an early renewal within half a second", k-1, got)
	}
	h.answer(Grant{Granted: 240, Fair: 500, Contended: true, In: 5 * time.Second})
	got = ""
	for k2 := k; k2 < k+40 && got == ""; k2++ {
		got = h.tick(k2, 25) // 500/s, above 1.25x what it holds
	}
	if !strings.HasPrefix(got, "ask gen=7") {
		t.Fatalf("%q, want an early renewal", got)
	}
}

// A renewal that shrinks the grant is followed at the next tick by one that
// says the key runs the smaller grant: until then Redis counts the larger
// one, which the key ran until it heard.
func TestShrinkIsToldAtOnce(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	h.tick(1, 50)
	h.answer(Grant{Granted: 900, Fair: 900, Contended: true, In: 5 * time.Second})
	got, k := "", 2
	for ; got == ""; k++ {
		got = h.tick(k, 10) // 200/s: an early renewal
	}
	expect(t, "shrink", h.answer(Grant{Granted: 240, Fair: 500, Contended: true, In: 5 * time.Second}),
		fmt.Sprintf("assign gen=6 rate=240 burst=24 until=+%v give=0", at(k-1).Add(4500*time.Millisecond).Sub(t0)))
	got = h.tick(k, 10)
	if !strings.HasPrefix(got, "ask gen=7") || !strings.Contains(got, "running=240 ") {
		t.Fatalf("tick after the shrink: %q, want an ask running 240", got)
	}
}

// A contended lease whose want grows past what it last asked for renews
// early, however its grant compares with its fair share: the others may
// have less demand now.
func TestEarlyGrowth(t *testing.T) {
	h := newHarness(t, cfg(300, 45), 4)
	for k := 1; k < 20; k++ {
		h.tick(k, 2) // 40/s
		if h.last != nil {
			h.answer(Grant{Granted: 44, Fair: 44, Contended: true, In: 5 * time.Second})
		}
	}
	got, k := "", 20
	for ; got == "" && k < 40; k++ {
		got = h.tick(k, 20) // 400/s
	}
	if !strings.HasPrefix(got, "ask ") || k > 30 {
		t.Fatalf("tick %d: %q, want an early renewal within half a second of the jump", k-1, got)
	}
}

// A lease settles, its lifetime growing, only while both its grant and the
// demand of the key's instances stay put: a demand that moves (a pulse
// elsewhere, starting or ending) keeps renewals a contended lifetime apart.
func TestMovingDemandKeepsLeasesShort(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	total := 1100.0
	for k := 1; k < 120; k++ {
		if got := h.tick(k, 50); strings.HasPrefix(got, "ask ") {
			if !strings.Contains(got, "ttl=600ms") {
				t.Fatalf("tick %d: %q, want a contended lifetime while the demand moves", k, got)
			}
			total *= 1.5 // the others' demand moves at every answer
			h.answer(Grant{Granted: 250, Fair: 250, Demand: total, Contended: true, In: 600 * time.Millisecond})
		}
	}
}

// While Redis is taken to be unreachable nothing is sent: a grant runs
// out into the exact placement, and a key worth a lease does not ask.
func TestDegraded(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	h.p.SetDegraded(true)
	expect(t, "tick 1", h.tick(1, 50), "")
	h.p.SetDegraded(false)
	h.tick(2, 50)
	h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 600 * time.Millisecond})
	h.p.SetDegraded(true)
	for k := 3; k < 13; k++ {
		expect(t, fmt.Sprintf("tick %d", k), h.tick(k, 50), "")
	}
	expect(t, "tick 13", h.tick(13, 50), "mark gen=4")
}

// The release of a forgotten key carries a generation newer than its
// record's, so that Redis deletes it; an answer to an ask of a key that
// moved on since is ignored.
func TestForget(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	h.tick(1, 50)
	h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 600 * time.Millisecond})
	expect(t, "forget", show(h.p.Forget("k", nil)), "release gen=4")
	if h.p.Len() != 0 {
		t.Fatal("forgotten key still tracked")
	}
	h = newHarness(t, cfg(1000, 100), 4)
	h.tick(1, 50)
	o := *h.last
	expect(t, "forget while asking", show(h.p.Forget("k", nil)), "release gen=4")
	expect(t, "late answer", show(h.p.Answer(h.sent, &o, &Grant{Granted: 250, Fair: 250, In: time.Second}, nil)), "")
}

// The release of a retired limit's key is newer than every record the
// instance may have left: its exact mark, its lease, and an ask whose
// answer never came (TestSetLimitsUnderLoad lost leases to that: the loop
// stopped with an ask in flight, and a release at the mark's next
// generation was older than the ask's record).
func TestRelease(t *testing.T) {
	expect(t, "untracked key", show([]Out{New(cfg(1000, 100)).Release("x", 7)}), "release gen=8")
	h := newHarness(t, cfg(1000, 100), 4)
	h.tick(1, 50) // ask gen=3, from mark 1
	h.fail()
	expect(t, "ask unanswered", show([]Out{h.p.Release("k", FirstGen)}), "release gen=4")
	h.tick(2, 50) // asks again, gen=5
	h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 600 * time.Millisecond})
	expect(t, "leased", show([]Out{h.p.Release("k", 6)}), "release gen=7")
	h.tick(8, 50) // renewal: ask gen=7, unanswered, the mark still 6
	expect(t, "renewal unanswered", show([]Out{h.p.Release("k", 6)}), "release gen=8")
	if !newer(1, 255) || newer(255, 1) || newer(3, 3) {
		t.Error("newer does not wrap as placement.lua's does")
	}
}

// Generations run 1 to 255 and wrap, never 0, which marks no key.
func TestNextGen(t *testing.T) {
	for _, tc := range []struct{ g, want uint8 }{{1, 2}, {254, 255}, {255, 1}} {
		if got := NextGen(tc.g); got != tc.want {
			t.Errorf("NextGen(%d) = %d, want %d", tc.g, got, tc.want)
		}
		if got := PrevGen(tc.want); got != tc.g {
			t.Errorf("PrevGen(%d) = %d, want %d", tc.want, got, tc.g)
		}
	}
}

// Demand follows traffic: a key's measured demand is its rate within a
// lifetime or two of a change, both ways.
func TestDemandFollowsTraffic(t *testing.T) {
	k := &key{}
	tau := 600 * time.Millisecond
	var asked int64
	for i := 1; i <= 60; i++ { // 3 s at 400/s
		asked += 20
		k.observe(instant(time.Duration(i)*tick), asked, tau)
	}
	if k.demand < 380 || k.demand > 420 {
		t.Errorf("demand %.1f after 3 s at 400/s, want about 400", k.demand)
	}
	for i := 61; i <= 84; i++ { // 1.2 s at 0
		k.observe(instant(time.Duration(i)*tick), asked, tau)
	}
	if k.demand > 400*0.15 {
		t.Errorf("demand %.1f 1.2 s after traffic stopped, want below 60", k.demand)
	}
}

// Compact rebuilds the map once fewer than a quarter of the most keys it
// held are left, keeping every key's state.
func TestCompact(t *testing.T) {
	p := New(cfg(1000, 100))
	for i := range 100 {
		st := Stats{Key: fmt.Sprint(i), Asked: 50, Created: at(0), LastSeen: at(1)}
		p.Step(at(1), 4, &st, nil, nil)
	}
	if p.Len() != 100 {
		t.Fatalf("%d keys tracked, want 100", p.Len())
	}
	for i := range 70 {
		p.Forget(fmt.Sprint(i), nil)
	}
	p.Compact()
	if p.peak != 100 {
		t.Errorf("30 of 100 keys left: rebuilt (peak %d), want the map kept", p.peak)
	}
	for i := 70; i < 80; i++ {
		p.Forget(fmt.Sprint(i), nil)
	}
	p.Compact()
	if p.peak != 20 || p.Len() != 20 {
		t.Errorf("20 of 100 keys left: %d keys, peak %d; want it rebuilt, 20 and 20", p.Len(), p.peak)
	}
	if st, gen := p.State("99"); st != Asking || gen != 3 {
		t.Errorf("key 99 after the rebuild: %v gen %d, want asking 3", st, gen)
	}
}

// A fall holds: a key whose traffic fell from 400/s to 20/s wants about
// 20/s from the look that saw it on, while its slower average, which says
// whether it keeps its lease, comes down over a lifetime or two. (The
// demand now once went back to that average as soon as the average came
// within FallBelow of the traffic, and asked for four times it.)
func TestFallHolds(t *testing.T) {
	k := &key{}
	tau := 600 * time.Millisecond
	var asked int64
	i := 0
	for ; i < 60; i++ { // 3 s at 400/s
		asked += 20
		k.observe(instant(time.Duration(i+1)*tick), asked, tau)
	}
	for ; i < 100; i++ { // 2 s at 20/s
		asked++
		k.observe(instant(time.Duration(i+1)*tick), asked, tau)
		if i >= 62 && (k.now < 15 || k.now > 30) {
			t.Fatalf("%v after the fall: demand now %.1f (average %.1f), want about 20", time.Duration(i-59)*tick, k.now, k.demand)
		}
	}
}

// A grant at least the key's want is not starved, however far below its
// fair share (an uncontended fair share carries part of what nobody wants):
// the key does not ask again until its renewal is due.
func TestGrantAboveWantIsNotStarved(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	for k := 1; k <= 4; k++ {
		h.tick(k, 2) // 40/s
	}
	if h.last == nil {
		t.Fatal("no ask after four ticks at 40/s")
	}
	h.answer(Grant{Granted: 100, Fair: 500, In: 5 * time.Second})
	for k := 5; k < 25; k++ {
		expect(t, fmt.Sprintf("tick %d", k), h.tick(k, 2), "")
	}
}

// Clumps keep their average: a key asked for in clumps (80 tokens in one
// tick, then three idle) has a demand about its 400/s average, though each
// idle spell lowers its demand now and each clump raises it again.
func TestClumpsKeepTheAverage(t *testing.T) {
	k := &key{}
	tau := 600 * time.Millisecond
	var asked int64
	for i := range 120 { // 6 s
		if i%4 == 3 {
			asked += 80
		}
		k.observe(instant(time.Duration(i+1)*tick), asked, tau)
		if i >= 40 && (k.demand < 250 || k.demand > 600) {
			t.Fatalf("tick %d: demand %.1f (now %.1f), want about the 400/s average", i, k.demand, k.now)
		}
	}
}

// Answers handed in late, 350 ms after their asks (callers saturate the
// CPU, and the loop waits that long to run): a lease of 600 ms renewed at
// half its lifetime would end before its renewal's answer lands. The
// policy keeps the lag, asks for leases of LagTTLs lags, and renews
// LagLead lags before the end; a prompt answer lowers the lag by LagDecay.
func TestLateAnswersLengthenLeases(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	const lag = 350 * time.Millisecond
	expect(t, "tick 1", h.tick(1, 50), "ask gen=3 want=1050 ttl=600ms drain")
	// It ends here at +590ms, under two lags after the answer at +400ms:
	// renew at once.
	expect(t, "late answer", h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 600 * time.Millisecond, Answered: at(1).Add(lag)}),
		"assign gen=4 rate=250 burst=25 until=+590ms give=0")
	if h.p.Lag() != lag {
		t.Errorf("lag %v, want %v", h.p.Lag(), lag)
	}
	expect(t, "tick 2", h.tick(2, 50), "ask gen=5 want=1050 ttl=1.4s running=250 for=490ms")
	expect(t, "late renewal", h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 1400 * time.Millisecond, Answered: at(2).Add(lag)}),
		"assign gen=6 rate=250 burst=25 until=+1.36s give=0")
	// Two lags before +1.36s, not half the lifetime (+800ms).
	for k := 3; k < 14; k++ {
		expect(t, fmt.Sprintf("tick %d", k), h.tick(k, 50), "")
	}
	expect(t, "tick 14", h.tick(14, 50), "ask gen=7 want=1050 ttl=1.4s running=250 for=660ms")
	h.answer(Grant{Granted: 250, Fair: 250, Contended: true, In: 1400 * time.Millisecond, Answered: at(14)})
	if want := time.Duration(float64(lag) * LagDecay); h.p.Lag() != want {
		t.Errorf("lag after a prompt answer %v, want %v", h.p.Lag(), want)
	}
}

// An ask says whether the key's last answered ask left a record in Redis
// that lives yet (Out.Recorded): Redis finding none has lost it, even when
// the key runs nothing (a starved asker). A key's first ask has none; a
// starved asker's next ask has one; once the key released it, none.
func TestAsksSayTheyHaveARecord(t *testing.T) {
	h := newHarness(t, cfg(1000, 100), 4)
	starved := Grant{Granted: 3, Fair: 250, Contended: true, In: 600 * time.Millisecond}
	recorded := func(what string, want bool) {
		t.Helper()
		if h.last == nil || h.last.Recorded != want {
			t.Errorf("%s: %+v, want Recorded %v", what, h.last, want)
		}
	}
	expect(t, "tick 1", h.tick(1, 50), "ask gen=3 want=1050 ttl=600ms drain")
	recorded("the first ask", false)
	h.answer(starved)
	expect(t, "tick 2", h.tick(2, 50), "")
	expect(t, "tick 3", h.tick(3, 50), "ask gen=5 want=1050 ttl=600ms drain")
	recorded("a starved asker's next ask", true)
	h.answer(starved)
	// Its traffic stops: it gives up, exact, and releases the record.
	released := false
	k := 4
	for ; !released && k < 200; k++ {
		released = strings.Contains(h.tick(k, 0), "release")
	}
	if !released {
		t.Fatal("an idle asker kept its record")
	}
	h.last = nil
	for ; h.last == nil && k < 400; k++ {
		h.tick(k, 50)
	}
	recorded("the first ask after the release", false)
}
