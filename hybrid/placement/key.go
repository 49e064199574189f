package placement

import (
	"math"
	"time"
)

// key is the state of one key that left its first exact placement. It is
// held, in the policy's table beside the key's name, for every such key,
// so the two are kept to 88 bytes, the key to 72 (TestKeySize guards it),
// where plain fields would take 144:
//   - the demands and the grant, which are averaged or sent back to Redis
//     (Running), are float64; what is only compared with thresholds (the
//     fair share, the want, the demand of the key's instances) is
//     float32, a relative error of 6e-8 against margins of 10% or more;
//   - the tokens asked for are kept modulo 2^32, and the look before the
//     last as differences from the last (see asked, asked0 and gap0);
//   - the schedule (grant's end, renewal, last ask) is kept to the
//     millisecond (see clock), the ends of grants rounded up, so that a
//     renewal never tells Redis a grant ends before it ends here;
//   - the lease's lifetime is a step (see ttlStep), the flags are bits.
type key struct {
	// demand is the key's measured demand here, tokens per second: an
	// average of its rates between looks, weighted over ContendedTTL,
	// that drops at once when the traffic does (see observe).
	demand  float64
	now     float64 // demand now, what its wants ask for: an average like demand that a fall resets
	granted float64 // the grant in force (Leased)
	seenAt  instant // when demand was last updated
	fair    float32 // this instance's fair share in the last answer; 0 before one
	want    float32 // of the last ask
	total   float32 // the demand of the key's instances in the last answer (Grant.Demand)
	// asked is Stats.Asked when demand was last updated, modulo 2^32: the
	// tokens asked for between two looks, its difference with the next,
	// are right up to 2^32-1 (4 billion tokens in a tick).
	asked uint32
	// asked0 and gap0 are the tokens asked for and the time, in ns,
	// between the update before the last and the last, which the rise
	// and fall are judged over. A gap0 of 0 says there is no update
	// before, as does one of over 4.29 s (the loop looks every tick).
	asked0  uint32
	gap0    uint32
	until   clock // when the grant ends here (Leased), or the record the last answered ask left ends (at the earliest), rounded up; at a release, then
	renewAt clock // Leased: when the next renewal is due; Exact: not before then may it ask
	sentAt  clock // when the last ask went out
	state   State
	gen     uint8   // of the state: an exact key's mark, an ask's or a lease's generation
	ttl     ttlStep // the lifetime of its next ask
	flags   uint8   // contendedBit, fellBit, and the stable count (see stable)
}

const (
	contendedBit = 1 << iota // the grant in force is contended
	fellBit                  // the last look found the traffic fallen below the demand now
	stableShift              // the stable count takes the bits from here up
)

// maxStable is the largest stable count a key holds: it only grows to
// SettleAfter-1, what nextTTL compares it with, and stays there.
const maxStable = math.MaxUint8 >> stableShift

func (k *key) contended() bool { return k.flags&contendedBit != 0 }
func (k *key) fell() bool      { return k.flags&fellBit != 0 }

// stable is the number of renewals in a row that moved the grant by at
// most SettledWithin, and the demand by at most DemandWithin, up to
// maxStable.
func (k *key) stable() uint8 { return k.flags >> stableShift }

func (k *key) setContended(on bool) { k.flags = setBit(k.flags, contendedBit, on) }
func (k *key) setFell(on bool)      { k.flags = setBit(k.flags, fellBit, on) }

func (k *key) setStable(n uint8) {
	k.flags = k.flags&(1<<stableShift-1) | min(n, maxStable)<<stableShift
}

func setBit(f, bit uint8, on bool) uint8 {
	if on {
		return f | bit
	}
	return f &^ bit
}

// A clock is an instant to the millisecond, modulo 2^32 ms (49 days): 4
// bytes where an instant takes 8. It is read back next to the time it is
// compared with (at), which must be within 24 days of it; track keeps a
// key's clocks that recent (ageClocks).
type clock uint32

// floorMs is a in whole milliseconds, rounded down.
func floorMs(a instant) int64 {
	ms := int64(a) / int64(time.Millisecond)
	if int64(a)%int64(time.Millisecond) < 0 {
		ms--
	}
	return ms
}

// floorClock is a rounded down to the millisecond.
func floorClock(a instant) clock { return clock(floorMs(a)) }

// ceilClock is a rounded up to the millisecond.
func ceilClock(a instant) clock {
	ms := floorMs(a)
	if ms*int64(time.Millisecond) != int64(a) {
		ms++
	}
	return clock(ms)
}

// at is c as the instant nearest to t.
func (c clock) at(t instant) instant {
	base := floorMs(t)
	return instant((base + int64(int32(c-clock(base)))) * int64(time.Millisecond))
}

// clockAge is how far in the past ageClocks moves a key's clocks that are
// further: farther than any lifetime or renewal period, and well within
// the 24 days a clock can be read back over.
const clockAge = 7 * 24 * time.Hour

// ageClocks moves k's clocks that are older than clockAge at t to
// clockAge before t: every use of them (t >= until, t >= renewAt, t -
// sentAt against a few ticks, sentAt plus a renewal period) sees no
// difference, and they stay within what a clock can be read back over as
// long as the key is looked at at least every two weeks.
func (k *key) ageClocks(t instant) {
	oldest := t.add(-clockAge)
	for _, c := range []*clock{&k.until, &k.renewAt, &k.sentAt} {
		if c.at(t) < oldest {
			*c = floorClock(oldest)
		}
	}
}

// A ttlStep is the lifetime of a key's next ask, in one byte: step 0 is
// contendedTTL (ContendedTTL, or longer while answers come late), each
// step after it SettledGrowth times the one before, up to UncontendedTTL,
// and ttlLongest UncontendedTTL.
type ttlStep uint8

const ttlLongest ttlStep = math.MaxUint8

// ttlOf is the lifetime of step s.
func (p *Policy) ttlOf(s ttlStep) time.Duration {
	if s == ttlLongest {
		return p.cfg.UncontendedTTL
	}
	d := p.contendedTTL()
	for range s {
		d *= SettledGrowth
	}
	return min(d, p.cfg.UncontendedTTL)
}

// grown is the step after s, whose lifetime is SettledGrowth times s's up
// to UncontendedTTL.
func (p *Policy) grown(s ttlStep) ttlStep {
	if s == ttlLongest || s+1 == ttlLongest || p.ttlOf(s)*SettledGrowth >= p.cfg.UncontendedTTL {
		return ttlLongest
	}
	return s + 1
}
