package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/membership"
)

// demoOptions are the flags of the demo.
type demoOptions struct {
	instances int
	duration  time.Duration
	redisAddr string // empty: an embedded miniredis
	limits    []hybrid.Limit
	load      float64 // offered load as a multiple of each limit's rate
	table     bool
	logger    *slog.Logger
}

// phaseKind is one step of the demo.
type phaseKind int

const (
	balanced phaseKind = iota
	skewed
	redisDown
	redisBack
	leave
)

func (k phaseKind) String() string {
	return [...]string{"balanced load", "skewed load", "redis down", "redis back", "one leaves"}[k]
}

// skew is the share of the traffic the first instance gets in the skewed
// phase.
const skew = 0.8

// schedule returns the phases the demo runs with n instances, and a note
// for each phase it skips.
func schedule(n int, canStopRedis bool) ([]phaseKind, []string) {
	phases := []phaseKind{balanced}
	var notes []string
	if n > 1 {
		phases = append(phases, skewed)
	} else {
		notes = append(notes, "one instance: the skewed-load phase is skipped")
	}
	if canStopRedis {
		phases = append(phases, redisDown, redisBack)
	} else {
		notes = append(notes, "-redis given: the demo cannot stop that Redis, so the outage phases (redis down, redis back) are skipped")
	}
	if n > 1 {
		phases = append(phases, leave)
	} else {
		notes = append(notes, "one instance: the phase where an instance leaves is skipped")
	}
	return phases, notes
}

// demo is one run of the demo: a Redis, a cluster of instances and a load
// generator.
type demo struct {
	out    io.Writer
	opts   demoOptions
	mr     *embeddedRedis // nil with -redis
	redis  string         // Redis address
	insts  []*instance
	active []bool // whether each instance is still in the cluster
	load   *loadGen
	start  time.Time
	mark   time.Time // when the current phase's event (Redis stopped, ...) happened
}

// phaseResult is what one phase measured, after its settling time.
type phaseResult struct {
	kind    phaseKind
	secs    float64
	n       int            // instances in the cluster at the end
	limits  []limitResult  // per limit, across the cluster
	perInst [][]limitTotal // [instance][limit]
	active  []bool
	partial bool // cut short by an interrupt
}

// limitTotal is what one limit did over a phase, as counts.
type limitTotal struct {
	ok, denied, other, cmds uint64
}

// limitResult is one limit across the cluster over a phase.
type limitResult struct {
	limitTotal
	offered uint64 // requests the load generator sent
}

// snapshot is every counter of the demo at one moment.
type snapshot struct {
	at    time.Time
	insts [][]limitSample // [instance][limit]
	sent  []uint64        // per limit
}

func (d *demo) snapshot() snapshot {
	s := snapshot{at: time.Now(), sent: make([]uint64, len(d.opts.limits))}
	for _, in := range d.insts {
		s.insts = append(s.insts, in.sample())
	}
	for l := range s.sent {
		s.sent[l] = d.load.sent[l].Load()
	}
	return s
}

// runDemo runs the demo and returns the exit code: exitOK when it ran to the
// end, exitInterrupted when ctx ended first (Ctrl-C), exitError when it
// could not start.
func runDemo(ctx context.Context, opts demoOptions, stdout, stderr io.Writer) int {
	d := &demo{out: stdout, opts: opts}
	defer d.shutdown()
	if err := d.setUp(ctx); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stdout, "interrupted while starting")
			return exitInterrupted
		}
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return exitError
	}
	phases, notes := schedule(len(d.insts), d.mr != nil)
	length := opts.duration / time.Duration(len(phases))
	// Measure each phase once the longest lease of the one before has run
	// out, so that the outage phase shows the policies, not leases.
	settle := max(min(time.Second, length/3), uncontendedTTL)
	d.intro(notes, length)

	rates := make([]float64, len(opts.limits))
	paths := make([]string, len(opts.limits))
	addrs := make([]string, len(d.insts))
	for l, lim := range opts.limits {
		rates[l], paths[l] = lim.Rate*opts.load, lim.Name
	}
	for i, in := range d.insts {
		addrs[i] = in.httpAddr
	}
	d.load = startLoad(addrs, paths, rates)
	d.start = time.Now()

	var results []phaseResult
	for i, p := range phases {
		r, ok := d.runPhase(ctx, i, len(phases), p, length, settle)
		if r != nil {
			results = append(results, *r)
		}
		if !ok {
			break
		}
	}
	d.load.stop()
	interrupted := ctx.Err() != nil
	if interrupted {
		fmt.Fprintln(d.out, "\ninterrupted: stopping the cluster")
	}
	d.summary(results, settle)
	if interrupted {
		return exitInterrupted
	}
	return exitOK
}

// setUp starts Redis (unless one is given) and the instances, and waits
// until every instance counts all of them.
func (d *demo) setUp(ctx context.Context) error {
	d.redis = d.opts.redisAddr
	if d.redis == "" {
		mr, err := startRedis("127.0.0.1:0")
		if err != nil {
			return err
		}
		d.mr, d.redis = mr, mr.Addr()
	} else if err := ping(ctx, d.redis); err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %w (start one, or leave out -redis for an embedded one)", d.redis, err)
	}
	prefix := "hybridlimit-demo-" + randomHex(4) // runs sharing a Redis stay apart
	for i := range d.opts.instances {
		cfg := instanceConfig{
			Name:    fmt.Sprintf("i%d", i+1),
			Gossip:  "127.0.0.1:0",
			HTTP:    "127.0.0.1:0",
			Redis:   d.redis,
			Prefix:  prefix,
			Limits:  d.opts.limits,
			Profile: membership.Local,
		}
		if d.opts.logger != nil {
			cfg.Logger = d.opts.logger.With("instance", cfg.Name)
		}
		if i > 0 {
			cfg.Seeds = []string{d.insts[0].gossip}
		}
		in, err := startInstance(cfg)
		if err != nil {
			return fmt.Errorf("starting instance %s: %w", cfg.Name, err)
		}
		d.insts = append(d.insts, in)
		d.active = append(d.active, true)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return waitFor(ctx, 10*time.Second, func() bool {
		for _, in := range d.insts {
			if in.lim.Instances() != len(d.insts) {
				return false
			}
		}
		return true
	})
}

// ping checks that Redis answers at addr.
func ping(ctx context.Context, addr string) error {
	rdb := newRedisClient(addr)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return rdb.Ping(ctx).Err()
}

// waitFor polls cond until it holds, ctx ends or the timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("the instances did not find each other within " + timeout.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails
	return hex.EncodeToString(b)
}

// intro says what runs and how to read the table.
func (d *demo) intro(notes []string, length time.Duration) {
	w := d.out
	where := "an embedded Redis (miniredis) at " + d.redis
	if d.mr == nil {
		where = "the Redis at " + d.redis
	}
	fmt.Fprintf(w, "hybridlimit demo: %d instances on 127.0.0.1, each with its own memberlist node and HTTP server, and %s\n", len(d.insts), where)
	for _, in := range d.insts {
		fmt.Fprintf(w, "  %-4s gossip %-21s http://%s  (try /%s?key=you, /metrics, /healthz)\n", in.name, in.gossip, in.httpAddr, d.opts.limits[0].Name)
	}
	fmt.Fprintf(w, "limits, one key each, offered %gx their rate as real HTTP requests:\n", d.opts.load)
	for _, l := range d.opts.limits {
		fmt.Fprintf(w, "  %-8s %6g/s  burst %-4d %-7s on_outage %s\n", l.Name, l.Rate, l.Burst, l.Mode, l.OnOutage)
	}
	for _, n := range notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintf(w, "phases of %.1fs; every second, per instance and limit: mode (normal, or degraded while Redis is unreachable),\n", length.Seconds())
	fmt.Fprintln(w, "share (the rate it holds: its lease, or rate/N as a local quota; open or closed under those policies),")
	fmt.Fprintln(w, "requests admitted and denied per second, and the Redis commands it sent per second")
}

// runPhase runs one phase for length, printing a table row block every
// second, and returns what it measured after settle. ok is false when ctx
// ended first; the result then covers the phase so far, or is nil.
func (d *demo) runPhase(ctx context.Context, i, of int, p phaseKind, length, settle time.Duration) (res *phaseResult, ok bool) {
	fmt.Fprintf(d.out, "\n== phase %d/%d: %s (%.1fs): %s\n", i+1, of, p, length.Seconds(), d.enter(ctx, p))
	if d.opts.table {
		d.header()
	}
	begin := time.Now()
	settleT := time.NewTimer(settle)
	defer settleT.Stop()
	endT := time.NewTimer(length - time.Since(begin))
	defer endT.Stop()
	rows := time.NewTicker(time.Second)
	defer rows.Stop()
	poll := time.NewTicker(watchEvery)
	defer poll.Stop()
	watch := d.watcher(p)
	prev := d.snapshot()
	var from *snapshot
	for {
		select {
		case <-ctx.Done():
			if from == nil {
				return nil, false
			}
			r := d.result(p, *from, d.snapshot())
			r.partial = true
			return &r, false
		case <-poll.C:
			if watch == nil {
				continue
			}
			if msg, done := watch(); done {
				fmt.Fprintf(d.out, "   >> %s\n", msg)
				watch = nil
			}
		case <-settleT.C:
			s := d.snapshot()
			from = &s
		case <-rows.C:
			cur := d.snapshot()
			if d.opts.table {
				d.rows(prev, cur)
			}
			prev = cur
		case <-endT.C:
			cur := d.snapshot()
			if d.opts.table && cur.at.Sub(prev.at) > 200*time.Millisecond {
				d.rows(prev, cur)
			}
			if from == nil {
				from = &prev
			}
			r := d.result(p, *from, cur)
			return &r, true
		}
	}
}

// enter does what starts phase p and says what it is.
func (d *demo) enter(ctx context.Context, p phaseKind) string {
	live := d.live()
	switch p {
	case balanced:
		d.balance()
		return fmt.Sprintf("each instance gets 1/%d of the traffic", len(live))
	case skewed:
		w := make([]float64, len(d.insts))
		for k, i := range live {
			w[i] = (1 - skew) / float64(len(live)-1)
			if k == 0 {
				w[i] = skew
			}
		}
		d.load.setWeights(w)
		return fmt.Sprintf("%s gets %.0f%% of the traffic; leases follow the demand, not 1/N", d.insts[live[0]].name, skew*100)
	case redisDown:
		d.balance()
		d.mark = time.Now()
		d.mr.Stop()
		return fmt.Sprintf("Redis is stopped; when their leases run out (within %v) the limits follow their on_outage policies", uncontendedTTL)
	case redisBack:
		d.mark = time.Now()
		if err := d.mr.Restart(); err != nil {
			return fmt.Sprintf("Redis could not be restarted (%v): the limits stay degraded", err)
		}
		return "Redis is back on the same address; leases resume at the next renewal"
	case leave:
		d.balance()
		last := live[len(live)-1]
		in := d.insts[last]
		w := make([]float64, len(d.insts))
		for _, i := range live[:len(live)-1] {
			w[i] = 1
		}
		d.load.setWeights(w)
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		d.load.drain(dctx, last)
		cancel()
		d.load.client.CloseIdleConnections() // lets its server shut down at once
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		d.mark = time.Now()
		err := in.close(cctx)
		cancel()
		d.active[last] = false
		msg := fmt.Sprintf("%s leaves the cluster (N %d -> %d), releasing its leases; the others re-split the shares and take its traffic",
			in.name, len(live), len(live)-1)
		if err != nil {
			msg += fmt.Sprintf(" (closing it: %v)", err)
		}
		return msg
	}
	return ""
}

// watchEvery is how often a phase checks whether its event has played out.
const watchEvery = 20 * time.Millisecond

// watcher returns a check of whether phase p's event has played out on
// every live instance, and a line saying how long it took; nil when the
// phase has none.
func (d *demo) watcher(p phaseKind) func() (string, bool) {
	every := func(ok func(l hybrid.Limit, st hybrid.Status) bool) bool {
		for _, i := range d.live() {
			for _, l := range d.opts.limits {
				st, _ := d.insts[i].lim.Status(l.Name)
				if !ok(l, st) {
					return false
				}
			}
		}
		return true
	}
	since := func() float64 { return time.Since(d.mark).Seconds() }
	switch p {
	case redisDown:
		return func() (string, bool) {
			return fmt.Sprintf("every limit on every instance follows its outage policy, %.2fs after Redis stopped", since()),
				every(func(l hybrid.Limit, st hybrid.Status) bool {
					return l.Mode == hybrid.Local || st.Degraded && st.LeasedRate == 0
				})
		}
	case redisBack:
		return func() (string, bool) {
			return fmt.Sprintf("every limit on every instance runs on its leases again, %.2fs after Redis returned", since()),
				every(func(l hybrid.Limit, st hybrid.Status) bool {
					return l.Mode == hybrid.Local || !st.Degraded && (l.Mode != hybrid.Hybrid || st.LeasedRate > 0)
				})
		}
	case leave:
		// The leaving instance stopped deciding and released its leases
		// before it left the cluster (instance.close): the others drop it
		// from N at once, and split their default shares by the new N,
		// instead of counting it for PeakWindow as they would a crashed one.
		n := len(d.live())
		return func() (string, bool) {
			return fmt.Sprintf("every instance counts N = %d and splits its default shares by %d, %.2fs after the leaving one began to close", n, n, since()),
				every(func(l hybrid.Limit, st hybrid.Status) bool {
					return st.Instances == n && math.Abs(float64(st.LocalShare.Limit)-l.Rate/float64(n)) < 1e-9*l.Rate
				})
		}
	}
	return nil
}

// live returns the indexes of the instances still in the cluster.
func (d *demo) live() []int {
	var live []int
	for i, a := range d.active {
		if a {
			live = append(live, i)
		}
	}
	return live
}

// balance spreads the traffic evenly over the live instances.
func (d *demo) balance() {
	w := make([]float64, len(d.insts))
	for _, i := range d.live() {
		w[i] = 1
	}
	d.load.setWeights(w)
}

// result is what phase p measured between two snapshots.
func (d *demo) result(p phaseKind, from, to snapshot) phaseResult {
	r := phaseResult{
		kind:    p,
		secs:    to.at.Sub(from.at).Seconds(),
		n:       len(d.live()),
		limits:  make([]limitResult, len(d.opts.limits)),
		perInst: make([][]limitTotal, len(d.insts)),
		active:  append([]bool(nil), d.active...),
	}
	for i := range d.insts {
		r.perInst[i] = make([]limitTotal, len(d.opts.limits))
		for l := range d.opts.limits {
			t := diff(from.insts[i][l], to.insts[i][l])
			r.perInst[i][l] = t
			lr := &r.limits[l]
			lr.ok += t.ok
			lr.denied += t.denied
			lr.other += t.other
			lr.cmds += t.cmds
		}
	}
	for l := range d.opts.limits {
		r.limits[l].offered = to.sent[l] - from.sent[l]
	}
	return r
}

func diff(a, b limitSample) limitTotal {
	return limitTotal{
		ok:     b.ok - a.ok,
		denied: b.denied - a.denied,
		other:  b.other - a.other,
		cmds:   b.st.RedisCommands - a.st.RedisCommands,
	}
}

// shutdown stops everything the demo started, in order: load, instances
// (each leaving the cluster and releasing its leases), Redis.
func (d *demo) shutdown() {
	if d.load != nil {
		d.load.stop()
	}
	for i := len(d.insts) - 1; i >= 0; i-- {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = d.insts[i].close(ctx) // best effort: leases expire by themselves
		cancel()
	}
	if d.mr != nil {
		d.mr.Close()
	}
}
