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

// newOpenLoop prepares sc's run: its arrivals and what the exact reference
// admits of them, the same for every strategy.
func newOpenLoop(sc workload.Scenario, seed uint64, poisson bool) openLoop {
	arr := sc.Arrivals(seed, poisson)
	return openLoop{sc: sc, arrivals: arr, ref: sc.Reference(arr), keys: sc.KeyNames(),
		grace: max(sc.Measure/20, 10*time.Millisecond), shedAfter: max(sc.Measure/10, 20*time.Millisecond)}
}

// run drives the schedule through a fresh cluster and returns the result.
func (o *openLoop) run(ctx context.Context) (report.Result, error) {
	c, err := newCluster(o.setup, o.sc.Instances)
	if err != nil {
		return report.Result{}, err
	}
	defer shut(c)
	count := &commandCount{setup: o.setup}
	recs, err := o.play(ctx, c, count)
	if err != nil {
		return report.Result{}, err
	}
	if err := count.end(ctx); err != nil {
		return report.Result{}, err
	}
	for _, r := range recs {
		if r.err != nil {
			return report.Result{}, r.err
		}
	}
	res := o.summarise(recs)
	count.fill(&res)
	return res, nil
}

// shut closes c after its run with a deadline of its own: the run's
// context may have ended, and the instances must close all the same.
func shut(c *cluster) {
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.close(cctx)
}

// play runs the schedule on c: a driver per slot and, beside them, the
// command count at the end of the warm-up and the outage's Redis events.
// It returns when they are all done.
func (o *openLoop) play(ctx context.Context, c *cluster, count *commandCount) ([]*slotRecord, error) {
	slotEvents, redisEvents := splitEvents(o.sc.Events, o.sc.Instances)
	recs := make([]*slotRecord, o.sc.Instances)
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
		if sleepUntil(ctx, start.Add(o.sc.Warmup)) {
			count.begin(ctx)
		}
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
		return nil, err
	}
	if outageErr != nil {
		return nil, outageErr
	}
	return recs, nil
}

// splitEvents parts events between the slots' drivers, which apply the
// leaves and joins of their own slot, and stage, which applies the rest.
func splitEvents(events []workload.Event, slots int) (slotEvents [][]workload.Event, redisEvents []workload.Event) {
	slotEvents = make([][]workload.Event, slots)
	for _, e := range events {
		switch e.Kind {
		case workload.Leave, workload.Join:
			slotEvents[e.Slot] = append(slotEvents[e.Slot], e)
		default:
			redisEvents = append(redisEvents, e)
		}
	}
	return slotEvents, redisEvents
}

// commandCount counts the Redis commands of a run over its measured
// window: from the end of the warm-up to the end of the run, before the
// instances close. The server counts them where it can; the clients'
// count is kept beside it as a cross-check.
type commandCount struct {
	setup            *setup
	client0, client1 int64
	server0, server1 map[string]int64
	serverOK         bool
	err              error // of the count at the end of the warm-up
}

// begin takes the counts at the end of the warm-up. It runs beside the
// drivers, which must not stop for it, so its error waits for end.
func (cc *commandCount) begin(ctx context.Context) {
	cc.client0 = cc.setup.sent.Load()
	cc.server0, cc.serverOK, cc.err = cc.setup.backend.commands(ctx)
}

// end takes the counts at the end of the run.
func (cc *commandCount) end(ctx context.Context) error {
	if cc.err != nil {
		return fmt.Errorf("counting commands at the end of the warm-up: %w", cc.err)
	}
	cc.client1 = cc.setup.sent.Load()
	var err error
	if cc.server1, _, err = cc.setup.backend.commands(ctx); err != nil {
		return fmt.Errorf("counting commands at the end: %w", err)
	}
	return nil
}

// fill sets the command counts of res.
func (cc *commandCount) fill(res *report.Result) {
	res.RedisCommandsClient = cc.client1 - cc.client0
	if !cc.serverOK {
		res.RedisCommands, res.RedisCountedBy = res.RedisCommandsClient, "client"
		return
	}
	res.RedisCalls = make(map[string]int64)
	for name, n := range cc.server1 {
		if d := n - cc.server0[name]; d != 0 {
			res.RedisCalls[name] = d
		}
	}
	res.RedisCommands, res.RedisScriptCalls = redisproc.Split(res.RedisCalls)
	res.RedisCountedBy = "server"
}

// drive is slot i's driver: it decides every arrival when it is due (or as
// soon after as it can), whatever the answers, and applies the slot's
// leave and join events at their time.
func (o *openLoop) drive(ctx context.Context, start time.Time, c *cluster, slot int, events []workload.Event, rec *slotRecord) {
	d := &slotDriver{o: o, ctx: ctx, start: start, c: c, slot: slot, arr: o.arrivals[slot], events: events, rec: rec,
		deadline: o.sc.End() + o.grace}
	for ctx.Err() == nil {
		now := time.Since(start)
		upTo := now
		if d.i < len(d.arr) {
			// Events never overtake an arrival that was due before them.
			upTo = min(upTo, d.arr[d.i].At)
		}
		if !d.apply(upTo) {
			return
		}
		if d.i >= len(d.arr) && d.ev >= len(events) {
			return
		}
		if now >= d.deadline {
			return
		}
		if !d.decideDue(now) {
			return
		}
		d.pace()
	}
}

// slotDriver is the state of one slot's driver.
type slotDriver struct {
	o        *openLoop
	ctx      context.Context
	start    time.Time
	c        *cluster
	slot     int
	arr      []workload.Arrival
	events   []workload.Event
	rec      *slotRecord
	deadline time.Duration
	i, ev    int // the next arrival and the next event
}

// apply applies the slot's events due up to upTo. It reports false if one
// failed, with the error in rec.err: the slot cannot go on.
func (d *slotDriver) apply(upTo time.Duration) bool {
	for d.ev < len(d.events) && d.events[d.ev].At <= upTo {
		e := d.events[d.ev]
		d.ev++
		var err error
		if e.Kind == workload.Leave {
			err = d.c.leave(d.ctx, d.slot)
		} else {
			err = d.c.join(d.slot)
		}
		if err != nil {
			d.rec.err = fmt.Errorf("%s of slot %d: %w", e.Kind, d.slot, err)
			return false
		}
	}
	return true
}

// decideDue decides, in order, the arrivals due by now, applying the
// events due between them; it reports false as apply does.
func (d *slotDriver) decideDue(now time.Duration) bool {
	for d.i < len(d.arr) && d.arr[d.i].At <= now {
		if !d.apply(d.arr[d.i].At) {
			return false
		}
		if d.decide() {
			break
		}
	}
	return true
}

// decide decides the next arrival, unless the slot is empty or the arrival
// is too late; it reports whether the decision began past the deadline.
func (d *slotDriver) decide() (pastDeadline bool) {
	i, rec := d.i, d.rec
	d.i++
	inst := d.c.slots[d.slot]
	if inst == nil { // no instance in the slot: left undecided
		return false
	}
	t0 := time.Now()
	if t0.Sub(d.start)-d.arr[i].At > d.o.shedAfter {
		return false // dropped: left undecided
	}
	ok, err := inst.allow(d.ctx, d.o.keys[d.arr[i].Key])
	lat := time.Since(t0)
	rec.started[i] = t0.Sub(d.start)
	rec.latency[i] = lat
	rec.allowed[i] = ok
	if err != nil {
		rec.errs++
	}
	return rec.started[i] >= d.deadline
}

// pace waits for the next arrival or event, or the deadline.
func (d *slotDriver) pace() {
	next := d.deadline
	if d.i < len(d.arr) {
		next = d.arr[d.i].At
	}
	if d.ev < len(d.events) {
		next = min(next, d.events[d.ev].At)
	}
	// Pace the open loop: sleep until the next arrival, at most 1ms at
	// a time. This schedules arrivals; it waits for nothing.
	if w := next - time.Since(d.start); w > 0 {
		time.Sleep(min(w, time.Millisecond))
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
	res := o.newResult()
	s := o.tally(&res, recs)
	for _, n := range o.ref.KeyArrivals {
		if n > 0 {
			res.DistinctKeys++
		}
	}
	res.KeyBands = o.keyBands(s.keyAllowed)
	if o.sc.Keys <= 1 {
		for slot, allowed := range s.slotAllowed {
			res.Slots = append(res.Slots, report.SlotShare{Arrivals: int64(o.ref.SlotArrivals[slot]),
				Allowed: allowed, Fair: o.ref.SlotFair[slot]})
		}
		slices.Sort(s.admitted)
		most, from := workload.Peak(s.admitted, workload.PeakWidth)
		res.MaxWindow = &report.Window{WidthNS: int64(workload.PeakWidth), Admitted: int64(most), FromNS: int64(from),
			Reference: int64(o.ref.Peak), Bound: o.sc.Rate*workload.PeakWidth.Seconds() + float64(o.sc.Burst)}
	}
	res.P50, res.P99 = pct(s.lat, 0.50), pct(s.lat, 0.99)
	res.P999, res.Max = pct(s.lat, 0.999), pct(s.lat, 1)
	res.LagP99, res.LagMax = pct(s.lags, 0.99), pct(s.lags, 1)
	if from, to, outage := o.sc.Window(); outage {
		res.OutageP50, res.OutageP99 = pct(s.down, 0.50), pct(s.down, 0.99)
		res.UpP99 = pct(s.up, 0.99)
		for b, n := range o.ref.Series {
			if t := time.Duration(b) * o.sc.Bucket; t >= from && t < to {
				res.OutageReference += int64(n)
			}
		}
	}
	return res
}

// newResult returns a result with the scenario, the reference and the
// run's settings, and nothing measured yet.
func (o *openLoop) newResult() report.Result {
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
	return res
}

// samples are what summarise makes percentiles and key bands of.
type samples struct {
	lat, lags   []time.Duration
	down, up    []time.Duration // latencies in and out of the outage window
	keyAllowed  []int64         // by key, in the measured window
	slotAllowed []int64         // by slot (instance), in the measured window
	admitted    []time.Duration // when each admitted decision started, over the whole run; one key only
}

// tally counts the decisions of recs into res: every admission in the
// time series, the rest in the measured window only.
func (o *openLoop) tally(res *report.Result, recs []*slotRecord) samples {
	sc := o.sc
	from, to, outage := sc.Window()
	s := samples{keyAllowed: make([]int64, len(o.ref.KeyArrivals)), slotAllowed: make([]int64, len(recs))}
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
				if sc.Keys <= 1 {
					s.admitted = append(s.admitted, started)
				}
			}
			if a.At < sc.Warmup {
				continue
			}
			res.Decisions++
			if r.allowed[i] {
				res.Allowed++
				s.keyAllowed[a.Key]++
				s.slotAllowed[slot]++
			}
			s.lat = append(s.lat, r.latency[i])
			lag := started - a.At
			s.lags = append(s.lags, lag)
			if lag > lateAfter {
				res.Late++
			}
			if outage {
				if started >= from && started < to {
					s.down = append(s.down, r.latency[i])
					res.OutageDecisions++
					if r.allowed[i] {
						res.OutageAllowed++
					}
				} else {
					s.up = append(s.up, r.latency[i])
				}
			}
		}
	}
	return s
}

// keyBands splits the measured window by bands of popularity rank (1–10,
// 11–100, 101–1000, ...), given what was allowed of each key; it returns
// none for a single key. Keys of Zipf popularity are ranked by it (key
// index 0 first); the others by their arrivals in the measured window,
// those without any left out.
func (o *openLoop) keyBands(keyAllowed []int64) []report.KeyBand {
	rank := make([]int, len(keyAllowed))
	for i := range rank {
		rank[i] = i
	}
	if o.sc.ZipfS <= 1 {
		n := o.ref.KeyArrivals
		slices.SortStableFunc(rank, func(a, b int) int { return n[b] - n[a] })
		rank = slices.DeleteFunc(rank, func(k int) bool { return n[k] == 0 })
	}
	var bands []report.KeyBand
	for first, last := 1, 10; len(keyAllowed) > 1 && first <= len(rank); first, last = last+1, last*10 {
		band := report.KeyBand{First: first, Last: min(last, len(rank))}
		for _, k := range rank[first-1 : band.Last] {
			band.Arrivals += int64(o.ref.KeyArrivals[k])
			band.ReferenceAllowed += int64(o.ref.KeyAdmitted[k])
			band.Allowed += keyAllowed[k]
		}
		if band.ReferenceAllowed > 0 {
			band.Accuracy = float64(band.Allowed) / float64(band.ReferenceAllowed)
		}
		bands = append(bands, band)
	}
	return bands
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
	setup *setup
	shape string
	// scenario is the scenario whose keys and limit the shape takes.
	scenario  string
	instances int
	workers   int
	keys      []string
	seq       []int32 // key indices each worker walks, from its own offset
	rate      float64
	burst     int
	warm, dur time.Duration
}

// run measures cl's strategy on a fresh cluster.
func (cl *closedLoop) run(ctx context.Context) (report.ClosedLoop, error) {
	c, err := newCluster(cl.setup, cl.instances)
	if err != nil {
		return report.ClosedLoop{}, err
	}
	defer shut(c)
	ws := cl.startWorkers(ctx, c)
	n, errs, secs := cl.measure(ctx, ws)
	ws.stop.Store(true)
	ws.wg.Wait()
	if err := ctx.Err(); err != nil {
		return report.ClosedLoop{}, err
	}
	if n == 0 {
		return report.ClosedLoop{}, errors.New("no decision completed")
	}
	return report.ClosedLoop{
		Strategy: cl.setup.strategy, Shape: cl.shape, Instances: cl.instances, Workers: cl.workers,
		Decisions: n, Seconds: secs, DecisionsPerSec: float64(n) / secs, Errors: errs,
	}, nil
}

// closedWorkers are the goroutines of a closed loop and their counts.
type closedWorkers struct {
	counts []closedCount
	stop   atomic.Bool
	wg     sync.WaitGroup
}

// closedCount is one worker's count of its decisions and errors.
type closedCount struct {
	n    atomic.Int64
	errs atomic.Int64
	_    [48]byte // keep workers' counters off one another's cache lines
}

// startWorkers starts cl.workers workers per instance of c, deciding back
// to back until stopped.
func (cl *closedLoop) startWorkers(ctx context.Context, c *cluster) *closedWorkers {
	ws := &closedWorkers{counts: make([]closedCount, cl.instances*cl.workers)}
	counts, stop := ws.counts, &ws.stop
	for w := range counts {
		inst := c.slots[w%cl.instances]
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
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
	return ws
}

// sum returns the decisions and errors of every worker so far.
func (ws *closedWorkers) sum() (n, errs int64) {
	for i := range ws.counts {
		n += ws.counts[i].n.Load()
		errs += ws.counts[i].errs.Load()
	}
	return n, errs
}

// measure lets the workers warm up for cl.warm, then returns the decisions
// and errors of the cl.dur that follow, and how long that took in seconds.
func (cl *closedLoop) measure(ctx context.Context, ws *closedWorkers) (n, errs int64, secs float64) {
	sleepUntil(ctx, time.Now().Add(cl.warm))
	n0, e0 := ws.sum()
	t0 := time.Now()
	sleepUntil(ctx, t0.Add(cl.dur))
	n1, e1 := ws.sum()
	// A strategy slower than the whole run (a tiny -scale on the embedded
	// Redis) gets until its first decision completes, up to a limit.
	for wait := time.Now().Add(5 * time.Second); n1 == n0 && time.Now().Before(wait) && ctx.Err() == nil; n1, e1 = ws.sum() {
		time.Sleep(time.Millisecond) // poll interval
	}
	return n1 - n0, e1 - e0, time.Since(t0).Seconds()
}
