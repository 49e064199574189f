package workload_test

import (
	"fmt"
	"time"

	"github.com/hybridlimit/hybridlimit/bench/internal/workload"
)

// The busiest second of a limit of 10/s with a burst of 5, fed 100/s: the
// full bucket at once, then one every 100ms up to 900ms; the window is
// half-open, so the one at 1s falls outside.
func ExamplePeak() {
	sc := workload.Scenario{Name: "p", Instances: 2, Rate: 10, Burst: 5, Keys: 1, Demand: 100,
		Warmup: time.Second, Measure: 2 * time.Second, Bucket: 100 * time.Millisecond}
	var admitted []time.Duration
	for _, a := range sc.Arrivals(1, false)[0] {
		admitted = append(admitted, a.At)
	}
	most, from := workload.Peak(admitted, workload.PeakWidth)
	fmt.Printf("slot 0: %d arrivals in its busiest second, from %v\n", most, from)
	ref := sc.Reference(sc.Arrivals(1, false))
	fmt.Printf("the exact bucket: %d admitted in its busiest second, at most %g\n", ref.Peak, sc.Rate*workload.PeakWidth.Seconds()+float64(sc.Burst))
	// Output:
	// slot 0: 50 arrivals in its busiest second, from 0s
	// the exact bucket: 14 admitted in its busiest second, at most 15
}

// Every scenario says how it lays its demand out.
func ExampleShape() {
	for _, sc := range workload.Scenarios(workload.QuickTiming()) {
		fmt.Printf("%s: %v, %d keys, %g/s burst %d\n", sc.Name, sc.Shape, max(sc.Keys, 1), sc.Rate, sc.Burst)
	}
	// Output:
	// balanced: steady, 1 keys, 1000/s burst 100
	// skewed: steady, 1 keys, 1000/s burst 100
	// keys: steady, 10000 keys, 10/s burst 10
	// hotkey: steady, 1 keys, 1000/s burst 100
	// outage: steady, 1 keys, 1000/s burst 100
	// churn: steady, 1 keys, 1000/s burst 100
	// thin: thin, 1600 keys, 20/s burst 8
	// sprayed: sprayed, 200 keys, 8/s burst 5
	// sticky: sticky, 19 keys, 25/s burst 40
	// pulse: pulse, 1 keys, 400/s burst 80
	// shift: shift, 1 keys, 300/s burst 45
}
