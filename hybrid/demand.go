package hybrid

import (
	"math"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
)

// A key's demand is measured over the most recent window that holds at
// least demandTokens tokens (or all its recorded history, demandSamples
// requests back): a busy key follows shifts within a renewal or two, while a
// key that sees a request or two per renewal is averaged over seconds, so
// that its want is not mostly noise.
const (
	demandTokens  = 20
	demandSamples = 8
)

// demandWindow measures one key's demand from its Attempted counter, sampled
// at each lease request. A sample is a time and the counter's low 32 bits,
// in two arrays, 12 bytes a sample where a struct of both would take 16
// (a window per key): the tokens between two samples are the difference of
// the low bits modulo 2^32 (see since), exact below 2^32 tokens, which no
// key asks for between two samples.
type demandWindow struct {
	at        [demandSamples]instant // ring of the times of past samples; zero: unused
	attempted [demandSamples]uint32  // ... and of the Attempted counters then, modulo 2^32
	next      uint8                  // next slot to write
	cold      bool                   // slot 0 is the key's first decision, see rate
}

// since returns the tokens asked for between the sample in slot i and a
// time when the key's Attempted counter was attempted.
func (w *demandWindow) since(i int, attempted int64) int64 {
	return int64(uint32(attempted) - w.attempted[i])
}

// last is the slot of the latest sample.
func (w *demandWindow) last() int { return (int(w.next) - 1 + demandSamples) % demandSamples }

// open starts the window at the key's first decision, created: one request
// on a new key says nothing of its rate, so it is not counted as one per
// tick.
func (w *demandWindow) open(created instant) {
	w.at[0], w.attempted[0] = created, 0
	w.next, w.cold = 1, true
}

// record notes the key's Attempted counter at t.
func (w *demandWindow) record(t instant, attempted int64) {
	w.cold = w.cold && w.next != 0
	w.at[w.next], w.attempted[w.next] = t, uint32(attempted)
	w.next = (w.next + 1) % demandSamples
}

// falling returns the demand since the latest sample instead of r, the
// demand measured over the window, when it fell far below r: at r the
// latest interval should hold at least demandTokens tokens, and it holds
// under a quarter of what r predicts. A pulse that ended stops holding
// its share at the next renewal, while a sparse key's want is not thrown
// about by the gaps between its requests.
func (w *demandWindow) falling(now instant, st *local.KeyStats, r float64) float64 {
	last := w.last()
	if w.at[last].IsZero() || !now.After(w.at[last]) {
		return r
	}
	elapsed := now.Sub(w.at[last]).Seconds()
	expected := r * elapsed
	got := float64(w.since(last, st.Attempted))
	if expected < demandTokens || got >= expected/4 {
		return r
	}
	return got / elapsed
}

// from is the slot rate measures from: the latest recorded sample that
// leaves at least demandTokens tokens in the window, or the oldest; -1 if
// there is none.
func (w *demandWindow) from(st *local.KeyStats) int {
	from := -1
	for i := 1; i <= demandSamples; i++ {
		slot := (int(w.next) - i + demandSamples) % demandSamples
		if w.at[slot].IsZero() {
			break
		}
		from = slot
		if w.since(slot, st.Attempted) >= demandTokens {
			break
		}
	}
	return from
}

// surelyBelow reports whether tokens asked for over span show a demand
// below perSec beyond chance: fewer than a Poisson count at perSec would
// fall to but once in forty (two standard deviations below its mean). A
// key whose requests are few per second needs seconds to show it; one
// that sees a request or two over the window never does, however they
// fall.
func surelyBelow(tokens int64, span time.Duration, perSec float64) bool {
	m := perSec * span.Seconds()
	return float64(tokens) < m-2*math.Sqrt(m)
}

// surelyAbove reports whether tokens asked for over span show a demand
// above perSec beyond chance, as surelyBelow.
func surelyAbove(tokens int64, span time.Duration, perSec float64) bool {
	m := perSec * span.Seconds()
	return float64(tokens) > m+2*math.Sqrt(m)
}

// restart forgets the window and starts it anew at t, with the key's
// Attempted counter then.
func (w *demandWindow) restart(t instant, attempted int64) {
	clear(w.at[:])
	clear(w.attempted[:])
	w.at[0], w.attempted[0] = t, uint32(attempted)
	w.next, w.cold = 1, false
}

// opened returns when the window opened or restarted, its oldest sample
// (slot 0) while nothing was recorded since.
func (w *demandWindow) opened() instant { return w.at[0] }

// lastAt is when the latest sample was recorded.
func (w *demandWindow) lastAt() instant {
	return w.at[w.last()]
}

// rate is the key's recent demand in tokens per second at now: measured
// back to the latest recorded sample that leaves at least demandTokens
// tokens in the window, or to the oldest one. def is the key's default
// share, the most a key with one request so far is taken to want.
func (w *demandWindow) rate(now instant, st *local.KeyStats, def float64) float64 {
	d, _, _ := w.measured(now, st, def)
	return d
}

// measured is rate, with what it measured over: the tokens asked for since
// the sample it measures from, and the time since that sample (none when
// it measured nothing).
func (w *demandWindow) measured(now instant, st *local.KeyStats, def float64) (d float64, tokens int64, span time.Duration) {
	from := w.from(st)
	if from < 0 || !now.After(w.at[from]) {
		return 0, 0, 0
	}
	tokens, span = w.since(from, st.Attempted), now.Sub(w.at[from])
	if !w.cold || from != 0 {
		return w.falling(now, st, float64(tokens)/span.Seconds()), tokens, span
	}
	// The window opens with the key's first request: count the gaps
	// between requests, not the requests, or a new key with a request every
	// second looks like one with a request per tick.
	since := span.Seconds() // the cold sample is at st.Created
	if st.Attempted <= 1 || !st.LastSeen.After(st.Created) {
		return min(def, 1/since), tokens, span
	}
	gaps := float64(st.Attempted-1) / st.LastSeen.Sub(st.Created).Seconds()
	return min(gaps, float64(st.Attempted)/since), tokens, span
}
