package workload

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// EventKind says what happens at an Event.
type EventKind int

const (
	// Pause makes Redis stop answering (CLIENT PAUSE): commands wait.
	Pause EventKind = iota + 1
	// Kill kills the Redis process, as a crash would.
	Kill
	// Restart brings Redis back on the same address, empty.
	Restart
	// Leave closes the instance of a slot; the others count one fewer.
	Leave
	// Join starts a new instance in a slot; the others count one more.
	Join
)

func (k EventKind) String() string {
	switch k {
	case Pause:
		return "pause"
	case Kill:
		return "kill"
	case Restart:
		return "restart"
	case Leave:
		return "leave"
	case Join:
		return "join"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is something the harness does at a fixed offset from the start of a
// run.
type Event struct {
	At   time.Duration
	Kind EventKind
	// Slot is the instance slot a Leave or Join is about.
	Slot int
}

// Scenario is one fixed plan of traffic. Every key has the same limit.
type Scenario struct {
	// Name identifies the scenario in reports.
	Name string
	// Instances is the number of instance slots; each has its own driver.
	Instances int
	// Rate is the limit of every key in tokens per second: a whole number,
	// since redis_rate takes an integer rate per period.
	Rate float64
	// Burst is the burst of every key in tokens.
	Burst int
	// Keys is the number of distinct keys; 1 means one key.
	Keys int
	// ZipfS is the exponent of the keys' Zipf popularity (above 1); 0
	// spreads arrivals over the keys round-robin.
	ZipfS float64
	// Demand is the total arrival rate over all instances, per second; in
	// the shapes drawn at random (Thin, Sprayed, Sticky, Pulse), its
	// expected mean over the run.
	Demand float64
	// Weights is each instance's share of Demand (Steady and Shift); nil
	// means even.
	Weights []float64
	// Shape lays Demand out over the instances, the keys and time; the
	// zero value is Steady. Shapes other than Steady ignore ZipfS.
	Shape Shape
	// Period and Spell time the shapes that change over time: in Pulse,
	// each pulsing instance sends a pulse Spell long, Period apart on
	// average; in Sticky a key lives at most Period. Zero in the others.
	Period, Spell time.Duration
	// ShiftAt and Later are Shift's: from ShiftAt on, each instance's
	// share of Demand is Later instead of Weights.
	ShiftAt time.Duration
	Later   []float64
	// Warmup is the start of the run that is not measured: leases and
	// connections settle there. Measure follows it.
	Warmup, Measure time.Duration
	// Bucket is the width of the time series of admissions.
	Bucket time.Duration
	// Events happen at fixed offsets from the start, in order.
	Events []Event
}

// End is the offset at which arrivals stop: Warmup + Measure.
func (s Scenario) End() time.Duration { return s.Warmup + s.Measure }

// Window returns the offsets between which the first Pause and the Restart
// happen, and whether the scenario has an outage at all.
func (s Scenario) Window() (from, to time.Duration, ok bool) {
	for _, e := range s.Events {
		switch e.Kind {
		case Pause, Kill:
			if !ok {
				from, ok = e.At, true
			}
		case Restart:
			to = e.At
		}
	}
	return from, to, ok
}

// KeyNames returns the names of the scenario's keys; arrivals refer to them
// by index. With Zipf popularity, index 0 is the most popular key.
func (s Scenario) KeyNames() []string {
	n := max(s.Keys, 1)
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("%s-%05d", s.Name, i)
	}
	return ks
}

// Arrival is one scheduled request.
type Arrival struct {
	// At is the offset from the start of the run when it is due.
	At time.Duration
	// Key is the index of its key in KeyNames.
	Key int32
}

// Arrivals returns each instance slot's schedule, sorted by At, over
// [0, End), laid out as the scenario's Shape says. In the Steady shape each
// slot receives its share of Demand at fixed intervals (or, with poisson,
// exponential gaps drawn from seed), slots being offset from one another by
// a fraction of an interval, and keys are drawn from seed; the other shapes
// are described at their constants. While a slot is down (between its Leave
// and its Join), its arrivals go round-robin to the slots that are up, as a
// load balancer would send them. The same Scenario and seed always give the
// same schedule.
func (s Scenario) Arrivals(seed uint64, poisson bool) [][]Arrival {
	var out [][]Arrival
	if s.Shape == ShapeSteady {
		out = s.steady(seed, poisson)
	} else {
		out = s.shaped(seed, poisson)
	}
	s.redirect(out)
	return out
}

// steady returns the schedules of the Steady shape.
func (s Scenario) steady(seed uint64, poisson bool) [][]Arrival {
	out := make([][]Arrival, s.Instances)
	for i := range out {
		rate := s.Demand * s.weight(i)
		if rate <= 0 {
			continue
		}
		interval := time.Duration(float64(time.Second) / rate)
		r := rand.New(rand.NewPCG(seed, uint64(i)))
		var zipf *rand.Zipf
		if s.Keys > 1 && s.ZipfS > 1 {
			zipf = rand.NewZipf(r, s.ZipfS, 1, uint64(s.Keys-1))
		}
		at := time.Duration(i) * interval / time.Duration(s.Instances)
		arr := make([]Arrival, 0, int(rate*s.End().Seconds())+1)
		for k := 0; at < s.End(); k++ {
			var key int32
			switch {
			case zipf != nil:
				key = int32(zipf.Uint64())
			case s.Keys > 1:
				key = int32((k*s.Instances + i) % s.Keys)
			}
			arr = append(arr, Arrival{At: at, Key: key})
			if poisson {
				at += time.Duration(r.ExpFloat64() * float64(interval))
			} else {
				at += interval
			}
		}
		out[i] = arr
	}
	return out
}

// weight is slot i's share of Demand.
func (s Scenario) weight(i int) float64 { return weightOf(s.Weights, i, s.Instances) }

// weightOf is slot i's share of demand by weights over n slots; nil
// weights share evenly.
func weightOf(weights []float64, i, n int) float64 {
	if weights == nil {
		return 1 / float64(n)
	}
	if i < len(weights) {
		return weights[i]
	}
	return 0
}

// redirect moves the arrivals of slots that are down to the slots that are
// up, round-robin, keeping every schedule sorted.
func (s Scenario) redirect(out [][]Arrival) {
	type gap struct {
		slot     int
		from, to time.Duration
	}
	var gaps []gap
	for _, e := range s.Events {
		switch e.Kind {
		case Leave:
			gaps = append(gaps, gap{e.Slot, e.At, s.End()})
		case Join:
			for j := range gaps {
				if gaps[j].slot == e.Slot && gaps[j].to == s.End() {
					gaps[j].to = e.At
				}
			}
		}
	}
	for _, g := range gaps {
		var up []int
		for i := range out {
			if i != g.slot {
				up = append(up, i)
			}
		}
		if len(up) == 0 {
			continue
		}
		kept := out[g.slot][:0:0]
		next := 0
		for _, a := range out[g.slot] {
			if a.At >= g.from && a.At < g.to {
				to := up[next%len(up)]
				next++
				out[to] = append(out[to], a)
				continue
			}
			kept = append(kept, a)
		}
		out[g.slot] = kept
		for _, i := range up {
			slices.SortStableFunc(out[i], func(a, b Arrival) int { return cmpDuration(a.At, b.At) })
		}
	}
}

func cmpDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Exact returns, for each of the sorted arrival times, whether one exact
// token bucket of rate tokens per second and burst tokens, starting full,
// admits it.
func Exact(rate float64, burst int, at []time.Duration) []bool {
	ok := make([]bool, len(at))
	tokens := float64(burst)
	var last time.Duration
	for i, a := range at {
		tokens = math.Min(float64(burst), tokens+(a-last).Seconds()*rate)
		last = a
		if tokens >= 1 {
			tokens--
			ok[i] = true
		}
	}
	return ok
}

// PeakWidth is the width of the windows in which Peak counts: one second,
// whatever the run's timing, so that the most a limit may admit in one,
// rate·1s + burst, reads as the limit does.
const PeakWidth = time.Second

// Peak returns the most of the sorted times at that fall in one window
// [from, from+w), and the earliest such from, which is one of the times.
// It returns 0 and 0 for no times.
func Peak(at []time.Duration, w time.Duration) (most int, from time.Duration) {
	j := 0
	for i, t := range at {
		for at[j] <= t-w {
			j++
		}
		if n := i - j + 1; n > most {
			most, from = n, at[j]
		}
	}
	return most, from
}

// Reference is what one exact token bucket per key, fed the merged arrivals
// of all instances, admits.
type Reference struct {
	// Arrivals and Admitted count the arrivals, and the admissions of the
	// exact buckets, at or after Warmup.
	Arrivals, Admitted int
	// Series is the number of admissions in each Bucket of the run, from
	// the start.
	Series []int
	// Demand is the number of arrivals in each Bucket of the run.
	Demand []int
	// KeyArrivals and KeyAdmitted are Arrivals and Admitted per key index.
	KeyArrivals, KeyAdmitted []int
	// SlotArrivals is Arrivals per slot (the instance whose schedule an
	// arrival is in), and SlotFair each slot's fair share of Admitted:
	// in every Bucket, what the exact bucket admits in it split max-min
	// fair over the slots' arrivals in it (FairSplit). An exact bucket
	// serves its arrivals in the order they come, which no two runs see
	// alike; the split says what each instance is owed. One-key
	// scenarios only (nil otherwise): the demands of different keys do
	// not add up to one share.
	SlotArrivals []int
	SlotFair     []float64
	// Peak is the most the exact bucket admits in any window of
	// PeakWidth over the whole run, warm-up included, and PeakFrom the
	// start of the first such window; one-key scenarios only (0
	// otherwise).
	Peak     int
	PeakFrom time.Duration
}

// Reference computes the reference of the given schedules (from Arrivals).
// Every bucket starts full at offset 0.
func (s Scenario) Reference(arrivals [][]Arrival) Reference {
	type arrival struct {
		at   time.Duration
		slot int
	}
	perKey := make(map[int32][]arrival)
	for slot, arr := range arrivals {
		for _, a := range arr {
			perKey[a.Key] = append(perKey[a.Key], arrival{a.At, slot})
		}
	}
	n := s.Buckets()
	ref := Reference{Series: make([]int, n), Demand: make([]int, n),
		KeyArrivals: make([]int, max(s.Keys, 1)), KeyAdmitted: make([]int, max(s.Keys, 1))}
	// One key: the measured window's arrivals by bucket and slot, and the
	// admissions by bucket.
	oneKey := s.Keys <= 1
	var slotDemand [][]float64
	var slotAdmitted []float64
	if oneKey {
		ref.SlotArrivals, ref.SlotFair = make([]int, len(arrivals)), make([]float64, len(arrivals))
		slotDemand, slotAdmitted = make([][]float64, n), make([]float64, n)
	}
	for key, arr := range perKey {
		slices.SortFunc(arr, func(a, b arrival) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.slot, b.slot)) })
		at := make([]time.Duration, len(arr))
		for i, a := range arr {
			at[i] = a.at
		}
		var admitted []time.Duration
		for i, ok := range Exact(s.Rate, s.Burst, at) {
			b := min(int(at[i]/s.Bucket), n-1)
			ref.Demand[b]++
			if at[i] >= s.Warmup {
				ref.Arrivals++
				ref.KeyArrivals[key]++
			}
			if at[i] >= s.Warmup && oneKey {
				ref.SlotArrivals[arr[i].slot]++
				if slotDemand[b] == nil {
					slotDemand[b] = make([]float64, len(arrivals))
				}
				slotDemand[b][arr[i].slot]++
				if ok {
					slotAdmitted[b]++
				}
			}
			if ok {
				ref.Series[b]++
				if oneKey {
					admitted = append(admitted, at[i])
				}
				if at[i] >= s.Warmup {
					ref.Admitted++
					ref.KeyAdmitted[key]++
				}
			}
		}
		if oneKey {
			ref.Peak, ref.PeakFrom = Peak(admitted, PeakWidth)
		}
	}
	for b, demand := range slotDemand {
		if demand == nil {
			continue
		}
		for slot, f := range FairSplit(slotAdmitted[b], demand) {
			ref.SlotFair[slot] += f
		}
	}
	return ref
}

// FairSplit splits total max-min fair over demands: every demand gets the
// same level, or all of itself if it is below it, and the parts sum to
// total, or to all the demands if they sum to less.
func FairSplit(total float64, demands []float64) []float64 {
	parts := make([]float64, len(demands))
	order := make([]int, len(demands))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(demands[a], demands[b]) })
	left := total
	for k, i := range order {
		level := left / float64(len(order)-k)
		parts[i] = math.Min(demands[i], level)
		left -= parts[i]
	}
	return parts
}

// Buckets is the number of Bucket-wide buckets that cover [0, End).
func (s Scenario) Buckets() int {
	return int((s.End() + s.Bucket - 1) / s.Bucket)
}

// Timing sets the durations of a bench run.
type Timing struct {
	// Warmup and Measure are the unmeasured start and the measured rest of
	// every open-loop run.
	Warmup, Measure time.Duration
	// The outage run measures OutageUp with Redis up, then Pause with
	// Redis paused, Killed with it killed, and Back after its restart.
	OutageUp, Pause, Killed, Back time.Duration
	// ClosedLoop is the length of each closed-loop run.
	ClosedLoop time.Duration
	// Saturated is the length of each closed-loop accuracy run, callers
	// saturating the CPU, measured from the instances' start.
	Saturated time.Duration
	// Bucket is the width of the time series of admissions.
	Bucket time.Duration
}

// DefaultTiming is the timing of a full run: about 7 minutes on 2 cores.
func DefaultTiming() Timing {
	return Timing{
		Warmup: time.Second, Measure: 7 * time.Second,
		OutageUp: 2 * time.Second, Pause: 1500 * time.Millisecond, Killed: 2500 * time.Millisecond, Back: 3 * time.Second,
		ClosedLoop: 2 * time.Second, Saturated: 3 * time.Second,
		Bucket: 100 * time.Millisecond,
	}
}

// QuickTiming is the timing of a quick run: about a minute on 2 cores.
// The outage keeps Redis away for longer than a contended lease (600ms by
// default), so that the outage policy shows.
func QuickTiming() Timing {
	return Timing{
		Warmup: 400 * time.Millisecond, Measure: 800 * time.Millisecond,
		OutageUp: 400 * time.Millisecond, Pause: 500 * time.Millisecond, Killed: 800 * time.Millisecond, Back: 800 * time.Millisecond,
		ClosedLoop: 250 * time.Millisecond, Saturated: time.Second,
		Bucket: 100 * time.Millisecond,
	}
}

// Scale returns t with every duration multiplied by f.
func (t Timing) Scale(f float64) Timing {
	m := func(d time.Duration) time.Duration { return max(time.Duration(float64(d)*f), time.Millisecond) }
	return Timing{
		Warmup: m(t.Warmup), Measure: m(t.Measure),
		OutageUp: m(t.OutageUp), Pause: m(t.Pause), Killed: m(t.Killed), Back: m(t.Back),
		ClosedLoop: m(t.ClosedLoop), Saturated: m(t.Saturated), Bucket: m(t.Bucket),
	}
}

// Scenario names, in the order Scenarios returns them.
const (
	Balanced = "balanced"
	Skewed   = "skewed"
	Keys     = "keys"
	Hotkey   = "hotkey"
	Outage   = "outage"
	Churn    = "churn"
	Thin     = "thin"
	Sprayed  = "sprayed"
	Sticky   = "sticky"
	Pulse    = "pulse"
	Shift    = "shift"
)

// stickyKeysPerSecond is how many fresh keys the sticky scenario brings
// per second, whatever the timing: its keys' lives scale with the timing,
// the rate at which clients come does not.
const stickyKeysPerSecond = 16

// Scenarios returns the bench's scenarios with timing t, on four instances:
//
//   - balanced: one key, limit 1000/s burst 100, demand 2000/s spread evenly;
//   - skewed: the same, 90% of the demand on one instance;
//   - keys: 10 000 keys of Zipf popularity (s = 1.1), each limited to 10/s
//     burst 10, total demand 3000/s spread evenly;
//   - hotkey: one key, limit 1000/s burst 100, demand 10 000/s;
//   - outage: balanced, with Redis paused, then killed, then back;
//   - churn: balanced, one instance leaves at a third of the measured time,
//     a new one joins at two thirds;
//   - thin: 1600 keys, each limited to 20/s burst 8, every instance within
//     its share of every key (ShapeThin), about 2600/s in all;
//   - sprayed: 200 keys, each limited to 8/s burst 5, each wanting 1 to 2
//     times its limit, every request to an instance drawn at random
//     (ShapeSprayed), about 2400/s in all;
//   - sticky: 16 fresh keys per second, each limited to 25/s burst 40, each
//     on one instance, arriving with 40 requests at once, then wanting 0.25
//     to 1.5 times its limit for Measure/14 to 3·Measure/7 (0.5 s to 3 s in
//     a full run) (ShapeSticky), about 1200/s in all;
//   - pulse: one key, limit 400/s burst 80, instance 0 wanting 800/s, the
//     others pulses of 800/s for Measure/35 about every 2·Measure/7
//     (ShapePulse);
//   - shift: one key, limit 300/s burst 45, demand 450/s, 85% of it on
//     instance 0 until the middle of the measured time, then 85% on
//     instance 2 (ShapeShift).
func Scenarios(t Timing) []Scenario { return Variant{}.Scenarios(t) }

// DefaultInstances is the number of instances of every scenario.
const DefaultInstances = 4

// Variant changes the defaults of every scenario, as a point of the
// bench's sweep does. Its zero value changes nothing.
type Variant struct {
	// Instances is the number of instances; 0 means DefaultInstances. The
	// scenarios keep their shape: skewed's heavy instance keeps its 90%
	// and shift's its 85%, the rest spread evenly over the others;
	// churn's leaving and joining instance is the last one.
	Instances int
	// RateFactor multiplies every key's rate, rounded to a whole number
	// of at least 1, and the demand by the same ratio (the rounded rate
	// over the default), so that every key is as far over or under its
	// limit as by default: a slower or a faster key of the same shape. 0
	// means 1.
	RateFactor float64
	// BurstFactor multiplies every key's burst, rounded to a whole number
	// of at least 1; sticky's keys arrive with their burst at once. 0
	// means 1.
	BurstFactor float64
}

// String names v as the sweep's reports do: "n=16 rate×0.37 burst×0.6".
func (v Variant) String() string {
	return fmt.Sprintf("n=%d rate×%g burst×%g", v.instances(), v.rateFactor(), v.burstFactor())
}

func (v Variant) instances() int {
	if v.Instances > 0 {
		return v.Instances
	}
	return DefaultInstances
}

func (v Variant) rateFactor() float64 {
	if v.RateFactor > 0 {
		return v.RateFactor
	}
	return 1
}

func (v Variant) burstFactor() float64 {
	if v.BurstFactor > 0 {
		return v.BurstFactor
	}
	return 1
}

// limit returns the rate and burst of a limit of rate and burst by
// default, with v's factors applied.
func (v Variant) limit(rate float64, burst int) (float64, int) {
	return max(1, math.Round(rate*v.rateFactor())), max(1, int(math.Round(float64(burst)*v.burstFactor())))
}

// heavy returns the weights of n instances of which instance i (at most
// the last) takes share of the demand and the others the rest, evenly.
func heavy(n, i int, share float64) []float64 {
	w := make([]float64, n)
	i = min(i, n-1)
	if n == 1 {
		w[0] = 1
		return w
	}
	for j := range w {
		w[j] = (1 - share) / float64(n-1)
	}
	w[i] = share
	return w
}

// Scenarios returns the bench's scenarios (see Scenarios) with timing t
// and v's changes.
func (v Variant) Scenarios(t Timing) []Scenario {
	n := v.instances()
	// oneKey returns a scenario of one key of rate and burst by default,
	// with demand that many times the rate (the shapes drawn at random
	// compute theirs).
	oneKey := func(name string, rate float64, burst int, demand float64) Scenario {
		s := Scenario{Name: name, Instances: n, Keys: 1, Warmup: t.Warmup, Measure: t.Measure, Bucket: t.Bucket}
		s.Rate, s.Burst = v.limit(rate, burst)
		s.Demand = demand * s.Rate
		return s
	}
	balanced := oneKey(Balanced, 1000, 100, 2)

	skewed := oneKey(Skewed, 1000, 100, 2)
	skewed.Weights = heavy(n, 0, 0.9)

	keys := oneKey(Keys, 10, 10, 300)
	keys.Keys, keys.ZipfS = 10000, 1.1

	hot := oneKey(Hotkey, 1000, 100, 10)

	outage := oneKey(Outage, 1000, 100, 2)
	outage.Measure = t.OutageUp + t.Pause + t.Killed + t.Back
	pause := t.Warmup + t.OutageUp
	outage.Events = []Event{
		{At: pause, Kind: Pause},
		{At: pause + t.Pause, Kind: Kill},
		{At: pause + t.Pause + t.Killed, Kind: Restart},
	}

	churn := oneKey(Churn, 1000, 100, 2)
	churn.Events = []Event{
		{At: t.Warmup + t.Measure/3, Kind: Leave, Slot: n - 1},
		{At: t.Warmup + 2*t.Measure/3, Kind: Join, Slot: n - 1},
	}

	thin := oneKey(Thin, 20, 8, 0)
	thin.Shape, thin.Keys = ShapeThin, 1600
	thin.Demand = expectedDemand(thin)

	sprayed := oneKey(Sprayed, 8, 5, 0)
	sprayed.Shape, sprayed.Keys = ShapeSprayed, 200
	sprayed.Demand = expectedDemand(sprayed)

	sticky := oneKey(Sticky, 25, 40, 0)
	sticky.Shape = ShapeSticky
	sticky.Keys = max(1, int(math.Round(stickyKeysPerSecond*sticky.End().Seconds())))
	sticky.Period = 3 * t.Measure / 7
	sticky.Demand = expectedDemand(sticky)

	pulse := oneKey(Pulse, 400, 80, 0)
	pulse.Shape = ShapePulse
	pulse.Period = 2 * t.Measure / 7
	pulse.Spell = pulse.Period / 10
	pulse.Demand = expectedDemand(pulse)

	shift := oneKey(Shift, 300, 45, 1.5)
	shift.Shape = ShapeShift
	shift.Weights = heavy(n, 0, 0.85)
	shift.Later = heavy(n, 2, 0.85)
	shift.ShiftAt = t.Warmup + t.Measure/2

	return []Scenario{balanced, skewed, keys, hot, outage, churn, thin, sprayed, sticky, pulse, shift}
}
