package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/hybridlimit/hybridlimit/bench/internal/report"
	"github.com/hybridlimit/hybridlimit/bench/internal/workload"
)

// The sweep's grid: every scenario runs at every combination of these, its
// other parameters at their defaults (workload.Variant). The full product
// is 12 points; with -quick, 11 scenarios and 3 strategies, 396 runs in
// about 9 minutes on 2 cores.
var (
	// sweepInstances are the instance counts, around the default 4: a
	// lease's share of a key is smallest at 16.
	sweepInstances = []int{3, 6, 16}
	// sweepRateFactors multiply every key's rate, and its demand with it:
	// slower and faster keys of the same shape.
	sweepRateFactors = []float64{0.37, 2.1}
	// sweepBurstFactors multiply every key's burst.
	sweepBurstFactors = []float64{0.6, 1.4}
)

// sweepStrategies are the strategies of a sweep unless -strategies names
// others: hybrid beside the two it must not be dominated by.
var sweepStrategies = []string{report.Hybrid, report.Global, report.Local}

// grid returns the sweep's points, every combination of its axes.
func grid() []workload.Variant {
	var out []workload.Variant
	for _, n := range sweepInstances {
		for _, rf := range sweepRateFactors {
			for _, bf := range sweepBurstFactors {
				out = append(out, workload.Variant{Instances: n, RateFactor: rf, BurstFactor: bf})
			}
		}
	}
	return out
}

// sweep runs every selected scenario with every selected strategy at every
// point of the grid: open loops only, no closed loop and no latency
// baseline.
func sweep(ctx context.Context, o options, b backend, started time.Time, stderr io.Writer) (*report.Sweep, error) {
	timing := o.timing()
	run, hc := newRun(ctx, o, b, started)
	sw := &report.Sweep{Run: run, Strategies: o.strategies,
		Grid: report.Grid{Instances: sweepInstances, RateFactors: sweepRateFactors, BurstFactors: sweepBurstFactors}}
	points := grid()
	scenarios := make([][]workload.Scenario, len(points))
	runs := 0
	for i, v := range points {
		var notes []string
		scenarios[i], notes = pickScenarios(o, b, v.Scenarios(timing))
		if i == 0 {
			sw.Notes = append(sw.Notes, notes...)
		}
		runs += len(scenarios[i]) * len(o.strategies)
	}
	p := newProgress(stderr, started, runs)
	defer p.done()

	r := &runner{ctx: ctx, o: o, b: b, started: started, timeout: hc.RedisTimeout, p: p}
	for i, v := range points {
		point := report.Point{Instances: v.Instances, RateFactor: v.RateFactor, BurstFactor: v.BurstFactor, Name: v.String()}
		sw.Points = append(sw.Points, point)
		r.label = " (" + point.Name + ")"
		res, err := r.openLoops(scenarios[i])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", point.Name, err)
		}
		for j := range res {
			res[j].Point = &point
		}
		sw.Results = append(sw.Results, res...)
	}
	sw.WallSeconds = time.Since(started).Seconds()
	sw.Finish()
	sw.Notes = append(sw.Notes,
		"Each point changes every scenario at once: its instance count, and every key's rate and burst by the factors (rounded to whole numbers); "+
			"demand follows the rate, so every key is as far over its limit as by default. Skewed keeps 90% of its demand on one instance and shift 85%, "+
			"the rest spread evenly over the others; churn's last instance leaves and rejoins; the outage is the same at every point.",
		"Accuracy is not a target on outage (Redis away, each instance follows FailLocal). The factors by which hybrid must save Redis commands "+
			"(500x on balanced and hotkey, 30x on skewed, shift, pulse and churn, half on keys) are targets of the default run (go run ./bench), "+
			"the scenarios at their defaults; the sweep checks that hybrid never sends more than global.",
		failLocalNote, windowNote)
	if sw.RedisKind != "embedded" {
		sw.Notes = append(sw.Notes, serverCountNote)
	}
	return sw, nil
}
