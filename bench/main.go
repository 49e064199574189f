// Command bench measures, side by side in one run, what hybridlimit saves
// and what it costs: Redis commands per decision, accuracy against an exact
// limiter, decision latency and decisions per second, for four strategies
// fed identical arrivals:
//
//   - local: hybridlimit in Local mode, rate/N per instance, no Redis;
//   - global: hybridlimit in Global mode, one token-bucket script per
//     decision (the classic design);
//   - hybrid: hybridlimit in Hybrid mode (placement version 3: a key's
//     first decisions on an instance are exact, busy keys are leased);
//   - redis_rate: github.com/go-redis/redis_rate, one GCRA script per
//     decision (what a Go user picks today); it fails open on errors.
//
// Scenarios (four in-process instances, each with its own Redis client):
// balanced, skewed, keys, hotkey, outage, churn, thin, sprayed, sticky,
// pulse and shift; see package bench/internal/workload. Arrivals are
// open-loop; a separate closed-loop run measures the most decisions per
// second. On every one-key scenario the report also gives the most each
// strategy admitted in any 1 s window, against rate·1s + burst.
//
// With -sweep it runs every scenario instead at every point of a grid of
// instance counts, rates and bursts (see sweep.go), with hybrid, global and
// local, and reports each strategy's worst accuracy and most Redis
// commands per decision over the grid.
//
// Usage:
//
//	go run ./bench [-quick] [-json FILE] [-html FILE] [-redis ADDR | -embedded]
//	go run ./bench -sweep [-quick] [-json FILE] [-redis ADDR | -embedded]
//
// By default the bench starts its own redis-server (from PATH) on a free
// port of 127.0.0.1; it exits with status 2 if there is none. -embedded runs
// against an in-process Redis instead, and every figure is then labelled not
// representative. The markdown table and the target checks go to standard
// output, a progress line to standard error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/bench/internal/report"
	"github.com/hybridlimit/hybridlimit/bench/internal/workload"
	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redisproc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses of run.
const (
	exitOK    = 0
	exitError = 1 // the bench could not complete
	exitUsage = 2 // bad flags, or no redis-server to run against
)

type options struct {
	quick, embedded, poisson bool
	// bare gives each instance a membership.Static of its own, not on a
	// Bus: a count and nothing else, no names, no roster.
	bare bool
	// sweep runs the scenarios over the sweep's grid instead of the
	// default run.
	sweep                 bool
	redis, json, html     string
	scale                 float64
	seed                  uint64
	workers               int
	scenarios, strategies []string
	// Hybrid timings; zero means the library's default.
	tick, contendedTTL, uncontendedTTL, redisTimeout time.Duration
}

// tune applies the hybrid timing flags to a Config.
func (o options) tune(c *hybrid.Config) {
	for _, f := range []struct {
		dst *time.Duration
		v   time.Duration
	}{{&c.Tick, o.tick}, {&c.ContendedTTL, o.contendedTTL}, {&c.UncontendedTTL, o.uncontendedTTL}, {&c.RedisTimeout, o.redisTimeout}} {
		if f.v != 0 {
			*f.dst = f.v
		}
	}
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench [flags]\n\n"+
			"Runs every scenario with every strategy on identical arrivals and prints a markdown table\n"+
			"with the target checks. By default it starts its own redis-server from PATH.\n\nflags:\n")
		fs.PrintDefaults()
	}
	fs.BoolVar(&o.quick, "quick", false, "short runs: the whole bench in about a minute on 2 cores")
	fs.BoolVar(&o.sweep, "sweep", false, "run every scenario over a grid of instance counts, rates and bursts, with hybrid, global and local (about 9 minutes on 2 cores with -quick)")
	fs.BoolVar(&o.embedded, "embedded", false, "run against an in-process Redis (miniredis); figures are not representative")
	fs.StringVar(&o.redis, "redis", "", "`ADDR` of an existing Redis to use instead of starting one (never flushed; the outage scenario is skipped)")
	fs.StringVar(&o.json, "json", "", "write the results as JSON to `FILE`")
	fs.StringVar(&o.html, "html", "", "write a self-contained HTML page with charts to `FILE`")
	fs.Float64Var(&o.scale, "scale", 1, "multiply every duration by `F` (below 1 for a faster, noisier run)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the arrival schedules")
	fs.BoolVar(&o.poisson, "poisson", false, "Poisson arrivals instead of evenly spaced ones")
	fs.BoolVar(&o.bare, "bare", false, "bare membership.Static counters, a count each, not on a Bus (no names, no roster)")
	fs.IntVar(&o.workers, "workers", 2, "closed-loop goroutines per instance")
	fs.DurationVar(&o.tick, "tick", 0, "hybrid Config.Tick, the lease loop's period (0: the library default, 50ms)")
	fs.DurationVar(&o.contendedTTL, "contended-ttl", 0, "hybrid Config.ContendedTTL (0: the library default, 600ms)")
	fs.DurationVar(&o.uncontendedTTL, "uncontended-ttl", 0, "hybrid Config.UncontendedTTL (0: the library default, 5s)")
	fs.DurationVar(&o.redisTimeout, "redis-timeout", 0, "hybrid Config.RedisTimeout, also the bound of every redis_rate call (0: the library default, 150ms)")
	scen := fs.String("scenarios", "", "comma-separated subset of scenarios to run (default all)")
	strat := fs.String("strategies", "", "comma-separated subset of strategies to run (default all; with -sweep, hybrid, global and local)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.embedded && o.redis != "" {
		return o, errors.New("-embedded and -redis exclude each other")
	}
	if o.sweep && o.html != "" {
		return o, errors.New("-html is not available with -sweep: its figures are tables (and -json)")
	}
	if !(o.scale > 0) || o.scale > 100 {
		return o, fmt.Errorf("-scale %v: want a positive factor up to 100", o.scale)
	}
	if o.workers < 1 {
		return o, fmt.Errorf("-workers %d: want at least 1", o.workers)
	}
	// Let the library judge the timings, with a limit that needs no Redis.
	cfg := hybrid.DefaultConfig(nil, nil, hybrid.Limit{Name: "x", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal})
	o.tune(&cfg)
	l, err := hybrid.New(cfg)
	if err != nil {
		return o, err
	}
	_ = l.Close(context.Background())
	var all []string
	for _, s := range workload.Scenarios(workload.QuickTiming()) {
		all = append(all, s.Name)
	}
	all = append(all, saturatedName)
	if o.scenarios, err = subset(*scen, all, "scenario"); err != nil {
		return o, err
	}
	if o.strategies, err = subset(*strat, strategies, "strategy"); err != nil {
		return o, err
	}
	if o.sweep && *strat == "" {
		o.strategies = sweepStrategies
	}
	return o, nil
}

// subset parses a comma-separated list of names from all; empty means all.
func subset(list string, all []string, what string) ([]string, error) {
	if list == "" {
		return all, nil
	}
	var out []string
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(all, name) {
			return nil, fmt.Errorf("unknown %s %q: choose from %s", what, name, strings.Join(all, ", "))
		}
		out = append(out, name)
	}
	return out, nil
}

// run is the bench program; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return exitUsage
	}
	started := time.Now()
	// go-redis logs every failed dial; in the outage scenario that is by
	// design, and the figures say what happened.
	redis.SetLogger(quiet{})

	b, err := openBackend(ctx, o)
	if errors.Is(err, redisproc.ErrNotFound) {
		fmt.Fprintf(stderr, "bench: no redis-server on PATH: install it (Debian: apt-get install redis-server), "+
			"or point the bench at a running Redis with -redis ADDR, or run -embedded against an in-process one "+
			"(figures not representative)\n")
		return exitUsage
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return exitError
	}
	defer b.close()

	var rep interface {
		WriteMarkdown(io.Writer) error
		WriteJSON(io.Writer) error
	}
	var writeHTML func(io.Writer) error
	if o.sweep {
		rep, err = sweep(ctx, o, b, started, stderr)
	} else {
		var r *report.Report
		r, err = bench(ctx, o, b, started, stderr)
		rep, writeHTML = r, r.WriteHTML
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return exitError
	}
	if err := rep.WriteMarkdown(stdout); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return exitError
	}
	for _, out := range []struct {
		path  string
		write func(io.Writer) error
	}{{o.json, rep.WriteJSON}, {o.html, writeHTML}} {
		if out.path == "" {
			continue
		}
		if err := writeFile(out.path, out.write); err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return exitError
		}
	}
	return exitOK
}

// quiet is a go-redis logger that drops everything.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// openBackend starts or connects to the Redis the run measures against.
func openBackend(ctx context.Context, o options) (backend, error) {
	switch {
	case o.embedded:
		return newEmbedded()
	case o.redis != "":
		return newExternal(ctx, o.redis)
	}
	dir, err := os.MkdirTemp("", "hybridlimit-bench-")
	if err != nil {
		return nil, err
	}
	srv, err := redisproc.Start(ctx, dir, redisproc.Options{})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &ownDir{own{srv}, dir}, nil
}

// ownDir is an own server whose working directory goes with it.
type ownDir struct {
	own
	dir string
}

func (o *ownDir) close() {
	o.own.close()
	_ = os.RemoveAll(o.dir)
}

// bench runs every scenario with every strategy, then the closed loops.
func bench(ctx context.Context, o options, b backend, started time.Time, stderr io.Writer) (*report.Report, error) {
	timing := o.timing()
	run, hc := newRun(ctx, o, b, started)
	rep := &report.Report{Run: run}
	scenarios, notes := pickScenarios(o, b, workload.Scenarios(timing))
	rep.Notes = append(rep.Notes, notes...)
	var shapes []closedLoop
	if len(scenarios) > 0 {
		shapes = closedShapes(timing, o.seed)
	}
	baselines := latencyBaselines(scenarios)
	runs := len(baselines) + len(o.strategies)*(len(scenarios)+len(shapes))
	sat := slices.Contains(o.scenarios, saturatedName)
	if sat {
		runs += len(saturatedStrategies(o)) * len(saturatedWorkers)
	}
	p := newProgress(stderr, started, runs)
	defer p.done()

	r := &runner{ctx: ctx, o: o, b: b, started: started, timeout: hc.RedisTimeout, p: p}
	var err error
	if rep.Scenarios, err = r.openLoops(scenarios); err != nil {
		return nil, err
	}
	if rep.Baselines, err = r.baselines(baselines); err != nil {
		return nil, err
	}
	if rep.ClosedLoop, err = r.closedLoops(shapes); err != nil {
		return nil, err
	}
	if sat {
		if rep.Saturated, err = r.saturated(timing); err != nil {
			return nil, err
		}
	}
	joinClosedLoops(rep)
	rep.WallSeconds = time.Since(started).Seconds()
	rep.Finish()
	rep.CheckTargets()
	addNotes(rep, o)
	return rep, nil
}

// timing is the timing of o's runs: the default or the quick one, scaled.
func (o options) timing() workload.Timing {
	timing := workload.DefaultTiming()
	if o.quick {
		timing = workload.QuickTiming()
	}
	return timing.Scale(o.scale)
}

// newRun says what a run of the bench runs on and with, and returns the
// hybrid Config the run uses too.
func newRun(ctx context.Context, o options, b backend, started time.Time) (report.Run, hybrid.Config) {
	arrivals := "evenly spaced"
	if o.poisson {
		arrivals = "Poisson"
	}
	run := report.Run{
		Redis: b.describe(ctx), RedisKind: b.kind(), Representative: b.kind() != "embedded",
		Quick: o.quick, Scale: o.scale, Arrivals: arrivals, Seed: o.seed,
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH, CPUs: runtime.NumCPU(),
		Started: started, ClockNS: clockOverhead(),
	}
	hc := hybrid.DefaultConfig(nil, nil)
	o.tune(&hc)
	run.Hybrid = report.HybridConfig{Tick: hc.Tick.String(), ContendedTTL: hc.ContendedTTL.String(),
		UncontendedTTL: hc.UncontendedTTL.String(), RedisTimeout: hc.RedisTimeout.String(), IdleAfter: hc.IdleAfter.String()}
	return run, hc
}

// pickScenarios returns those of all that o selects and b can stage, and
// notes on the others, so that a missing row is explained.
func pickScenarios(o options, b backend, all []workload.Scenario) (scenarios []workload.Scenario, notes []string) {
	for _, sc := range all {
		if !slices.Contains(o.scenarios, sc.Name) {
			continue
		}
		if _, _, outage := sc.Window(); outage && !b.outage() {
			notes = append(notes, fmt.Sprintf("scenario %s skipped: it pauses and kills Redis, which the bench does only to a Redis it started itself", sc.Name))
			continue
		}
		scenarios = append(scenarios, sc)
	}
	return scenarios, notes
}

// latencyBaselines returns those of scenarios that the bare baseline runs
// too (balanced, keys and hotkey): a few are enough to show what the
// machine and the driver cost a decision.
func latencyBaselines(scenarios []workload.Scenario) []workload.Scenario {
	var baselines []workload.Scenario
	for _, sc := range scenarios {
		switch sc.Name {
		case workload.Balanced, workload.Keys, workload.Hotkey:
			baselines = append(baselines, sc)
		}
	}
	return baselines
}

// runner makes the runs of one bench, one after the other.
type runner struct {
	ctx     context.Context
	o       options
	b       backend
	started time.Time
	timeout time.Duration // of every redis_rate call, as of the hybrid Limiters' calls
	p       *progress
	// label ends every progress line of the runs to come: the sweep's
	// grid point.
	label string
	sent  atomic.Int64 // commands sent by every client of every run
	runs  int
}

// newSetup returns what the instances of the next run share. Every run has
// a key prefix of its own, so that no run sees another's keys, even on a
// Redis that is not flushed.
func (r *runner) newSetup(strategy string, rate float64, burst int) *setup {
	r.runs++
	return &setup{strategy: strategy, backend: r.b, rate: rate, burst: burst, sent: &r.sent, tune: r.o.tune, timeout: r.timeout,
		bare: r.o.bare, prefix: fmt.Sprintf("hlbench:%d:%d:%d", os.Getpid(), r.started.UnixNano()%1e6, r.runs)}
}

// reset empties Redis before a run, so that no run inherits another's
// state.
func (r *runner) reset() error {
	runtime.GC() // start every run with a clean heap, not the last run's garbage
	cctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	if err := r.b.reset(cctx); err != nil {
		return fmt.Errorf("flushing Redis between runs: %w", err)
	}
	return nil
}

// openLoops runs every scenario with every strategy, on the same arrivals.
func (r *runner) openLoops(scenarios []workload.Scenario) ([]report.Result, error) {
	var out []report.Result
	for _, sc := range scenarios {
		ol := newOpenLoop(sc, r.o.seed, r.o.poisson)
		for _, st := range r.o.strategies {
			r.p.next(sc.Name + " / " + st + r.label)
			if err := r.reset(); err != nil {
				return nil, err
			}
			ol.setup = r.newSetup(st, sc.Rate, sc.Burst)
			res, err := ol.run(r.ctx)
			if err != nil {
				return nil, fmt.Errorf("%s / %s: %w", sc.Name, st, err)
			}
			out = append(out, res)
		}
	}
	return out, nil
}

// baselines runs the bare baseline on scenarios. Redis is not emptied
// first: the baseline does not use it.
func (r *runner) baselines(scenarios []workload.Scenario) ([]report.Result, error) {
	var out []report.Result
	for _, sc := range scenarios {
		r.p.next(sc.Name + " / " + bare + " (latency baseline)")
		ol := newOpenLoop(sc, r.o.seed, r.o.poisson)
		runtime.GC()
		ol.setup = r.newSetup(bare, sc.Rate, sc.Burst)
		res, err := ol.run(r.ctx)
		if err != nil {
			return nil, fmt.Errorf("%s / %s: %w", sc.Name, bare, err)
		}
		out = append(out, res)
	}
	return out, nil
}

// closedLoops runs every closed-loop shape with every strategy.
func (r *runner) closedLoops(shapes []closedLoop) ([]report.ClosedLoop, error) {
	var out []report.ClosedLoop
	for _, sh := range shapes {
		for _, st := range r.o.strategies {
			r.p.next("closed loop, " + sh.shape + " / " + st)
			if err := r.reset(); err != nil {
				return nil, err
			}
			cl := sh
			cl.setup = r.newSetup(st, sh.rate, sh.burst)
			cl.workers = r.o.workers
			res, err := cl.run(r.ctx)
			if err != nil {
				return nil, fmt.Errorf("closed loop %s / %s: %w", sh.shape, st, err)
			}
			out = append(out, res)
		}
	}
	return out, nil
}

// joinClosedLoops gives every scenario's row the decisions per second of
// its strategy's closed loop on the same shape of keys: the open loop
// paces arrivals, so it cannot measure the most decisions per second.
func joinClosedLoops(rep *report.Report) {
	for i := range rep.Scenarios {
		res := &rep.Scenarios[i]
		res.ClosedLoopShape = shapeOne
		if res.Keys > 1 {
			res.ClosedLoopShape = shapeKeys
		}
		for _, c := range rep.ClosedLoop {
			if c.Strategy == res.Strategy && c.Shape == res.ClosedLoopShape {
				res.DecisionsPerSec = c.DecisionsPerSec
			}
		}
	}
}

// addNotes adds to rep what a reader needs to read its figures right.
func addNotes(rep *report.Report, o options) {
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("Latencies are of every decision in the measured window and include two clock reads (about %d ns here).", rep.ClockNS),
		fmt.Sprintf("decisions/s is a separate closed-loop run: %d goroutines per instance deciding back to back on one key (limit 1000/s) or on the keys scenario's Zipf keys.", o.workers),
		failLocalNote, windowNote,
	)
	if rep.RedisKind != "embedded" {
		rep.Notes = append(rep.Notes, serverCountNote)
	}
}

// Notes of the default run and of the sweep.
const (
	failLocalNote   = "redis_rate admits a request when Redis cannot answer (fails open); local, global and hybrid use the FailLocal outage policy."
	windowNote      = "Accuracy, decisions and Redis commands cover the measured window, after a warm-up; the reference is one exact token bucket per key fed the merged arrivals of all instances."
	serverCountNote = "Redis commands are counted by the server (INFO commandstats), without the bench's own INFO, FLUSHALL, CLIENT PAUSE, PING and HELLO, nor the commands scripts run (reported apart in the JSON)."
)

// Closed-loop shapes.
const (
	shapeOne  = "one key"
	shapeKeys = "keys"
)

// closedShapes returns the closed-loop runs to make for each strategy: one
// hot key with the balanced scenario's limit, and the keys scenario's Zipf
// keys and limit.
func closedShapes(t workload.Timing, seed uint64) []closedLoop {
	var out []closedLoop
	for _, sc := range workload.Scenarios(t) {
		switch sc.Name {
		case workload.Balanced:
			out = append(out, closedLoop{shape: shapeOne, scenario: sc.Name, instances: sc.Instances, keys: sc.KeyNames(),
				seq: []int32{0}, rate: sc.Rate, burst: sc.Burst, warm: t.ClosedLoop / 4, dur: t.ClosedLoop})
		case workload.Keys:
			r := rand.New(rand.NewPCG(seed, 99))
			z := rand.NewZipf(r, sc.ZipfS, 1, uint64(sc.Keys-1))
			seq := make([]int32, 1<<16)
			for i := range seq {
				seq[i] = int32(z.Uint64())
			}
			out = append(out, closedLoop{shape: shapeKeys, scenario: sc.Name, instances: sc.Instances, keys: sc.KeyNames(),
				seq: seq, rate: sc.Rate, burst: sc.Burst, warm: t.ClosedLoop / 4, dur: t.ClosedLoop})
		}
	}
	return out
}

// clockOverhead is the median cost of a timed empty section: the two clock
// reads that every measured decision includes.
func clockOverhead() int64 {
	d := make([]time.Duration, 10001)
	for i := range d {
		t0 := time.Now()
		d[i] = time.Since(t0)
	}
	return pct(d, 0.5)
}
