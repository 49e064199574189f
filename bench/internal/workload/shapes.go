package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Shape says how a Scenario lays its demand out over the instances, the
// keys and time.
type Shape int

const (
	// ShapeSteady splits Demand over the instances by Weights, each at a
	// steady rate, over the keys round-robin or by Zipf popularity (ZipfS).
	ShapeSteady Shape = iota
	// ShapeThin spreads many keys thinly. Each key is active over a span
	// of the run, from a quarter of it to all of it, placed at random; on
	// each instance it sends evenly spaced arrivals at a rate drawn
	// log-uniformly between 0.001 and 0.9 times its share (Rate over
	// Instances), so most keys see a few arrivals in a run and a few come
	// close to their share, as the clients of a public API do. No instance
	// ever exceeds its share of any key: a design that needs Redis only
	// beyond the share needs none here.
	ShapeThin
	// ShapeSprayed gives every key a steady demand drawn between 1 and 2
	// times its rate, for the whole run, and sends each of its requests to
	// an instance drawn at random, as a load balancer without affinity
	// does: keys near and over their limit, sprayed over the instances.
	ShapeSprayed
	// ShapeSticky brings Keys fresh keys evenly over the run, each to one
	// instance drawn at random (key affinity) and with Burst requests at
	// once; a key then sends at a steady rate drawn between 0.25 and 1.5
	// times its rate, for a life drawn between a sixth of Period and
	// Period.
	ShapeSticky
	// ShapePulse has one key. Instance 0 wants twice the rate steadily; each
	// other instance sends pulses at that same rate, each Spell long, the
	// first within Period of the start and the next ones between half and
	// one and a half Period apart, so pulses of different instances now
	// overlap, now do not.
	ShapePulse
	// ShapeShift has one key, split over the instances by Weights until
	// ShiftAt and by Later from then on: the skew moves from one instance
	// to another.
	ShapeShift
)

func (s Shape) String() string {
	switch s {
	case ShapeSteady:
		return "steady"
	case ShapeThin:
		return "thin"
	case ShapeSprayed:
		return "sprayed"
	case ShapeSticky:
		return "sticky"
	case ShapePulse:
		return "pulse"
	case ShapeShift:
		return "shift"
	}
	return fmt.Sprintf("Shape(%d)", int(s))
}

// The parameters of the shapes, as their doc comments state them.
const (
	// thinLow and thinHigh bound a thin key's rate on one instance, as a
	// fraction of its share; below 1, so that a share with a burst of 1
	// admits every evenly spaced arrival.
	thinLow, thinHigh = 0.001, 0.9
	// thinShortest is a thin key's shortest span, as a fraction of the run.
	thinShortest = 0.25
	// sprayLow and sprayHigh bound a sprayed key's demand as a multiple
	// of its rate: near the limit and over it, where a split burst loses
	// the most.
	sprayLow, sprayHigh = 1.0, 2.0
	// stickyLow and stickyHigh bound a sticky key's demand after its first
	// burst, as a multiple of its rate: some keys stay well within their
	// limit, some want more.
	stickyLow, stickyHigh = 0.25, 1.5
	// stickyShortest is a sticky key's shortest life, as a fraction of
	// Period.
	stickyShortest = 1.0 / 6
	// pulseDemand is the demand of the steady instance, and of a pulsing
	// one during a pulse, as a multiple of the rate.
	pulseDemand = 2.0
	// pulseGapLow and pulseGapHigh bound the gap from one pulse of an
	// instance to its next, as a multiple of Period.
	pulseGapLow, pulseGapHigh = 0.5, 1.5
)

// Streams of random numbers of a shaped plan, apart from the slots'
// streams of the steady shape (0 to Instances-1).
const (
	planStream  = 1<<32 + iota // keys' rates, spans, instances and phases
	gapStream                  // exponential gaps, with poisson
	routeStream                // the instance of each sprayed request
)

// plan builds the schedules of a shape other than ShapeSteady. The draws
// that make the plan (keys' rates, spans, instances, phases) come from
// their own stream, so that poisson changes the gaps and not the plan.
type plan struct {
	s                  Scenario
	out                [][]Arrival
	draw, gaps, routes *rand.Rand
	poisson            bool
}

// shaped returns the schedules of a shape other than ShapeSteady, each
// sorted by At.
func (s Scenario) shaped(seed uint64, poisson bool) [][]Arrival {
	p := &plan{s: s, out: make([][]Arrival, s.Instances), poisson: poisson,
		draw:   rand.New(rand.NewPCG(seed, planStream)),
		gaps:   rand.New(rand.NewPCG(seed, gapStream)),
		routes: rand.New(rand.NewPCG(seed, routeStream))}
	switch s.Shape {
	case ShapeThin:
		p.thin()
	case ShapeSprayed:
		p.sprayed()
	case ShapeSticky:
		p.sticky()
	case ShapePulse:
		p.pulse()
	case ShapeShift:
		p.shift()
	}
	for i := range p.out {
		slices.SortStableFunc(p.out[i], func(a, b Arrival) int { return cmpDuration(a.At, b.At) })
	}
	return p.out
}

// times returns the times of a stream of perSec arrivals per second over
// [from, to): evenly spaced, the first phase (in [0, 1]) of a gap after
// from, or with poisson at exponential gaps.
func (p *plan) times(perSec float64, from, to time.Duration, phase float64) []time.Duration {
	if perSec <= 0 || to <= from {
		return nil
	}
	gap := float64(time.Second) / perSec
	next := func() float64 {
		if p.poisson {
			return p.gaps.ExpFloat64() * gap
		}
		return gap
	}
	t := float64(from) + phase*gap
	if p.poisson {
		t = float64(from) + next()
	}
	var at []time.Duration
	for ; t < float64(to); t += next() {
		at = append(at, time.Duration(t))
	}
	return at
}

// add appends arrivals of key at times at to slot's schedule.
func (p *plan) add(slot int, key int32, at []time.Duration) {
	for _, t := range at {
		p.out[slot] = append(p.out[slot], Arrival{At: t, Key: key})
	}
}

// between returns a number drawn uniformly from [lo, hi).
func (p *plan) between(lo, hi float64) float64 { return lo + (hi-lo)*p.draw.Float64() }

func (p *plan) thin() {
	s := p.s
	end := float64(s.End())
	share := s.Rate / float64(s.Instances)
	for k := range int32(max(s.Keys, 1)) {
		span := end * p.between(thinShortest, 1)
		from := (end - span) * p.draw.Float64()
		for i := range s.Instances {
			f := thinLow * math.Exp(p.draw.Float64()*math.Log(thinHigh/thinLow))
			p.add(i, k, p.times(f*share, time.Duration(from), time.Duration(from+span), p.draw.Float64()))
		}
	}
}

func (p *plan) sprayed() {
	s := p.s
	for k := range int32(max(s.Keys, 1)) {
		perSec := s.Rate * p.between(sprayLow, sprayHigh)
		for _, t := range p.times(perSec, 0, s.End(), p.draw.Float64()) {
			slot := p.routes.IntN(s.Instances)
			p.out[slot] = append(p.out[slot], Arrival{At: t, Key: k})
		}
	}
}

func (p *plan) sticky() {
	s := p.s
	n := max(s.Keys, 1)
	end := s.End()
	every := float64(end) / float64(n)
	t := every * p.draw.Float64()
	for k := range int32(n) {
		slot := p.draw.IntN(s.Instances)
		life := time.Duration(float64(s.Period) * p.between(stickyShortest, 1))
		perSec := s.Rate * p.between(stickyLow, stickyHigh)
		phase := 1 - p.draw.Float64() // in (0, 1]: the steady arrivals follow the burst
		if t >= float64(end) {
			break // with poisson, the keys that would arrive after the end
		}
		at := time.Duration(t)
		for range s.Burst {
			p.out[slot] = append(p.out[slot], Arrival{At: at, Key: k})
		}
		p.add(slot, k, p.times(perSec, at, min(at+life, end), phase))
		if p.poisson {
			t += p.gaps.ExpFloat64() * every
		} else {
			t += every
		}
	}
}

func (p *plan) pulse() {
	s := p.s
	perSec := pulseDemand * s.Rate
	p.add(0, 0, p.times(perSec, 0, s.End(), 0))
	for i := 1; i < s.Instances; i++ {
		for t := float64(s.Period) * p.draw.Float64(); t < float64(s.End()); t += float64(s.Period) * p.between(pulseGapLow, pulseGapHigh) {
			from := time.Duration(t)
			p.add(i, 0, p.times(perSec, from, min(from+s.Spell, s.End()), p.draw.Float64()))
		}
	}
}

func (p *plan) shift() {
	s := p.s
	for i := range s.Instances {
		phase := float64(i) / float64(s.Instances)
		p.add(i, 0, p.times(s.Demand*weightOf(s.Weights, i, s.Instances), 0, s.ShiftAt, phase))
		p.add(i, 0, p.times(s.Demand*weightOf(s.Later, i, s.Instances), s.ShiftAt, s.End(), phase))
	}
}

// expectedDemand returns the expected mean of the total arrival rate of
// s's shape per second, from its parameters: what Demand is set to for
// the shapes drawn at random.
func expectedDemand(s Scenario) float64 {
	keys := float64(max(s.Keys, 1))
	switch s.Shape {
	case ShapeThin:
		// Per instance f·Rate/N, f log-uniform: its mean is
		// (hi-lo)/ln(hi/lo); a key is active for its span, on average
		// (1+thinShortest)/2 of the run.
		meanF := (thinHigh - thinLow) / math.Log(thinHigh/thinLow)
		return keys * s.Rate * meanF * (1 + thinShortest) / 2
	case ShapeSprayed:
		return keys * s.Rate * (sprayLow + sprayHigh) / 2
	case ShapeSticky:
		// A key arriving at t, uniform over the run, sends for
		// min(life, end-t): on average life - life²/(2·end).
		end := s.End().Seconds()
		a, b := stickyShortest*s.Period.Seconds(), s.Period.Seconds()
		meanLife, meanLife2 := (a+b)/2, (a*a+a*b+b*b)/3
		sending := meanLife - meanLife2/(2*end)
		return keys / end * (float64(s.Burst) + s.Rate*(stickyLow+stickyHigh)/2*sending)
	case ShapePulse:
		// Pulse starts are Period apart on average.
		return pulseDemand * s.Rate * (1 + float64(s.Instances-1)*s.Spell.Seconds()/s.Period.Seconds())
	}
	return s.Demand
}
