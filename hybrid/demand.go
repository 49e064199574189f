package hybrid

import "github.com/hybridlimit/hybridlimit/local"

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
// at each lease request.
type demandWindow struct {
	samples [demandSamples]sample // ring of (time, Attempted) at past requests
	next    uint8                 // next slot of samples to write
	cold    bool                  // samples[0] is the key's first decision, see rate
}

type sample struct {
	at        instant
	attempted int64
}

// open starts the window at the key's first decision, created: one request
// on a new key says nothing of its rate, so it is not counted as one per
// tick.
func (w *demandWindow) open(created instant) {
	w.samples[0] = sample{at: created}
	w.next, w.cold = 1, true
}

// record notes the key's Attempted counter at t.
func (w *demandWindow) record(t instant, attempted int64) {
	w.cold = w.cold && w.next != 0
	w.samples[w.next] = sample{at: t, attempted: attempted}
	w.next = (w.next + 1) % demandSamples
}

// falling returns the demand since the latest sample instead of r, the
// demand measured over the window, when it fell far below r: at r the
// latest interval should hold at least demandTokens tokens, and it holds
// under a quarter of what r predicts. A pulse that ended stops holding
// its share at the next renewal, while a sparse key's want is not thrown
// about by the gaps between its requests.
func (w *demandWindow) falling(now instant, st *local.KeyStats, r float64) float64 {
	last := w.samples[(w.next-1+demandSamples)%demandSamples]
	if last.at.IsZero() || !now.After(last.at) {
		return r
	}
	elapsed := now.Sub(last.at).Seconds()
	expected := r * elapsed
	got := float64(st.Attempted - last.attempted)
	if expected < demandTokens || got >= expected/4 {
		return r
	}
	return got / elapsed
}

// restart forgets the window and starts it anew at t, with the key's
// Attempted counter then.
func (w *demandWindow) restart(t instant, attempted int64) {
	clear(w.samples[:])
	w.samples[0] = sample{at: t, attempted: attempted}
	w.next, w.cold = 1, false
}

// lastAt is when the latest sample was recorded.
func (w *demandWindow) lastAt() instant {
	return w.samples[(w.next-1+demandSamples)%demandSamples].at
}

// rate is the key's recent demand in tokens per second at now: measured
// back to the latest recorded sample that leaves at least demandTokens
// tokens in the window, or to the oldest one. def is the key's default
// share, the most a key with one request so far is taken to want.
func (w *demandWindow) rate(now instant, st *local.KeyStats, def float64) float64 {
	var from sample
	var fromCold bool
	for i := 1; i <= demandSamples; i++ {
		slot := (int(w.next) - i + demandSamples) % demandSamples
		s := w.samples[slot]
		if s.at.IsZero() {
			break
		}
		from, fromCold = s, w.cold && slot == 0
		if st.Attempted-s.attempted >= demandTokens {
			break
		}
	}
	if from.at.IsZero() || !now.After(from.at) {
		return 0
	}
	if !fromCold {
		r := float64(st.Attempted-from.attempted) / now.Sub(from.at).Seconds()
		return w.falling(now, st, r)
	}
	// The window opens with the key's first request: count the gaps
	// between requests, not the requests, or a new key with a request every
	// second looks like one with a request per tick.
	since := now.Sub(from.at).Seconds() // the cold sample is at st.Created
	if st.Attempted <= 1 || !st.LastSeen.After(st.Created) {
		return min(def, 1/since)
	}
	gaps := float64(st.Attempted-1) / st.LastSeen.Sub(st.Created).Seconds()
	return min(gaps, float64(st.Attempted)/since)
}
