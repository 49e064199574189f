package workload

import (
	"math"
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestExact(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		rate  float64
		burst int
		at    []time.Duration
		want  []bool
	}{
		{"burst then empty", 10, 2, []time.Duration{0, 0, 0}, []bool{true, true, false}},
		{"refills at rate", 10, 1, []time.Duration{0, 50 * ms, 100 * ms, 150 * ms, 200 * ms}, []bool{true, false, true, false, true}},
		{"never above burst", 1000, 2, []time.Duration{0, time.Second, time.Second, time.Second}, []bool{true, true, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Exact(tc.rate, tc.burst, tc.at); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestArrivalsAreFixedAndSorted(t *testing.T) {
	for _, sc := range Scenarios(QuickTiming()) {
		for _, poisson := range []bool{false, true} {
			a, b := sc.Arrivals(7, poisson), sc.Arrivals(7, poisson)
			total := 0
			for i := range a {
				if !slices.Equal(a[i], b[i]) {
					t.Fatalf("%s: slot %d differs between two calls with one seed", sc.Name, i)
				}
				if !slices.IsSortedFunc(a[i], func(x, y Arrival) int { return cmpDuration(x.At, y.At) }) {
					t.Errorf("%s: slot %d not sorted", sc.Name, i)
				}
				for _, ar := range a[i] {
					if ar.At < 0 || ar.At >= sc.End() || int(ar.Key) >= max(sc.Keys, 1) || ar.Key < 0 {
						t.Fatalf("%s: arrival %+v out of range", sc.Name, ar)
					}
				}
				total += len(a[i])
			}
			want := sc.Demand * sc.End().Seconds()
			// Shapes drawn at random have Demand as their mean: one draw
			// comes within a few percent (TestDemandIsTheMean).
			tol := 0.01
			if sc.Shape != ShapeSteady && sc.Shape != ShapeShift {
				tol = 0.2
			}
			if !poisson && (float64(total) < want*(1-tol) || float64(total) > want*(1+tol)+float64(sc.Instances)) {
				t.Errorf("%s: %d arrivals, want about %.0f", sc.Name, total, want)
			}
		}
	}
}

// find returns the scenario of Scenarios(timing) called name.
func find(t *testing.T, timing Timing, name string) Scenario {
	t.Helper()
	for _, s := range Scenarios(timing) {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no scenario %s", name)
	return Scenario{}
}

func TestSkewAndChurn(t *testing.T) {
	find := func(name string) Scenario { return find(t, QuickTiming(), name) }
	sk := find(Skewed).Arrivals(1, false)
	total := 0
	for _, a := range sk {
		total += len(a)
	}
	if share := float64(len(sk[0])) / float64(total); share < 0.89 || share > 0.91 {
		t.Errorf("skewed: slot 0 has %.3f of the arrivals, want 0.9", share)
	}

	ch := find(Churn)
	var leave, join time.Duration
	for _, e := range ch.Events {
		switch e.Kind {
		case Leave:
			leave = e.At
		case Join:
			join = e.At
		}
	}
	arr := ch.Arrivals(1, false)
	for _, a := range arr[3] {
		if a.At >= leave && a.At < join {
			t.Fatalf("churn: slot 3 has an arrival at %v, while it is down [%v, %v)", a.At, leave, join)
		}
	}
	total = 0
	for _, a := range arr {
		total += len(a)
	}
	if want := ch.Demand * ch.End().Seconds(); float64(total) < want*0.99 {
		t.Errorf("churn: %d arrivals, want about %.0f: the down slot's arrivals must go elsewhere", total, want)
	}
}

func TestKeysAreZipf(t *testing.T) {
	var keys Scenario
	for _, s := range Scenarios(DefaultTiming()) {
		if s.Name == Keys {
			keys = s
		}
	}
	count := map[int32]int{}
	total := 0
	for _, a := range keys.Arrivals(1, false) {
		for _, ar := range a {
			count[ar.Key]++
			total++
		}
	}
	// P(k) ∝ (1+k)^-1.1 over 10 000 keys: the top key takes about 14%,
	// and key 9 about a tenth of that.
	if top := float64(count[0]) / float64(total); top < 0.10 || top > 0.18 {
		t.Errorf("most popular key has %.3f of the arrivals, want about 0.14", top)
	}
	if r := float64(count[9]) / float64(count[0]); r < 0.05 || r > 0.12 {
		t.Errorf("key 9 over key 0 is %.3f, want about 0.08", r)
	}
	if len(count) < 2000 {
		t.Errorf("only %d distinct keys", len(count))
	}
}

func TestReference(t *testing.T) {
	sc := Scenario{Name: "r", Instances: 2, Rate: 10, Burst: 5, Keys: 1, Demand: 100,
		Warmup: time.Second, Measure: 2 * time.Second, Bucket: 100 * time.Millisecond}
	ref := sc.Reference(sc.Arrivals(1, false))
	// Over the measured 2 s the bucket is empty at the start and refills
	// at 10/s: about 20 admitted, of 200 arrivals.
	if ref.Admitted < 19 || ref.Admitted > 21 {
		t.Errorf("reference admits %d in the measured window, want about 20", ref.Admitted)
	}
	if ref.Arrivals != 200 {
		t.Errorf("%d arrivals in the measured window, want 200", ref.Arrivals)
	}
	if len(ref.Series) != 30 {
		t.Errorf("%d buckets, want 30", len(ref.Series))
	}
	sum := 0
	for _, n := range ref.Series {
		sum += n
	}
	if sum != 5+30 && sum != 5+29 && sum != 5+31 {
		t.Errorf("reference admits %d over the run, want burst 5 + about 30", sum)
	}
}

// TestReferenceSlots: the reference counts each slot's (instance's)
// arrivals, and splits what it admits max-min fair over them, bucket by
// bucket: the shares add up to its admissions, none is above its slot's
// arrivals, and a light slot is owed all of its arrivals while the heavy
// one takes the rest.
func TestReferenceSlots(t *testing.T) {
	sc := Scenario{Name: "r", Instances: 3, Rate: 100, Burst: 10, Keys: 1, Demand: 200,
		Weights: []float64{0.8, 0.15, 0.05}, Warmup: time.Second, Measure: 2 * time.Second, Bucket: 100 * time.Millisecond}
	ref := sc.Reference(sc.Arrivals(1, false))
	arrivals, fair := 0, 0.0
	for i := range ref.SlotArrivals {
		arrivals += ref.SlotArrivals[i]
		fair += ref.SlotFair[i]
		if ref.SlotFair[i] > float64(ref.SlotArrivals[i])+1e-9 {
			t.Errorf("slot %d owed %v of %d arrivals", i, ref.SlotFair[i], ref.SlotArrivals[i])
		}
	}
	if len(ref.SlotArrivals) != 3 || arrivals != ref.Arrivals || math.Abs(fair-float64(ref.Admitted)) > 1e-6 {
		t.Errorf("slots owed %v of %v; want three adding up to %d of %d", ref.SlotFair, ref.SlotArrivals, ref.Admitted, ref.Arrivals)
	}
	// 200/s against 100/s: the light slots (30/s and 10/s) are owed all
	// they ask, bucket by bucket.
	for i := 1; i < 3; i++ {
		if math.Abs(ref.SlotFair[i]-float64(ref.SlotArrivals[i])) > 1e-9 {
			t.Errorf("light slot %d owed %v of its %d arrivals; want all", i, ref.SlotFair[i], ref.SlotArrivals[i])
		}
	}
	sc.Keys = 3
	if ref := sc.Reference(sc.Arrivals(1, false)); ref.SlotArrivals != nil || ref.SlotFair != nil {
		t.Errorf("slots of three keys: %v, %v; want none", ref.SlotArrivals, ref.SlotFair)
	}
}

func TestFairSplit(t *testing.T) {
	for _, tc := range []struct {
		total   float64
		demands []float64
		want    []float64
	}{
		{10, []float64{8, 1, 3}, []float64{6, 1, 3}},
		{10, []float64{5, 5}, []float64{5, 5}},
		{10, []float64{2, 3}, []float64{2, 3}},
		{9, []float64{6, 6, 6}, []float64{3, 3, 3}},
		{0, []float64{1, 2}, []float64{0, 0}},
		{4, nil, []float64{}},
	} {
		if got := FairSplit(tc.total, tc.demands); !slices.Equal(got, tc.want) {
			t.Errorf("FairSplit(%v, %v) = %v; want %v", tc.total, tc.demands, got, tc.want)
		}
	}
}

func TestPeak(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		at   []time.Duration
		w    time.Duration
		most int
		from time.Duration
	}{
		{"none", nil, time.Second, 0, 0},
		{"one", []time.Duration{5 * ms}, time.Second, 1, 5 * ms},
		{"window is half-open", []time.Duration{0, 1000 * ms, 1000 * ms}, time.Second, 2, 1000 * ms},
		{"earliest of equals", []time.Duration{0, 10 * ms, 1500 * ms, 1510 * ms}, time.Second, 2, 0},
		{"cluster later", []time.Duration{0, 900 * ms, 1200 * ms, 1300 * ms, 1899 * ms}, time.Second, 4, 900 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			most, from := Peak(tc.at, tc.w)
			if most != tc.most || from != tc.from {
				t.Errorf("Peak = %d from %v, want %d from %v", most, from, tc.most, tc.from)
			}
		})
	}
}

func TestReferencePeak(t *testing.T) {
	sc := Scenario{Name: "r", Instances: 2, Rate: 10, Burst: 5, Keys: 1, Demand: 100,
		Warmup: time.Second, Measure: 2 * time.Second, Bucket: 100 * time.Millisecond}
	ref := sc.Reference(sc.Arrivals(1, false))
	// The full bucket at the start, then 10/s: 5 + 10 in the first second,
	// less the refill still owed at its end.
	if ref.Peak < 14 || ref.Peak > 15 || ref.PeakFrom != 0 {
		t.Errorf("reference peak %d from %v, want 14 or 15 from 0", ref.Peak, ref.PeakFrom)
	}
	sc.Keys = 3
	if ref := sc.Reference(sc.Arrivals(1, false)); ref.Peak != 0 {
		t.Errorf("reference peak %d on three keys, want none", ref.Peak)
	}
}

// TestDemandIsTheMean checks that Demand is the mean arrival rate of the
// shapes drawn at random, over many seeds, by default and in a variant.
func TestDemandIsTheMean(t *testing.T) {
	const seeds = 20
	variant := Variant{Instances: 16, RateFactor: 0.37, BurstFactor: 1.4}.Scenarios(DefaultTiming())
	for _, sc := range append(Scenarios(DefaultTiming()), variant...) {
		if sc.Shape == ShapeSteady || sc.Shape == ShapeShift {
			continue
		}
		total := 0
		for seed := range uint64(seeds) {
			for _, a := range sc.Arrivals(seed, false) {
				total += len(a)
			}
		}
		got := float64(total) / seeds / sc.End().Seconds()
		if math.Abs(got/sc.Demand-1) > 0.03 {
			t.Errorf("%s on %d instances: %.0f arrivals per second over %d seeds, Demand says %.0f", sc.Name, sc.Instances, got, seeds, sc.Demand)
		}
	}
}

// bySlotAndKey groups the arrival times of a schedule by slot and key.
func bySlotAndKey(arr [][]Arrival) map[[2]int32][]time.Duration {
	m := map[[2]int32][]time.Duration{}
	for slot, a := range arr {
		for _, ar := range a {
			k := [2]int32{int32(slot), ar.Key}
			m[k] = append(m[k], ar.At)
		}
	}
	return m
}

func TestThinStaysWithinShares(t *testing.T) {
	for _, timing := range []Timing{DefaultTiming(), QuickTiming()} {
		sc := find(t, timing, Thin)
		for seed := range uint64(3) {
			arr := sc.Arrivals(seed, false)
			keys := map[int32]int{} // instances per key
			for sk, at := range bySlotAndKey(arr) {
				keys[sk[1]]++
				// A bucket of the instance's share, rate/N with a burst of
				// one, admits every arrival: nothing beyond the share.
				for i, ok := range Exact(sc.Rate/float64(sc.Instances), 1, at) {
					if !ok {
						t.Fatalf("seed %d: slot %d, key %d: arrival %d at %v exceeds the share %.1f/s",
							seed, sk[0], sk[1], i, at[i], sc.Rate/float64(sc.Instances))
					}
				}
			}
			spread := 0
			for _, n := range keys {
				if n > 1 {
					spread++
				}
			}
			if timing == DefaultTiming() && (len(keys) < 1000 || spread < len(keys)/2) {
				t.Errorf("seed %d: %d keys, %d of them on more than one instance: want many keys, most spread", seed, len(keys), spread)
			}
			ref := sc.Reference(arr)
			if ref.Admitted != ref.Arrivals {
				t.Errorf("seed %d: the exact buckets admit %d of %d thin arrivals, want all", seed, ref.Admitted, ref.Arrivals)
			}
		}
	}
}

func TestSprayed(t *testing.T) {
	sc := find(t, DefaultTiming(), Sprayed)
	if sc.Burst > 5 || sc.Burst >= 2*sc.Instances {
		t.Errorf("burst %d: want a small one, split poorly over %d instances", sc.Burst, sc.Instances)
	}
	arr := sc.Arrivals(1, false)
	type key struct {
		all     []Arrival
		bySlot  []int
		changes int // consecutive requests on different instances
	}
	keys := map[int32]*key{}
	var merged []struct {
		Arrival
		slot int
	}
	for slot, a := range arr {
		for _, ar := range a {
			merged = append(merged, struct {
				Arrival
				slot int
			}{ar, slot})
		}
	}
	slices.SortStableFunc(merged, func(a, b struct {
		Arrival
		slot int
	}) int {
		return cmpDuration(a.At, b.At)
	})
	last := map[int32]int{}
	for _, m := range merged {
		k := keys[m.Key]
		if k == nil {
			k = &key{bySlot: make([]int, sc.Instances)}
			keys[m.Key] = k
		} else if last[m.Key] != m.slot {
			k.changes++
		}
		last[m.Key] = m.slot
		k.all = append(k.all, m.Arrival)
		k.bySlot[m.slot]++
	}
	if len(keys) != sc.Keys {
		t.Fatalf("%d keys have arrivals, want all %d", len(keys), sc.Keys)
	}
	for slot, a := range arr {
		if f := float64(len(a)) / float64(len(merged)); f < 0.23 || f > 0.27 {
			t.Errorf("slot %d has %.3f of the requests, want about 1/%d", slot, f, sc.Instances)
		}
	}
	for id, k := range keys {
		perSec := float64(len(k.all)) / sc.End().Seconds()
		if perSec < sprayLow*sc.Rate*0.95 || perSec > sprayHigh*sc.Rate*1.05 {
			t.Errorf("key %d wants %.1f/s, want %g to %g times its rate %g", id, perSec, sprayLow, sprayHigh, sc.Rate)
		}
		// Sprayed at random over 4 instances: each has some of every key
		// (a quarter on average), and three requests in four go to
		// another instance than the request before them.
		for slot, n := range k.bySlot {
			if f := float64(n) / float64(len(k.all)); f == 0 || f > 0.5 {
				t.Errorf("key %d: slot %d has %.2f of its requests, want about 1/%d", id, slot, f, sc.Instances)
			}
		}
		if f := float64(k.changes) / float64(len(k.all)-1); f < 0.6 || f > 0.9 {
			t.Errorf("key %d: %.2f of its consecutive requests change instance, want about 0.75", id, f)
		}
	}
}

func TestStickyKeysStayOnOneInstance(t *testing.T) {
	sc := find(t, DefaultTiming(), Sticky)
	for _, poisson := range []bool{false, true} {
		arr := sc.Arrivals(1, poisson)
		slotOf := map[int32]int{}
		first := map[int32][]time.Duration{}
		for slot, a := range arr {
			for _, ar := range a {
				if s, ok := slotOf[ar.Key]; ok && s != slot {
					t.Fatalf("poisson %v: key %d on slots %d and %d, want one", poisson, ar.Key, s, slot)
				}
				slotOf[ar.Key] = slot
				first[ar.Key] = append(first[ar.Key], ar.At)
			}
		}
		// Every key arrives with a burst of Burst requests at one instant,
		// then sends less often than that.
		starts := make([]int, 8) // keys starting in each eighth of the run
		perSlot := make([]int, sc.Instances)
		for key, at := range first {
			if len(at) < sc.Burst || at[0] != at[sc.Burst-1] || (len(at) > sc.Burst && at[sc.Burst] == at[0]) {
				t.Fatalf("poisson %v: key %d starts %v, want %d requests at once", poisson, key, at[:min(len(at), sc.Burst+1)], sc.Burst)
			}
			starts[int(at[0]*8/sc.End())]++
			perSlot[slotOf[key]]++
			if d := at[len(at)-1] - at[0]; d > sc.Period {
				t.Errorf("poisson %v: key %d lives %v, longer than %v", poisson, key, d, sc.Period)
			}
		}
		// Fresh keys come all through the run, to every instance.
		for i, n := range starts {
			if n == 0 {
				t.Errorf("poisson %v: no fresh key in eighth %d of the run: %v", poisson, i, starts)
			}
		}
		for slot, n := range perSlot {
			if n == 0 {
				t.Errorf("poisson %v: no key on slot %d", poisson, slot)
			}
		}
		if !poisson && len(first) != sc.Keys {
			t.Errorf("%d keys arrived, want %d", len(first), sc.Keys)
		}
	}
}

func TestPulseHasPulses(t *testing.T) {
	sc := find(t, DefaultTiming(), Pulse)
	arr := sc.Arrivals(1, false)
	// Slot 0 wants twice the limit all the time.
	eighth := sc.End() / 8
	counts := make([]int, 8)
	for _, a := range arr[0] {
		counts[a.At/eighth]++
	}
	for i, n := range counts {
		if want := pulseDemand * sc.Rate * eighth.Seconds(); math.Abs(float64(n)-want) > 1 {
			t.Errorf("slot 0 has %d arrivals in eighth %d of the run, want %.0f", n, i, want)
		}
	}
	// The others send pulses Spell long at the same rate, apart by half to
	// one and a half Period, and never all at once.
	var firsts []time.Duration
	for slot := 1; slot < sc.Instances; slot++ {
		var pulses [][]time.Duration
		for i, a := range arr[slot] {
			if i == 0 || a.At-arr[slot][i-1].At > sc.Spell {
				pulses = append(pulses, nil)
			}
			pulses[len(pulses)-1] = append(pulses[len(pulses)-1], a.At)
		}
		if len(pulses) < 2 {
			t.Fatalf("slot %d: %d pulses in %v, want one about every %v", slot, len(pulses), sc.End(), sc.Period)
		}
		for i, p := range pulses {
			if d := p[len(p)-1] - p[0]; d >= sc.Spell {
				t.Errorf("slot %d: pulse %d lasts %v, want under %v", slot, i, d, sc.Spell)
			}
			want := pulseDemand * sc.Rate * sc.Spell.Seconds()
			if last := p[0]+sc.Spell >= sc.End(); !last && math.Abs(float64(len(p))-want) > 1 {
				t.Errorf("slot %d: pulse %d has %d arrivals, want %.0f", slot, i, len(p), want)
			}
			if i > 0 {
				if gap := p[0] - pulses[i-1][0]; gap < time.Duration(pulseGapLow*float64(sc.Period))-sc.Spell/10 ||
					gap > time.Duration(pulseGapHigh*float64(sc.Period))+sc.Spell/10 {
					t.Errorf("slot %d: pulse %d starts %v after the one before, want %g to %g times %v", slot, i, gap, pulseGapLow, pulseGapHigh, sc.Period)
				}
			}
		}
		firsts = append(firsts, pulses[0][0])
	}
	if slices.Min(firsts) == slices.Max(firsts) {
		t.Errorf("every instance pulses first at %v: want pulses at their own times", firsts[0])
	}
}

func TestShiftMoves(t *testing.T) {
	sc := find(t, DefaultTiming(), Shift)
	if sc.ShiftAt <= sc.Warmup || sc.ShiftAt >= sc.End() {
		t.Fatalf("shift at %v, want within the measured window [%v, %v)", sc.ShiftAt, sc.Warmup, sc.End())
	}
	arr := sc.Arrivals(1, false)
	before, after := make([]int, sc.Instances), make([]int, sc.Instances)
	var nb, na int
	for slot, a := range arr {
		for _, ar := range a {
			if ar.At < sc.ShiftAt {
				before[slot]++
				nb++
			} else {
				after[slot]++
				na++
			}
		}
	}
	if f := float64(before[0]) / float64(nb); f < 0.84 || f > 0.86 {
		t.Errorf("before the shift slot 0 has %.3f of the arrivals, want 0.85", f)
	}
	if f := float64(after[2]) / float64(na); f < 0.84 || f > 0.86 {
		t.Errorf("after the shift slot 2 has %.3f of the arrivals, want 0.85", f)
	}
	if f := float64(after[0]) / float64(na); f > 0.06 {
		t.Errorf("after the shift slot 0 still has %.3f of the arrivals", f)
	}
	for _, c := range []struct {
		name string
		n    int
		d    time.Duration
	}{{"before", nb, sc.ShiftAt}, {"after", na, sc.End() - sc.ShiftAt}} {
		if got := float64(c.n) / c.d.Seconds(); math.Abs(got/sc.Demand-1) > 0.01 {
			t.Errorf("%s the shift: %.0f arrivals per second, want %.0f", c.name, got, sc.Demand)
		}
	}
}

func TestShapeString(t *testing.T) {
	for s, want := range map[Shape]string{ShapeSteady: "steady", ShapeThin: "thin", ShapeSprayed: "sprayed",
		ShapeSticky: "sticky", ShapePulse: "pulse", ShapeShift: "shift", Shape(99): "Shape(99)"} {
		if got := s.String(); got != want {
			t.Errorf("%d: %q, want %q", int(s), got, want)
		}
	}
}

// TestVariant checks that a variant keeps each scenario's shape: the
// limits scaled and rounded, the demand scaled with the rate, the skew on
// one instance, churn's last instance leaving, and the default variant
// the same as Scenarios.
func TestVariant(t *testing.T) {
	timing := QuickTiming()
	if got, want := (Variant{}).Scenarios(timing), Scenarios(timing); !reflect.DeepEqual(got, want) {
		t.Errorf("the zero Variant changes the scenarios")
	}
	base := map[string]Scenario{}
	for _, s := range Scenarios(timing) {
		base[s.Name] = s
	}
	for _, v := range []Variant{
		{Instances: 3, RateFactor: 0.37, BurstFactor: 0.6},
		{Instances: 16, RateFactor: 2.1, BurstFactor: 1.4},
		{Instances: 6, RateFactor: 0.37, BurstFactor: 1.4},
	} {
		for _, s := range v.Scenarios(timing) {
			b := base[s.Name]
			name := s.Name + " " + v.String()
			if s.Instances != v.Instances {
				t.Errorf("%s: %d instances", name, s.Instances)
			}
			if want := math.Max(1, math.Round(b.Rate*v.RateFactor)); s.Rate != want {
				t.Errorf("%s: rate %g, want %g", name, s.Rate, want)
			}
			if want := max(1, int(math.Round(float64(b.Burst)*v.BurstFactor))); s.Burst != want {
				t.Errorf("%s: burst %d, want %d", name, s.Burst, want)
			}
			// Steady demand follows the rate; the shapes drawn at
			// random follow their own parameters (sticky's burst, pulse's
			// instances), which TestDemandIsTheMean checks.
			if s.Shape == ShapeSteady || s.Shape == ShapeShift {
				if got, want := s.Demand/s.Rate, b.Demand/b.Rate; math.Abs(got-want) > 1e-9 {
					t.Errorf("%s: demand %g times the rate, want %g", name, got, want)
				}
			}
			for _, w := range [][]float64{s.Weights, s.Later} {
				if w == nil {
					continue
				}
				sum := 0.0
				for _, x := range w {
					sum += x
				}
				if len(w) != s.Instances || math.Abs(sum-1) > 1e-9 {
					t.Errorf("%s: weights %v", name, w)
				}
			}
			for _, e := range s.Events {
				if (e.Kind == Leave || e.Kind == Join) && e.Slot != s.Instances-1 {
					t.Errorf("%s: %v of slot %d, want the last, %d", name, e.Kind, e.Slot, s.Instances-1)
				}
			}
			arr := s.Arrivals(1, false)
			if len(arr) != s.Instances {
				t.Fatalf("%s: %d schedules", name, len(arr))
			}
			if s.Name == Skewed {
				total := 0
				for _, a := range arr {
					total += len(a)
				}
				if share := float64(len(arr[0])) / float64(total); share < 0.89 || share > 0.91 {
					t.Errorf("%s: slot 0 has %.3f of the arrivals, want 0.9", name, share)
				}
			}
		}
	}
	if got := (Variant{Instances: 16, RateFactor: 0.37, BurstFactor: 0.6}).String(); got != "n=16 rate×0.37 burst×0.6" {
		t.Errorf("String() = %q", got)
	}
	if got := (Variant{}).String(); got != "n=4 rate×1 burst×1" {
		t.Errorf("String() = %q", got)
	}
}
