package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/gossiptest"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// partitionNode joins a Local-profile membership node on a transport of nw
// in group, joining through seeds. The Limiter it is given to closes it.
func partitionNode(t *testing.T, nw *gossiptest.Network, name, group string, seeds ...string) *membership.Memberlist {
	t.Helper()
	tr, err := nw.Transport(group)
	if err != nil {
		t.Fatal(err)
	}
	m, err := membership.Join(membership.Config{Name: name, Transport: tr, Seeds: seeds, Profile: membership.Local})
	if err != nil {
		t.Fatalf("Join(%s): %v", name, err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// instanceRun is what one instance decided during the measured window.
type instanceRun struct {
	arrivals map[string][]time.Duration // per key, offsets from the start
	admitted map[string]int
	notLocal int // decisions from another source than the local quota
	errs     int
}

// driveEach offers each instance perInstance decisions per second, spread
// round-robin over keys, open loop, for d, and records each instance's
// decisions apart.
func driveEach(inst []*hybrid.Limiter, limit string, keys []string, perInstance float64, d time.Duration) ([]instanceRun, time.Duration) {
	runs := make([]instanceRun, len(inst))
	done := make(chan struct{})
	start := time.Now()
	end := start.Add(d)
	interval := time.Duration(float64(time.Second) / perInstance)
	for i, l := range inst {
		go func() {
			defer func() { done <- struct{}{} }()
			r := instanceRun{arrivals: map[string][]time.Duration{}, admitted: map[string]int{}}
			next := start.Add(time.Duration(i) * interval / time.Duration(len(inst)))
			k := i
			for next.Before(end) {
				if wait := time.Until(next); wait > 0 {
					// Paces the open loop: this sleep schedules arrivals,
					// it waits for nothing.
					time.Sleep(min(wait, time.Millisecond))
					continue
				}
				next = next.Add(interval)
				key := keys[k%len(keys)]
				k++
				at := time.Since(start)
				dec, err := l.Allow(context.Background(), limit, key)
				switch {
				case err != nil:
					r.errs++
					continue
				case dec.Source != hybrid.SourceLocal:
					r.notLocal++
				}
				r.arrivals[key] = append(r.arrivals[key], at)
				if dec.Allowed {
					r.admitted[key]++
				}
			}
			runs[i] = r
		}()
	}
	for range inst {
		<-done
	}
	return runs, time.Since(start)
}

// TestPartitionFailLocalUsesLargestRecentN is invariant 5 under a real
// partition: four instances, each with its own memberlist node, lose Redis
// and are split 2|2. Each side then counts 2 instances, yet with FailLocal
// every instance keeps running at rate/4, 4 being the largest count seen
// within PeakWindow (1 minute by default), so that across both sides the
// cluster admits no more than the limit. Had the instances used the count
// they see, each would admit rate/2 and the cluster twice the limit.
func TestPartitionFailLocalUsesLargestRecentN(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const (
		limitRate  = 400.0
		limitBurst = 40
		limit      = "api"
		window     = 2 * time.Second
		// Each instance is offered 4 times the limit over 4 keys: every
		// key gets its whole rate on every instance, 4 times a rate/4
		// share and twice a rate/2 one.
		perInstance = 4 * limitRate
	)
	quarter := shareOf(limitRate/4, limitBurst/4)
	nw := gossiptest.NewNetwork(nil)
	t.Cleanup(nw.Shutdown) // after the Limiters, which close their nodes
	srv := redistest.Start(t)

	// Each node joins through all the earlier ones, so that every node
	// learns of every other at once rather than at a push/pull.
	names := []string{"left-0", "left-1", "right-0", "right-1"}
	groups := []string{"left", "left", "right", "right"}
	var seeds []string
	inst := make([]*hybrid.Limiter, len(names))
	for i, name := range names {
		m := partitionNode(t, nw, name, groups[i], seeds...)
		seeds = append(seeds, m.Addr())
		inst[i] = newLimiter(t, hybrid.Config{
			Redis:   fastClient(t, srv),
			Members: m,
			Limits:  []hybrid.Limit{{Name: limit, Rate: limitRate, Burst: limitBurst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}},
			// Short leases: a limit degrades about UncontendedTTL/2 after
			// Redis stops answering, and every lease has run out by the
			// time the partition is detected.
			UncontendedTTL: time.Second,
		})
	}
	// allow makes key worth a lease (warmKey): its first decisions are
	// exact, in Redis, and the next tick asks for a lease; before the
	// outage it gets one, during it the decisions fail until the limit
	// degrades, and then follow FailLocal.
	allow := func(l *hybrid.Limiter, key string) {
		t.Helper()
		warmKey(t, l, limit, key, limitBurst)
	}
	// key-0000 and key-0001 hold leases before the outage; key-0002 and
	// key-0003 are first seen during it.
	ks := keys(4)
	eventually(t, 20*time.Second, "every instance counts 4 and holds leases", func() bool {
		ok := true
		for _, l := range inst {
			allow(l, ks[0])
			allow(l, ks[1])
			st := mustStatus(t, l, limit)
			ok = ok && st.Instances == 4 && st.LeasedRate > 0 && !st.Degraded
		}
		return ok
	})

	srv.Kill(t)
	split := time.Now()
	nw.Split("left", "right")
	// A suspect is declared dead after 3 s to 18 s (the fewer nodes
	// confirm the suspicion, the longer), and nodes whose probes fail slow
	// their probing down: this takes 7 s to 21 s (more under -race on a
	// busy machine). The limits degrade within a second of the kill, once
	// the loop finds Redis gone (the probe key's failed decisions, the
	// renewals unanswered).
	eventually(t, 60*time.Second, "each side counts 2 and every limit is degraded", func() bool {
		ok := true
		for _, l := range inst {
			allow(l, "probe")
			st := mustStatus(t, l, limit)
			ok = ok && st.Instances == 2 && st.Degraded
		}
		return ok
	})
	packets, dials := nw.Dropped()
	t.Logf("partition detected and every limit degraded %v after the split (%d packets dropped, %d dials refused)",
		time.Since(split).Round(time.Millisecond), packets, dials)
	for i, l := range inst {
		if st := mustStatus(t, l, limit); st.LocalShare != quarter {
			t.Fatalf("%s: degraded, seeing 2 instances after 4: LocalShare %+v, want rate/4 %+v", names[i], st.LocalShare, quarter)
		}
	}

	runs, elapsed := driveEach(inst, limit, ks, perInstance, window)

	bound := limitRate*elapsed.Seconds() + limitBurst
	slack := 0.01*bound + float64(len(inst)) // rounding, one token per instance
	for _, key := range ks {
		admitted, offered, atHalf, atQuarter := 0, 0, 0, 0
		for i, r := range runs {
			arr := r.arrivals[key]
			got := r.admitted[key]
			admitted += got
			offered += len(arr)
			// What one instance's bucket admits on these arrivals at
			// rate/4 (it starts full: the key was idle or new), and what
			// it would at rate/2.
			want := exact(limitRate/4, limitBurst/4, arr, 0)
			atQuarter += want
			atHalf += exact(limitRate/2, limitBurst/2, arr, 0)
			if lo, hi := float64(want)*0.98-2, float64(want)*1.02+2; float64(got) < lo || float64(got) > hi {
				t.Errorf("%s, %s: admitted %d of %d, want about %d, what rate/4 admits on those arrivals", names[i], key, got, len(arr), want)
			}
		}
		t.Logf("%s: admitted %d of %d across both sides in %v, bound rate·w + burst = %.0f; rate/4 per instance admits %d on these arrivals, rate/2 would %d",
			key, admitted, offered, elapsed.Round(time.Millisecond), bound, atQuarter, atHalf)
		if float64(admitted) > bound+slack {
			t.Errorf("%s: admitted %d across both sides of the partition in %v, above rate·w + burst = %.0f (+%.0f slack)",
				key, admitted, elapsed.Round(time.Millisecond), bound, slack)
		}
		// The arrivals must be dense enough that rate/2 per instance would
		// break the bound, or the test could not tell the two apart.
		if float64(atHalf) <= bound+slack {
			t.Errorf("%s: on these arrivals rate/2 per instance would admit only %d, within the bound %.0f: too few arrivals (%d) to tell rate/4 from rate/2",
				key, atHalf, bound+slack, offered)
		}
	}
	for i, r := range runs {
		if r.errs > 0 || r.notLocal > 0 {
			t.Errorf("%s: %d errors and %d decisions not from the local quota during the outage, want none", names[i], r.errs, r.notLocal)
		}
		st := mustStatus(t, inst[i], limit)
		if st.Instances != 2 || !st.Degraded || st.LocalShare != quarter {
			t.Errorf("%s after the window: Instances %d, Degraded %v, LocalShare %+v; want 2, true, %+v", names[i], st.Instances, st.Degraded, st.LocalShare, quarter)
		}
	}
}
