package workload

import (
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
	// Demand is the total arrival rate over all instances, per second.
	Demand float64
	// Weights is each instance's share of Demand; nil means even.
	Weights []float64
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
// by index. Index 0 is the most popular key.
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
// [0, End). Each slot receives its share of Demand at fixed intervals (or,
// with poisson, exponential gaps drawn from seed), slots being offset from
// one another by a fraction of an interval. Keys are drawn from seed. While
// a slot is down (between its Leave and its Join), its arrivals go
// round-robin to the slots that are up, as a load balancer would send them.
// The same Scenario and seed always give the same schedule.
func (s Scenario) Arrivals(seed uint64, poisson bool) [][]Arrival {
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
	s.redirect(out)
	return out
}

// weight is slot i's share of Demand.
func (s Scenario) weight(i int) float64 {
	if s.Weights == nil {
		return 1 / float64(s.Instances)
	}
	if i < len(s.Weights) {
		return s.Weights[i]
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
}

// Reference computes the reference of the given schedules (from Arrivals).
// Every bucket starts full at offset 0.
func (s Scenario) Reference(arrivals [][]Arrival) Reference {
	perKey := make(map[int32][]time.Duration)
	for _, arr := range arrivals {
		for _, a := range arr {
			perKey[a.Key] = append(perKey[a.Key], a.At)
		}
	}
	n := s.Buckets()
	ref := Reference{Series: make([]int, n), Demand: make([]int, n),
		KeyArrivals: make([]int, max(s.Keys, 1)), KeyAdmitted: make([]int, max(s.Keys, 1))}
	for key, at := range perKey {
		slices.Sort(at)
		for i, ok := range Exact(s.Rate, s.Burst, at) {
			b := min(int(at[i]/s.Bucket), n-1)
			ref.Demand[b]++
			if at[i] >= s.Warmup {
				ref.Arrivals++
				ref.KeyArrivals[key]++
			}
			if ok {
				ref.Series[b]++
				if at[i] >= s.Warmup {
					ref.Admitted++
					ref.KeyAdmitted[key]++
				}
			}
		}
	}
	return ref
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
	// Bucket is the width of the time series of admissions.
	Bucket time.Duration
}

// DefaultTiming is the timing of a full run: under 5 minutes on 2 cores.
func DefaultTiming() Timing {
	return Timing{
		Warmup: time.Second, Measure: 7 * time.Second,
		OutageUp: 2 * time.Second, Pause: 1500 * time.Millisecond, Killed: 2500 * time.Millisecond, Back: 3 * time.Second,
		ClosedLoop: 2 * time.Second,
		Bucket:     100 * time.Millisecond,
	}
}

// QuickTiming is the timing of a quick run: under 60 seconds on 2 cores.
// The outage keeps Redis away for longer than a contended lease (600ms by
// default), so that the outage policy shows.
func QuickTiming() Timing {
	return Timing{
		Warmup: 400 * time.Millisecond, Measure: 800 * time.Millisecond,
		OutageUp: 400 * time.Millisecond, Pause: 500 * time.Millisecond, Killed: 800 * time.Millisecond, Back: 800 * time.Millisecond,
		ClosedLoop: 250 * time.Millisecond,
		Bucket:     100 * time.Millisecond,
	}
}

// Scale returns t with every duration multiplied by f.
func (t Timing) Scale(f float64) Timing {
	m := func(d time.Duration) time.Duration { return max(time.Duration(float64(d)*f), time.Millisecond) }
	return Timing{
		Warmup: m(t.Warmup), Measure: m(t.Measure),
		OutageUp: m(t.OutageUp), Pause: m(t.Pause), Killed: m(t.Killed), Back: m(t.Back),
		ClosedLoop: m(t.ClosedLoop), Bucket: m(t.Bucket),
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
)

// Scenarios returns the bench's scenarios with timing t, on four instances:
//
//   - balanced: one key, limit 1000/s burst 100, demand 2000/s spread evenly;
//   - skewed: the same, 90% of the demand on one instance;
//   - keys: 10 000 keys of Zipf popularity (s = 1.1), each limited to 10/s
//     burst 10, total demand 3000/s spread evenly;
//   - hotkey: one key, limit 1000/s burst 100, demand 10 000/s;
//   - outage: balanced, with Redis paused, then killed, then back;
//   - churn: balanced, one instance leaves at a third of the measured time,
//     a new one joins at two thirds.
func Scenarios(t Timing) []Scenario {
	const n = 4
	base := Scenario{
		Instances: n, Rate: 1000, Burst: 100, Keys: 1, Demand: 2000,
		Warmup: t.Warmup, Measure: t.Measure, Bucket: t.Bucket,
	}
	balanced := base
	balanced.Name = Balanced

	skewed := base
	skewed.Name = Skewed
	skewed.Weights = []float64{0.9, 0.1 / 3, 0.1 / 3, 0.1 / 3}

	keys := base
	keys.Name = Keys
	keys.Keys, keys.ZipfS = 10000, 1.1
	keys.Rate, keys.Burst = 10, 10
	keys.Demand = 3000

	hot := base
	hot.Name = Hotkey
	hot.Demand = 10 * hot.Rate

	outage := base
	outage.Name = Outage
	outage.Measure = t.OutageUp + t.Pause + t.Killed + t.Back
	pause := t.Warmup + t.OutageUp
	outage.Events = []Event{
		{At: pause, Kind: Pause},
		{At: pause + t.Pause, Kind: Kill},
		{At: pause + t.Pause + t.Killed, Kind: Restart},
	}

	churn := base
	churn.Name = Churn
	churn.Events = []Event{
		{At: t.Warmup + t.Measure/3, Kind: Leave, Slot: n - 1},
		{At: t.Warmup + 2*t.Measure/3, Kind: Join, Slot: n - 1},
	}
	return []Scenario{balanced, skewed, keys, hot, outage, churn}
}
