package membership

import (
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// recorder collects the counts a watcher is called with.
type recorder struct {
	mu  sync.Mutex
	got []int
}

func (r *recorder) fn(n int) {
	r.mu.Lock()
	r.got = append(r.got, n)
	r.mu.Unlock()
}

func (r *recorder) values() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// verifyNoLeaks fails the test if a goroutine started since the test binary
// began is still running. It is registered first with t.Cleanup, so it runs
// after every node of the test is closed. Close joins this package's own
// goroutines, but memberlist's Shutdown does not wait for a failure-detection
// probe already in flight (probeNode waits for its ack timeout, at most a
// probe interval), so the check polls with a deadline instead of failing on
// the first look or ignoring memberlist's goroutines altogether.
func verifyNoLeaks(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for goleak.Find() != nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := goleak.Find(); err != nil {
		t.Error(err)
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStaticCount(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	tests := []struct {
		name string
		n    int
		want int
	}{
		{"one", 1, 1},
		{"three", 3, 3},
		{"zero is one", 0, 1},
		{"negative is one", -5, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStatic("a", tt.n)
			if got := s.Count(); got != tt.want {
				t.Errorf("NewStatic(%d).Count() = %d, want %d", tt.n, got, tt.want)
			}
			s.Set(tt.n)
			if got := s.Count(); got != tt.want {
				t.Errorf("Set(%d); Count() = %d, want %d", tt.n, got, tt.want)
			}
		})
	}
}

func TestStaticName(t *testing.T) {
	if got := NewStatic("api-1", 1).Name(); got != "api-1" {
		t.Errorf("Name() = %q, want %q", got, "api-1")
	}
	a, b := NewStatic("", 1).Name(), NewStatic("", 1).Name()
	if a == "" || a == b {
		t.Errorf("random names %q and %q: want distinct and non-empty", a, b)
	}
}

func TestStaticWatch(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := NewStatic("a", 1)
	var r1, r2 recorder
	stop1 := s.Watch(r1.fn)
	stop2 := s.Watch(r2.fn)

	// Each Set waits for delivery so that no change is coalesced away.
	for _, n := range []int{2, 3, 0, 4} {
		s.Set(n)
		want := max(n, 1)
		eventually(t, 5*time.Second, "watchers see the change", func() bool {
			v1, v2 := r1.values(), r2.values()
			return len(v1) > 0 && v1[len(v1)-1] == want && len(v2) > 0 && v2[len(v2)-1] == want
		})
	}
	want := []int{2, 3, 1, 4}
	if got := r1.values(); !slices.Equal(got, want) {
		t.Errorf("watcher 1 saw %v, want %v", got, want)
	}

	// Setting the same count is not a change.
	s.Set(4)
	stop2()
	stop2() // idempotent
	s.Set(5)
	eventually(t, 5*time.Second, "watcher 1 sees 5", func() bool {
		v := r1.values()
		return v[len(v)-1] == 5
	})
	if got, want := r2.values(), []int{2, 3, 1, 4}; !slices.Equal(got, want) {
		t.Errorf("stopped watcher 2 saw %v, want %v", got, want)
	}
	if got, want := r1.values(), []int{2, 3, 1, 4, 5}; !slices.Equal(got, want) {
		t.Errorf("watcher 1 saw %v, want %v", got, want)
	}
	stop1()
}

// TestStaticWatchStopWaits checks that stop returns only after a running fn
// has returned, and that fn is not called after stop.
func TestStaticWatchStopWaits(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := NewStatic("a", 1)
	entered := make(chan struct{})
	release := make(chan struct{})
	var mu sync.Mutex
	running, calls := false, 0
	stop := s.Watch(func(n int) {
		mu.Lock()
		running, calls = true, calls+1
		mu.Unlock()
		if n == 2 {
			close(entered)
			<-release
		}
		mu.Lock()
		running = false
		mu.Unlock()
	})
	s.Set(2)
	<-entered
	stopped := make(chan struct{})
	go func() {
		stop()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("stop returned while fn was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-stopped
	mu.Lock()
	if running {
		t.Error("fn still running after stop returned")
	}
	mu.Unlock()
	s.Set(3)
	s.Set(4)
	// No watcher is left, so the dispatch goroutine exits; goleak checks it.
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Errorf("fn called %d times, want 1", calls)
	}
}

func TestStaticWatchAfterAllStopped(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := NewStatic("a", 1)
	s.Watch(func(int) {})()
	s.Set(2) // no watcher: no goroutine, the wake-up stays pending
	var r recorder
	stop := s.Watch(r.fn)
	defer stop()
	s.Set(3)
	eventually(t, 5*time.Second, "new watcher sees 3", func() bool {
		v := r.values()
		return len(v) > 0 && v[len(v)-1] == 3
	})
	if got := r.values(); !slices.Equal(got, []int{3}) {
		t.Errorf("watcher registered at 2 saw %v, want [3]", got)
	}
}
