package main

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// dispatchEvery is how often the load generator issues the requests
	// that have come due.
	dispatchEvery = 5 * time.Millisecond
	// workersPerInstance is how many requests may be in flight to one
	// instance; each worker keeps its connection alive.
	workersPerInstance = 8
	// queuePerInstance is how many due requests may wait for a worker
	// before the generator counts them as skipped.
	queuePerInstance = 256
)

// loadGen is an open-loop load generator: it issues real HTTP requests at
// set rates whatever the answers, split over the instances by weight. The
// instances count what they answered; the generator counts the requests it
// could not send.
type loadGen struct {
	client *http.Client
	rates  []float64  // requests per second offered per limit, across all instances
	urls   [][]string // [instance][limit]
	queues []chan int // per instance: limit indexes of due requests

	mu      sync.Mutex
	weights []float64 // guarded by mu: share of the traffic per instance, summing to 1

	skipped atomic.Uint64 // due requests dropped because an instance's queue was full
	failed  atomic.Uint64 // requests that got no HTTP answer
	sent    []atomic.Uint64
	flight  []atomic.Int64 // per instance: requests queued or in flight

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startLoad starts generating rates[l] requests per second on the path of
// each limit, key "demo", split evenly over the instances at addrs.
func startLoad(addrs []string, paths []string, rates []float64) *loadGen {
	ctx, cancel := context.WithCancel(context.Background())
	g := &loadGen{
		client: &http.Client{
			Transport: &http.Transport{
				MaxIdleConnsPerHost: workersPerInstance,
				IdleConnTimeout:     30 * time.Second,
			},
			Timeout: 2 * time.Second,
		},
		rates:   rates,
		queues:  make([]chan int, len(addrs)),
		weights: make([]float64, len(addrs)),
		sent:    make([]atomic.Uint64, len(rates)),
		flight:  make([]atomic.Int64, len(addrs)),
		cancel:  cancel,
	}
	for i, a := range addrs {
		row := make([]string, len(paths))
		for l, p := range paths {
			row[l] = "http://" + a + "/" + p + "?key=demo"
		}
		g.urls = append(g.urls, row)
		g.weights[i] = 1 / float64(len(addrs))
		g.queues[i] = make(chan int, queuePerInstance)
		for range workersPerInstance {
			g.wg.Add(1)
			go g.work(ctx, i)
		}
	}
	g.wg.Add(1)
	go g.dispatch(ctx)
	return g
}

// setWeights sets each instance's share of the traffic; they are scaled to
// sum to 1.
func (g *loadGen) setWeights(w []float64) {
	var sum float64
	for _, x := range w {
		sum += x
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.weights {
		g.weights[i] = 0
		if sum > 0 {
			g.weights[i] = w[i] / sum
		}
	}
}

// drain waits, at most until ctx ends, for the requests queued for or in
// flight to instance i to finish. Call it after setting i's weight to 0.
func (g *loadGen) drain(ctx context.Context, i int) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for g.flight[i].Load() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// dispatch issues the requests that come due every dispatchEvery.
func (g *loadGen) dispatch(ctx context.Context) {
	defer g.wg.Done()
	t := time.NewTicker(dispatchEvery)
	defer t.Stop()
	// owed[i][l] is the fraction of a request instance i is owed on limit l.
	owed := make([][]float64, len(g.queues))
	for i := range owed {
		owed[i] = make([]float64, len(g.rates))
	}
	weights := make([]float64, len(g.queues))
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			dt := now.Sub(last).Seconds()
			last = now
			g.mu.Lock()
			copy(weights, g.weights)
			g.mu.Unlock()
			for i, q := range g.queues {
				for l, r := range g.rates {
					owed[i][l] += r * weights[i] * dt
					for ; owed[i][l] >= 1; owed[i][l]-- {
						g.flight[i].Add(1)
						select {
						case q <- l:
							g.sent[l].Add(1)
						default:
							g.flight[i].Add(-1)
							g.skipped.Add(1)
						}
					}
				}
			}
		}
	}
}

// work sends the requests queued for instance i, one at a time.
func (g *loadGen) work(ctx context.Context, i int) {
	defer g.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case l := <-g.queues[i]:
			g.send(ctx, g.urls[i][l])
			g.flight[i].Add(-1)
		}
	}
}

func (g *loadGen) send(ctx context.Context, url string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		g.failed.Add(1)
		return
	}
	resp, err := g.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			g.failed.Add(1)
		}
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body) // read to the end, so the connection is reused
	_ = resp.Body.Close()
}

// stop stops the generator and waits for its goroutines to return.
func (g *loadGen) stop() {
	g.cancel()
	g.wg.Wait()
	g.client.CloseIdleConnections()
}
