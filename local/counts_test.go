package local

import (
	"sync"
	"testing"
	"time"
)

// TestCounts: every decision is counted once, by outcome, under the share
// Tally says, at fixed instants; marked keys and n below 1 are not counted.
func TestCounts(t *testing.T) {
	// The default share is 10/s burst 1; assign gives a key 10/s burst 2
	// until 1s, keeping the token it holds (a fresh key holds 1).
	type step struct {
		at    time.Duration
		do    string // "allow", "assign" (AssignNew) or "mark"
		key   string
		n     int
		tally Tally
	}
	allow := func(at time.Duration, key string, n int, tally Tally) step {
		return step{at: at, do: "allow", key: key, n: n, tally: tally}
	}
	tests := []struct {
		name  string
		steps []step
		want  Counts
	}{
		{"default share", []step{
			allow(0, "a", 1, TallyShare),
			allow(0, "a", 1, TallyShare),
			allow(100*time.Millisecond, "a", 1, TallyShare),
			allow(100*time.Millisecond, "b", 1, TallyShare),
		}, Counts{DefaultAllowed: 3, DefaultDenied: 1}},
		{"assigned share", []step{
			{do: "assign", key: "a"},
			allow(0, "a", 1, TallyShare),
			allow(0, "a", 1, TallyShare),
			allow(0, "b", 1, TallyShare),
		}, Counts{AssignedAllowed: 1, AssignedDenied: 1, DefaultAllowed: 1}},
		{"a lapsed share counts as default", []step{
			{do: "assign", key: "a"},
			allow(2*time.Second, "a", 1, TallyShare),
		}, Counts{DefaultAllowed: 1}},
		{"TallyDefault", []step{
			{do: "assign", key: "a"},
			allow(0, "a", 1, TallyDefault),
			allow(0, "a", 2, TallyDefault),
			allow(0, "b", 1, TallyDefault),
		}, Counts{DefaultAllowed: 2, DefaultDenied: 1}},
		{"TallyAssigned", []step{
			{do: "assign", key: "a"},
			allow(0, "a", 1, TallyAssigned),
			allow(0, "a", 2, TallyAssigned),
			allow(0, "b", 1, TallyAssigned),
			allow(0, "b", 1, TallyAssigned),
		}, Counts{AssignedAllowed: 1, AssignedDenied: 1}},
		{"not counted", []step{
			allow(0, "a", 0, TallyShare),
			{do: "assign", key: "b"},
			{do: "mark", key: "b"},
			allow(0, "b", 1, TallyShare),
		}, Counts{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, Config{Limit: 10, Burst: 1})
			for i, s := range tt.steps {
				at := t0.Add(s.at)
				switch s.do {
				case "allow":
					var r Result
					l.AllowNTallyInto(at, s.key, s.n, s.tally, &r)
				case "assign":
					l.AssignNew(at, s.key, Share{Limit: 10, Burst: 2}, t0.Add(time.Second))
				case "mark":
					if !l.SetMark(s.key, 1) {
						t.Fatalf("step %d: mark %s: no such key", i, s.key)
					}
				}
			}
			if got := l.Counts(); got != tt.want {
				t.Errorf("counts %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestCountsConcurrent: decisions from many goroutines over many keys are
// each counted exactly once, and Counts called meanwhile never goes down.
func TestCountsConcurrent(t *testing.T) {
	l := mustNew(t, Config{Limit: 1000, Burst: 10, Shards: 4})
	const workers, each = 8, 2000
	var wg sync.WaitGroup
	allowed := make([]int, workers)
	for w := range workers {
		wg.Go(func() {
			var r Result
			for i := range each {
				l.AllowNTallyInto(t0, string(rune('a'+i%50)), 1, TallyShare, &r)
				if r.Allowed {
					allowed[w]++
				}
			}
		})
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var last uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			c := l.Counts()
			sum := c.DefaultAllowed + c.DefaultDenied
			if sum < last {
				t.Errorf("counts went down from %d to %d", last, sum)
				return
			}
			last = sum
		}
	}()
	wg.Wait()
	close(stop)
	<-done
	total := 0
	for _, a := range allowed {
		total += a
	}
	want := Counts{DefaultAllowed: uint64(total), DefaultDenied: uint64(workers*each - total)}
	if got := l.Counts(); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
}
