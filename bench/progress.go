package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress shows what the bench is running: "[3/24] skewed / hybrid  4.1s",
// the time being the whole bench's. On a terminal it is one line redrawn
// every quarter second; elsewhere one line per run.
type progress struct {
	w     io.Writer
	start time.Time
	total int
	tty   bool
	stop  chan struct{}
	wg    sync.WaitGroup

	mu    sync.Mutex // guards the fields below
	n     int
	label string
	width int // of the last line drawn on a terminal
}

func newProgress(w io.Writer, start time.Time, total int) *progress {
	p := &progress{w: w, start: start, total: total, stop: make(chan struct{})}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	if p.tty {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			t := time.NewTicker(250 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-p.stop:
					return
				case <-t.C:
					p.draw()
				}
			}
		}()
	}
	return p
}

// next starts the next run.
func (p *progress) next(label string) {
	p.mu.Lock()
	p.n++
	p.label = label
	p.mu.Unlock()
	p.draw()
}

func (p *progress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 {
		return
	}
	line := fmt.Sprintf("[%d/%d] %s  %.1fs", p.n, p.total, p.label, time.Since(p.start).Seconds())
	if !p.tty {
		fmt.Fprintln(p.w, line)
		return
	}
	pad := max(p.width-len(line), 0)
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%*s", line, pad, "")
}

// done ends the progress line.
func (p *progress) done() {
	close(p.stop)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.n > 0 {
		fmt.Fprintf(p.w, "\r%*s\r", p.width, "")
	} else if p.n > 0 {
		fmt.Fprintf(p.w, "done in %.1fs\n", time.Since(p.start).Seconds())
	}
}
