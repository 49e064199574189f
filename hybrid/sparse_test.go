package hybrid

import (
	"math"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
	"golang.org/x/time/rate"
)

// The tables of this file are about sparse keys: a request every second or
// more on this instance, against a limit of 4/s burst 4 over eN instances
// (a default share of 1/s and a token).
const (
	sparseRate  = 4.0
	sparseBurst = 4
)

// sparseRun drives key "k" of r with a decision at each of decisions
// (offsets from t0, in order) and a tick every eTick from from up to and
// including until, and returns the requests of each tick that made any, by
// its offset. A decision at the instant of a tick comes before it.
func sparseRun(r *rig, from, until time.Duration, decisions []time.Duration) map[time.Duration][]call {
	out := make(map[time.Duration][]call)
	for at := from; at <= until; at += eTick {
		for len(decisions) > 0 && decisions[0] <= at {
			r.loc.Allow(t0.Add(decisions[0]), "k")
			decisions = decisions[1:]
		}
		if calls := tick().run(r, t0.Add(at)); len(calls) > 0 {
			out[at] = calls
		}
	}
	return out
}

// every returns the instants from from to to, step apart.
func every(from, to, step time.Duration) []time.Duration {
	var ds []time.Duration
	for at := from; at <= to; at += step {
		ds = append(ds, at)
	}
	return ds
}

// TestEngineSparseKeyYieldsItsLifeRate: a key in the share placement that
// sees a request every two seconds measures no decision in the second
// since its window last started anew (at a tick without one): asked to
// yield then, it keeps its rate over its life (a decision every 2 s, 0.5/s)
// with headroom, and its default token, not nothing. Yielding everything,
// its next request was denied, and it went round through a lease request
// and the exact placement, counted at its default share. Its next denial,
// of a request close after one, asks for nothing (sparseDenial): its bucket
// refills at what it kept, which its life rate fits. A clump of requests
// that its window shows (three or more) asks for a lease as before.
func TestEngineSparseKeyYieldsItsLifeRate(t *testing.T) {
	r := rigFor(t, sparseRate, sparseBurst, false)
	// Twenty-one decisions two seconds apart: tracked at 38 s (demandTokens),
	// measured once a second from then; at 42 s over the second since 41 s,
	// without a decision.
	if calls := sparseRun(r, 0, 42*time.Second, every(0, 40*time.Second, 2*time.Second)); len(calls) != 0 {
		t.Fatalf("requests %v; want none while the key is within its share", calls)
	}
	le := r.eng.keys["k"]
	if le == nil || le.state != stateDefault || !le.measured || le.measuredOn || le.demandNow != 0 {
		t.Fatalf("before the ask: %+v; want the share placement, measured at no decision on too few", le)
	}
	ask := 42*time.Second + eTick/2
	peerAsks().run(r, t0.Add(ask))
	// 21 decisions over its 42 s (fewer than its 20 gaps over 40 s show),
	// with headroom.
	kept := 21 / ask.Seconds() * headroom
	st, _ := r.loc.Stats("k")
	if le.state != stateYielded || math.Abs(le.granted-kept) > 1e-9 ||
		st.Share != (local.Share{Limit: rate.Limit(kept), Burst: 1}) {
		t.Fatalf("after the ask: state %v, kept %v, running %+v; want yielded to %v with its token", le.state, le.granted, st.Share, kept)
	}
	calls := sparseRun(r, ask+eTick/2, 42*time.Second+eTick, nil)
	if c := calls[42*time.Second+eTick]; len(c) != 1 || c[0].kind != callYield {
		t.Fatalf("requests %v; want the yield recorded", calls)
	}
	recorded().run(r, t0.Add(42*time.Second+eTick))

	// 43 s admitted from its token, 43.1 s denied: two decisions in its
	// window, 23 over 43.1 s, 0.51/s, within what it kept with headroom.
	calls = sparseRun(r, 42*time.Second+2*eTick, 43*time.Second+2*eTick, []time.Duration{43 * time.Second, 43*time.Second + 100*ms})
	if st, _ := r.loc.Stats("k"); st.Denied != 1 {
		t.Fatalf("%d denials; want the request at 43.1 s denied", st.Denied)
	}
	if len(calls) != 0 || le.state != stateYielded || le.wantsLease {
		t.Fatalf("requests %v, state %v, wants a lease %v after the denial; want none, yielded", calls, le.state, le.wantsLease)
	}

	// A clump: the window shows it, and the key asks.
	calls = sparseRun(r, 43*time.Second+3*eTick, 44*time.Second+3*eTick, every(44*time.Second, 44*time.Second+150*ms, eTick))
	asked := false
	for _, c := range calls {
		asked = asked || (len(c) == 1 && c[0].kind == callLease && c[0].req.Want > 0)
	}
	if !asked {
		t.Fatalf("requests %v; want a lease request for the clump", calls)
	}
}

// TestEngineSparseDenialInTheShare: a key in the share placement whose
// share denies a request close after another, after seconds of a request
// every three, asks for nothing: its window shows two decisions, its life
// 0.44/s, well within its share of 1/s, which its bucket refills at. A
// young key (under a second) asks at its first denial, as before.
func TestEngineSparseDenialInTheShare(t *testing.T) {
	for _, tc := range []struct {
		name      string
		decisions []time.Duration
		asks      bool
	}{
		{"sparse", []time.Duration{0, 3 * time.Second, 6 * time.Second, 9 * time.Second, 9*time.Second + 200*ms}, false},
		{"young", []time.Duration{0, 200 * ms}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rigFor(t, sparseRate, sparseBurst, false)
			last := tc.decisions[len(tc.decisions)-1]
			calls := sparseRun(r, 0, last, tc.decisions)
			if st, _ := r.loc.Stats("k"); st.Denied != 1 {
				t.Fatalf("%d denials; want the last request denied", st.Denied)
			}
			c := calls[last]
			if tc.asks != (len(c) == 1 && c[0].kind == callLease) || (!tc.asks && len(calls) != 0) {
				t.Fatalf("requests %v; want a lease request %v", calls, tc.asks)
			}
		})
	}
}

// TestEngineExactLightOverItsLife: an exact key (split bursts) at 0.67/s
// against a default share of 2.5/s (10/s over 4 instances, 2 tokens each)
// shows 5 or 6 tokens over its window of seconds, where 9 are expected at
// the threshold (exactLeaveBelow of the share, less headroom): never light
// beyond chance. It stayed exact for good, counted at its default share,
// while a peer that wanted 18/s ran what that left (0.80 of an exact
// bucket). Over its life it is light beyond chance within a minute, and it
// leaves.
func TestEngineExactLightOverItsLife(t *testing.T) {
	r := rigFor(t, 10, 10, false)
	le := exactByGrant(t, r, 4, 2.5) // 2 tokens of burst, too few
	for at := eTick; at <= time.Minute; at += eTick {
		if at%(1500*ms) == 0 {
			r.loc.Allow(t0.Add(at), "k")
		}
		tick().run(r, t0.Add(at))
		if le.state == stateExact {
			continue
		}
		if le.state != stateReleasing || at < 20*time.Second {
			t.Fatalf("at %v: state %v; want releasing, after its window alone could not show it light", at, le.state)
		}
		t.Logf("left at %v", at)
		return
	}
	t.Fatal("the light key stayed exact for a minute")
}

// TestEngineSparseDenialsInARowAsk: a denial that sparseDenial says nothing
// of is left unanswered ignoredDenials times in a row at most. The key of
// TestEngineSparseKeyYieldsItsLifeRate, yielded to its life rate after 40 s
// at 0.5/s, then sees a request every 700 ms (1.4/s, above its default
// share) while its peer keeps asking: its life rate passes what it kept
// only seconds later, and until then each denial passed sparseDenial, so it
// was denied all along without asking. It now asks at the denial after
// ignoredDenials of them.
func TestEngineSparseDenialsInARowAsk(t *testing.T) {
	r := rigFor(t, sparseRate, sparseBurst, false)
	sparseRun(r, 0, 42*time.Second, every(0, 40*time.Second, 2*time.Second))
	peerAsks().run(r, t0.Add(42*time.Second+eTick/2))
	if le := r.eng.keys["k"]; le == nil || le.state != stateYielded {
		t.Fatalf("after the ask: %+v; want yielded", le)
	}
	decisions := every(43*time.Second, time.Minute, 700*ms)
	st, _ := r.loc.Stats("k")
	before := st.Denied
	for at := 42*time.Second + eTick; at <= time.Minute; at += eTick {
		if at%time.Second == 0 {
			peerAsks().run(r, t0.Add(at))
		}
		for len(decisions) > 0 && decisions[0] <= at {
			r.loc.Allow(t0.Add(decisions[0]), "k")
			decisions = decisions[1:]
		}
		calls := tick().run(r, t0.Add(at))
		st, _ := r.loc.Stats("k")
		denials := st.Denied - before
		for _, c := range calls {
			switch c.kind {
			case callYield:
				recorded().run(r, t0.Add(at))
			case callLease:
				if denials != ignoredDenials+1 {
					t.Fatalf("at %v: a lease request after %d denials; want it at denial %d", at, denials, ignoredDenials+1)
				}
				return
			}
		}
		if denials > ignoredDenials+1 {
			t.Fatalf("at %v: %d denials and no lease request; want one at denial %d", at, denials, ignoredDenials+1)
		}
	}
	t.Fatal("no lease request")
}
