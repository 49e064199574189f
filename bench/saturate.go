package main

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hybridlimit/hybridlimit/bench/internal/report"
	"github.com/hybridlimit/hybridlimit/bench/internal/workload"
)

// The saturated rows: callers that saturate the CPU, each calling Allow on
// one key back to back with no pacing, from the instances' start. Their
// accuracy is against what one exact bucket admits to callers that always
// want more, burst + rate × elapsed; their speed against the blind split
// (bare) at the same concurrency.
const (
	saturatedName      = "saturated" // picks the rows with -scenarios
	saturatedInstances = 4
	saturatedRate      = 2000
	saturatedBurst     = 200
)

// saturatedWorkers are the goroutines per instance of the saturated rows.
var saturatedWorkers = []int{1, 4, 16}

// saturatedStrategies returns the strategies the saturated rows run: the
// run's, and the blind split they are held against.
func saturatedStrategies(o options) []string {
	out := slices.Clone(o.strategies)
	if !slices.Contains(out, bare) {
		out = append(out, bare)
	}
	return out
}

// saturatedRun is one saturated row.
type saturatedRun struct {
	setup   *setup
	workers int
	dur     time.Duration
}

// saturatedCount is one worker's tally.
type saturatedCount struct{ decisions, allowed, errs int64 }

// run starts a fresh cluster, lets every worker decide back to back until
// dur has passed since the start, and counts what they were admitted.
func (sr *saturatedRun) run(ctx context.Context) (report.Saturated, error) {
	c, err := newCluster(sr.setup, saturatedInstances)
	if err != nil {
		return report.Saturated{}, err
	}
	defer shut(c)
	count := &commandCount{setup: sr.setup}
	count.begin(ctx)
	counts := make([]saturatedCount, saturatedInstances*sr.workers)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(sr.dur)
	for w := range counts {
		inst, cnt := c.slots[w%saturatedInstances], &counts[w]
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Tallied in locals: counters side by side in memory would
			// share cache lines between the workers.
			var n saturatedCount
			for ctx.Err() == nil && time.Now().Before(end) {
				ok, err := inst.allow(ctx, "hot")
				n.decisions++
				if ok {
					n.allowed++
				}
				if err != nil {
					n.errs++
				}
			}
			*cnt = n
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return report.Saturated{}, err
	}
	if err := count.end(ctx); err != nil {
		return report.Saturated{}, err
	}
	var cmds report.Result
	count.fill(&cmds)
	s := report.Saturated{Strategy: sr.setup.strategy, Instances: saturatedInstances, Workers: sr.workers,
		Rate: saturatedRate, Burst: saturatedBurst, Seconds: sr.dur.Seconds(), RedisCommands: cmds.RedisCommands,
		Reference: saturatedBurst + saturatedRate*sr.dur.Seconds()}
	for _, n := range counts {
		s.Decisions += n.decisions
		s.Allowed += n.allowed
		s.Errors += n.errs
	}
	return s, nil
}

// saturated runs every saturated row: each strategy at each concurrency.
func (r *runner) saturated(t workload.Timing) ([]report.Saturated, error) {
	var out []report.Saturated
	for _, st := range saturatedStrategies(r.o) {
		for _, w := range saturatedWorkers {
			r.p.next(saturatedName + " / " + st + " / " + strconv.Itoa(w) + " per instance")
			if err := r.reset(); err != nil {
				return nil, err
			}
			sr := saturatedRun{setup: r.newSetup(st, saturatedRate, saturatedBurst), workers: w, dur: t.Saturated}
			s, err := sr.run(r.ctx)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	return out, nil
}
