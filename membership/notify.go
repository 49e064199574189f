package membership

import (
	"slices"
	"sync"
)

// notifier delivers count changes, and Views, to watchers from a single
// goroutine.
//
// Producers call signal, which never blocks: the wake channel has room for
// one signal, so a burst of changes coalesces into one pass that reads the
// count once. A graceful leave is recorded with left, which queues the
// leaver's name for every view watcher, so none is lost to coalescing. A
// persistent notifier runs its goroutine from start until close
// (Memberlist, whose goroutine also refreshes the count); otherwise the
// goroutine runs only while there are watchers (Static, which has no Close).
type notifier struct {
	// refresh is called by the dispatch goroutine on every wake-up and
	// returns the count and the members to deliver.
	refresh func() (int, []string)
	// current returns the count cheaply; Watch uses it as the new watcher's
	// baseline, so that it is called only for later changes.
	current    func() int
	persistent bool
	wake       chan struct{} // capacity 1
	quit       chan struct{} // closed by close (persistent mode)
	done       chan struct{} // closed when the persistent goroutine exits

	mu       sync.Mutex
	watchers []*watcher // in registration order, the order they are called in
	running  bool       // a dispatch goroutine exists
	closed   bool
}

// watcher is one Watch or WatchView registration.
type watcher struct {
	fn   func(int)  // Watch's; nil for WatchView's
	view func(View) // WatchView's; nil for Watch's
	// left are the graceful leaves not yet given to view; guarded by the
	// notifier's mu, not by the watcher's.
	left []string

	mu          sync.Mutex // held while fn runs, so stop can wait for it
	stopped     bool
	last        int      // the count fn last saw (or the baseline at Watch)
	lastMembers []string // the members view last saw (or the baseline at WatchView)
}

func newNotifier(refresh func() (int, []string), current func() int, persistent bool) *notifier {
	return &notifier{
		refresh:    refresh,
		current:    current,
		persistent: persistent,
		wake:       make(chan struct{}, 1),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
	}
}

// signal asks the dispatch goroutine to look at the count again. It never
// blocks, so it is safe to call from memberlist's delegate callbacks.
func (nt *notifier) signal() {
	select {
	case nt.wake <- struct{}{}:
	default: // a wake-up is already pending; it will read the latest count.
	}
}

// start runs the goroutine of a persistent notifier.
func (nt *notifier) start() {
	nt.mu.Lock()
	nt.running = true
	nt.mu.Unlock()
	go func() {
		defer close(nt.done)
		nt.run()
	}()
}

// close stops a persistent notifier's goroutine and waits for it to exit.
// Later watchers are registered but never called.
func (nt *notifier) close() {
	nt.mu.Lock()
	if nt.closed {
		nt.mu.Unlock()
		return
	}
	nt.closed = true
	wasRunning := nt.running
	nt.mu.Unlock()
	close(nt.quit)
	if wasRunning {
		<-nt.done
	}
}

// left records that the member named name left gracefully, for every view
// watcher registered now, and wakes the dispatch goroutine. It never
// blocks for long (the lock is never held while a watcher runs), so it is
// safe to call from memberlist's delegate callbacks. The caller must have
// removed the member from what refresh reads before calling left: the
// next pass then reads the members after the leave.
func (nt *notifier) left(name string) {
	nt.mu.Lock()
	for _, w := range nt.watchers {
		if w.view != nil {
			w.left = append(w.left, name)
		}
	}
	nt.mu.Unlock()
	nt.signal()
}

func (nt *notifier) watch(fn func(n int)) (stop func()) {
	return nt.add(&watcher{fn: fn, last: nt.current()})
}

// watchView registers fn for Views; baseline is the members fn is taken to
// have seen, so that it is called only for later changes.
func (nt *notifier) watchView(fn func(View), baseline []string) (stop func()) {
	return nt.add(&watcher{view: fn, last: nt.current(), lastMembers: baseline})
}

func (nt *notifier) add(w *watcher) (stop func()) {
	nt.mu.Lock()
	nt.watchers = append(nt.watchers, w)
	if !nt.persistent && !nt.running {
		nt.running = true
		go nt.run()
	}
	nt.mu.Unlock()

	var once sync.Once
	return func() {
		once.Do(func() {
			nt.mu.Lock()
			nt.watchers = slices.DeleteFunc(nt.watchers, func(x *watcher) bool { return x == w })
			nt.mu.Unlock()
			// Wait for a running fn to return, then make sure it is not
			// called again even if the dispatcher already holds w.
			w.mu.Lock()
			w.stopped = true
			w.mu.Unlock()
			// Let a non-persistent dispatcher notice it has no watchers left.
			nt.signal()
		})
	}
}

// run is the dispatch loop.
func (nt *notifier) run() {
	for {
		select {
		case <-nt.wake:
		case <-nt.quit:
			return
		}
		// The graceful leaves are taken before the members are read, so
		// that a View's Members never hold a leaver its Left lacks (unless
		// the leaver came back); a leave recorded after this is in the
		// next pass.
		nt.mu.Lock()
		ws := slices.Clone(nt.watchers)
		left := make([][]string, len(ws))
		for i, w := range ws {
			left[i], w.left = w.left, nil
		}
		nt.mu.Unlock()
		n, members := nt.refresh()

		for i, w := range ws {
			w.mu.Lock()
			switch {
			case w.stopped:
			case w.view != nil:
				if w.last != n || len(left[i]) > 0 || !slices.Equal(w.lastMembers, members) {
					w.last, w.lastMembers = n, members
					w.view(View{Count: n, Members: slices.Clone(members), Left: left[i]})
				}
			case w.last != n:
				w.last = n
				w.fn(n)
			}
			w.mu.Unlock()
		}

		if !nt.persistent {
			nt.mu.Lock()
			if len(nt.watchers) == 0 {
				nt.running = false
				nt.mu.Unlock()
				return
			}
			nt.mu.Unlock()
		}
	}
}
