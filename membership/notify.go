package membership

import (
	"slices"
	"sync"
)

// notifier delivers count changes to watchers from a single goroutine.
//
// Producers call wake, which never blocks: the wake channel has room for one
// signal, so a burst of changes coalesces into one pass that reads the count
// once. A persistent notifier runs its goroutine from start until close
// (Memberlist, whose goroutine also refreshes the count); otherwise the
// goroutine runs only while there are watchers (Static, which has no Close).
type notifier struct {
	// refresh is called by the dispatch goroutine on every wake-up and
	// returns the count to deliver.
	refresh func() int
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

// watcher is one Watch registration.
type watcher struct {
	fn func(int)

	mu      sync.Mutex // held while fn runs, so stop can wait for it
	stopped bool
	last    int // the count fn last saw (or the baseline at Watch)
}

func newNotifier(refresh, current func() int, persistent bool) *notifier {
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

func (nt *notifier) watch(fn func(n int)) (stop func()) {
	w := &watcher{fn: fn, last: nt.current()}
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
		n := nt.refresh()

		nt.mu.Lock()
		ws := slices.Clone(nt.watchers)
		nt.mu.Unlock()

		for _, w := range ws {
			w.mu.Lock()
			if !w.stopped && w.last != n {
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
