package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybridlimit/bench/internal/report"
	"github.com/hybridlimit/hybridlimit/bench/internal/workload"
	"github.com/hybridlimit/hybridlimit/internal/redisproc"
)

// lateAfter is how late a decision may start after it was due before it
// counts as late: the driver paces itself with sleeps of up to 1ms, so a
// few milliseconds are scheduling, not a strategy falling behind.
const lateAfter = 5 * time.Millisecond

// slotRecord is what happened to each arrival of one slot's schedule.
type slotRecord struct {
	started []time.Duration // offset from the start when its decision began; -1 if never decided
	latency []time.Duration
	allowed []bool
	errs    int64
	err     error // a leave or join that failed
}

func newSlotRecord(n int) *slotRecord {
	r := &slotRecord{started: make([]time.Duration, n), latency: make([]time.Duration, n), allowed: make([]bool, n)}
	for i := range r.started {
		r.started[i] = -1
	}
	return r
}

// openLoop is one scenario run with one strategy.
type openLoop struct {
	sc       workload.Scenario
	arrivals [][]workload.Arrival
	ref      workload.Reference
	keys     []string
	setup    *setup
	// grace is how long after the end a strategy that fell behind may go
	// on deciding the arrivals it owes.
	grace time.Duration
	// shedAfter is how late an arrival may be before the driver drops it
	// undecided, as a server drops a request that waited too long in its
	// queue: a strategy that cannot keep up then still decides arrivals
	// spread over the whole run, not only the oldest.
	shedAfter time.Duration
}

// run drives the schedule through a fresh cluster and returns the result.
func (o *openLoop) run(ctx context.Context) (report.Result, error) {
	sc, s := o.sc, o.setup
	c, err := newCluster(s, sc.Instances)
	if err != nil {
		return report.Result{}, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.close(cctx)
	}()

	recs := make([]*slotRecord, sc.Instances)
	slotEvents := make([][]workload.Event, sc.Instances)
	var redisEvents []workload.Event
	for _, e := range sc.Events {
		switch e.Kind {
		case workload.Leave, workload.Join:
			slotEvents[e.Slot] = append(slotEvents[e.Slot], e)
		default:
			redisEvents = append(redisEvents, e)
		}
	}

	// Commands are counted over the measured window: from the end of the
	// warm-up to the end of the run, before the instances close.
	var server0 map[string]int64
	var client0 int64
	var serverOK bool
	var snapErr error
	start := time.Now()
	var wg sync.WaitGroup
	for i := range recs {
		recs[i] = newSlotRecord(len(o.arrivals[i]))
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.drive(ctx, start, c, i, slotEvents[i], recs[i])
		}()
	}
	var side sync.WaitGroup
	side.Add(1)
	go func() {
		defer side.Done()
		if !sleepUntil(ctx, start.Add(sc.Warmup)) {
			return
		}
		client0 = s.sent.Load()
		server0, serverOK, snapErr = s.backend.commands(ctx)
	}()
	var outageErr error
	if len(redisEvents) > 0 {
		side.Add(1)
		go func() {
			defer side.Done()
			outageErr = o.stage(ctx, start, redisEvents)
		}()
	}
	wg.Wait()
	side.Wait()
	if err := ctx.Err(); err != nil {
		return report.Result{}, err
	}
	if outageErr != nil {
		return report.Result{}, outageErr
	}
	if snapErr != nil {
		return report.Result{}, fmt.Errorf("counting commands at the end of the warm-up: %w", snapErr)
	}
	client1 := s.sent.Load()
	server1, _, err := s.backend.commands(ctx)
	if err != nil {
		return report.Result{}, fmt.Errorf("counting commands at the end: %w", err)
	}
	for _, r := range recs {
		if r.err != nil {
			return report.Result{}, r.err
		}
	}

	res := o.summarise(recs)
	res.RedisCommandsClient = client1 - client0
	if serverOK {
		res.RedisCalls = make(map[string]int64)
		for name, n := range server1 {
			if d := n - server0[name]; d != 0 {
				res.RedisCalls[name] = d
			}
		}
		res.RedisCommands, res.RedisScriptCalls = redisproc.Split(res.RedisCalls)
		res.RedisCountedBy = "server"
	} else {
		res.RedisCommands, res.RedisCountedBy = res.RedisCommandsClient, "client"
	}
	return res, nil
}

// drive is slot i's driver: it decides every arrival when it is due (or as
// soon after as it can), whatever the answers, and applies the slot's
// leave and join events at their time.
func (o *openLoop) drive(ctx context.Context, start time.Time, c *cluster, slot int, events []workload.Event, rec *slotRecord) {
	arr := o.arrivals[slot]
	deadline := o.sc.End() + o.grace
	i, ev := 0, 0
	apply := func(upTo time.Duration) bool {
		for ev < len(events) && events[ev].At <= upTo {
			e := events[ev]
			ev++
			var err error
			if e.Kind == workload.Leave {
				err = c.leave(ctx, slot)
			} else {
				err = c.join(slot)
			}
			if err != nil {
				rec.err = fmt.Errorf("%s of slot %d: %w", e.Kind, slot, err)
				return false
			}
		}
		return true
	}
	for ctx.Err() == nil {
		now := time.Since(start)
		upTo := now
		if i < len(arr) {
			// Events never overtake an arrival that was due before them.
			upTo = min(upTo, arr[i].At)
		}
		if !apply(upTo) {
			return
		}
		if i >= len(arr) && ev >= len(events) {
			return
		}
		if now >= deadline {
			return
		}
		for i < len(arr) && arr[i].At <= now {
			if !apply(arr[i].At) {
				return
			}
			inst := c.slots[slot]
			if inst == nil { // no instance in the slot: left undecided
				i++
				continue
			}
			t0 := time.Now()
			if t0.Sub(start)-arr[i].At > o.shedAfter {
				i++ // dropped: left undecided
				continue
			}
			ok, err := inst.allow(ctx, o.keys[arr[i].Key])
			lat := time.Since(t0)
			rec.started[i] = t0.Sub(start)
			rec.latency[i] = lat
			rec.allowed[i] = ok
			if err != nil {
				rec.errs++
			}
			i++
			if rec.started[i-1] >= deadline {
				break
			}
		}
		next := deadline
		if i < len(arr) {
			next = arr[i].At
		}
		if ev < len(events) {
			next = min(next, events[ev].At)
		}
		// Pace the open loop: sleep until the next arrival, at most 1ms at
		// a time. This schedules arrivals; it waits for nothing.
		if d := next - time.Since(start); d > 0 {
			time.Sleep(min(d, time.Millisecond))
		}
	}
}

// stage runs the Redis events of an outage at their time.
func (o *openLoop) stage(ctx context.Context, start time.Time, events []workload.Event) error {
	b := o.setup.backend
	_, restartAt, _ := o.sc.Window()
	for _, e := range events {
		if !sleepUntil(ctx, start.Add(e.At)) {
			return ctx.Err()
		}
		var err error
		switch e.Kind {
		case workload.Pause:
			// Longer than the window: the kill comes while still paused, so
			// that held commands never run.
			err = b.pause(ctx, restartAt-e.At+10*time.Second)
		case workload.Kill:
			err = b.kill(ctx)
		case workload.Restart:
			err = b.restart(ctx)
		}
		if err != nil {
			return fmt.Errorf("outage: %s: %w", e.Kind, err)
		}
	}
	return nil
}

// sleepUntil sleeps until t or ctx ends; it reports whether t came.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// summarise turns the records into a result (without the command counts).
func (o *openLoop) summarise(recs []*slotRecord) report.Result {
	sc := o.sc
	res := report.Result{
		Scenario: sc.Name, Strategy: o.setup.strategy, Instances: sc.Instances,
		ReferenceAllowed: int64(o.ref.Admitted), Arrivals: int64(o.ref.Arrivals),
		Rate: sc.Rate, Burst: sc.Burst, Keys: max(sc.Keys, 1), Demand: sc.Demand,
		WarmupNS: int64(sc.Warmup), EndNS: int64(sc.End()), BucketNS: int64(sc.Bucket),
		LateAfterNS: int64(lateAfter), ShedAfterNS: int64(o.shedAfter),
		Series: make([]int, sc.Buckets()), RefSeries: o.ref.Series, Demanded: o.ref.Demand,
	}
	for _, e := range sc.Events {
		res.Events = append(res.Events, report.Event{AtNS: int64(e.At), Kind: e.Kind.String(), Slot: e.Slot})
	}
	from, to, outage := sc.Window()
	var lat, lags, down, up []time.Duration
	keyAllowed := make([]int64, len(o.ref.KeyArrivals))
	for slot, r := range recs {
		res.Errors += r.errs
		for i, a := range o.arrivals[slot] {
			started := r.started[i]
			if started < 0 {
				if a.At >= sc.Warmup {
					res.Unprocessed++
				}
				continue
			}
			if r.allowed[i] {
				b := min(int(started/sc.Bucket), len(res.Series)-1)
				res.Series[b]++
			}
			if a.At < sc.Warmup {
				continue
			}
			res.Decisions++
			if r.allowed[i] {
				res.Allowed++
				keyAllowed[a.Key]++
			}
			lat = append(lat, r.latency[i])
			lag := started - a.At
			lags = append(lags, lag)
			if lag > lateAfter {
				res.Late++
			}
			if outage {
				if started >= from && started < to {
					down = append(down, r.latency[i])
					res.OutageDecisions++
					if r.allowed[i] {
						res.OutageAllowed++
					}
				} else {
					up = append(up, r.latency[i])
				}
			}
		}
	}
	for _, n := range o.ref.KeyArrivals {
		if n > 0 {
			res.DistinctKeys++
		}
	}
	// Bands of popularity rank: 1–10, 11–100, 101–1000, ...
	for first, last := 1, 10; len(keyAllowed) > 1 && first <= len(keyAllowed); first, last = last+1, last*10 {
		band := report.KeyBand{First: first, Last: min(last, len(keyAllowed))}
		for k := first - 1; k < band.Last; k++ {
			band.Arrivals += int64(o.ref.KeyArrivals[k])
			band.ReferenceAllowed += int64(o.ref.KeyAdmitted[k])
			band.Allowed += keyAllowed[k]
		}
		if band.ReferenceAllowed > 0 {
			band.Accuracy = float64(band.Allowed) / float64(band.ReferenceAllowed)
		}
		res.KeyBands = append(res.KeyBands, band)
	}
	res.P50, res.P99 = pct(lat, 0.50), pct(lat, 0.99)
	res.P999, res.Max = pct(lat, 0.999), pct(lat, 1)
	res.LagP99, res.LagMax = pct(lags, 0.99), pct(lags, 1)
	if outage {
		res.OutageP50, res.OutageP99 = pct(down, 0.50), pct(down, 0.99)
		res.UpP99 = pct(up, 0.99)
		for b, n := range o.ref.Series {
			if t := time.Duration(b) * sc.Bucket; t >= from && t < to {
				res.OutageReference += int64(n)
			}
		}
	}
	return res
}

// pct returns the q-quantile (nearest rank) of d in nanoseconds; it sorts d.
func pct(d []time.Duration, q float64) int64 {
	if len(d) == 0 {
		return 0
	}
	if !slices.IsSorted(d) {
		slices.Sort(d)
	}
	i := int(q*float64(len(d))+0.999999) - 1
	return int64(d[min(max(i, 0), len(d)-1)])
}

// closedLoop measures how many decisions per second a strategy makes when
// every instance's workers decide back to back.
type closedLoop struct {
	setup     *setup
	shape     string
	instances int
	workers   int
	keys      []string
	seq       []int32 // key indices each worker walks, from its own offset
	rate      float64
	burst     int
	warm, dur time.Duration
}

func (cl *closedLoop) run(ctx context.Context) (report.ClosedLoop, error) {
	c, err := newCluster(cl.setup, cl.instances)
	if err != nil {
		return report.ClosedLoop{}, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.close(cctx)
	}()
	type counter struct {
		n    atomic.Int64
		errs atomic.Int64
		_    [48]byte // keep workers' counters off one another's cache lines
	}
	counts := make([]counter, cl.instances*cl.workers)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range counts {
		inst := c.slots[w%cl.instances]
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := w * 7919
			var n, errs int64
			for !stop.Load() && ctx.Err() == nil {
				if _, err := inst.allow(ctx, cl.keys[cl.seq[k%len(cl.seq)]]); err != nil {
					errs++
					counts[w].errs.Store(errs)
				}
				k++
				n++
				// A plain store to this worker's own cache line: cheap
				// next to any decision.
				counts[w].n.Store(n)
			}
		}()
	}
	sum := func() (n, errs int64) {
		for i := range counts {
			n += counts[i].n.Load()
			errs += counts[i].errs.Load()
		}
		return n, errs
	}
	sleepUntil(ctx, time.Now().Add(cl.warm))
	n0, e0 := sum()
	t0 := time.Now()
	sleepUntil(ctx, t0.Add(cl.dur))
	n1, e1 := sum()
	// A strategy slower than the whole run (a tiny -scale on the embedded
	// Redis) gets until its first decision completes, up to a limit.
	for wait := time.Now().Add(5 * time.Second); n1 == n0 && time.Now().Before(wait) && ctx.Err() == nil; n1, e1 = sum() {
		time.Sleep(time.Millisecond) // poll interval
	}
	secs := time.Since(t0).Seconds()
	stop.Store(true)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return report.ClosedLoop{}, err
	}
	if n1 == n0 {
		return report.ClosedLoop{}, errors.New("no decision completed")
	}
	return report.ClosedLoop{
		Strategy: cl.setup.strategy, Shape: cl.shape, Instances: cl.instances, Workers: cl.workers,
		Decisions: n1 - n0, Seconds: secs, DecisionsPerSec: float64(n1-n0) / secs, Errors: e1 - e0,
	}, nil
}
