package hybrid

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/local"
)

// Credit: with exact bursts, an exact decision that Redis allows may also
// hand the instance a few tokens of the key's pool ahead of its next
// requests (global.ExactRequest.Credit), which it then admits in process.
// Redis counts them against the pool's burst until the credit ends there,
// so the pool and every credit together hold no more than the pool alone
// would: the bound is unchanged. It is handed only from a pool that stays
// at least half full, so a key near its limit, where the tokens are
// contended, is decided in Redis request by request as before.
const (
	// creditLife is how long a credit lasts in Redis: long enough that a
	// key with a request every second or two on this instance uses it
	// before it ends (on the bench's Zipf keys 2 s sent 6% fewer commands
	// than 1 s, and 5 s no fewer than 2 s), short enough that what an
	// instance holds and does not use is soon no longer counted against
	// the pool. An instance stops admitting it at endEarly of that, as
	// leases end (its clock may run slow).
	creditLife = 2 * time.Second
	// creditShare: an instance asks for at most burst/(creditShare·N-hat)
	// tokens of credit (at least 1), its part of the burst. What all the
	// credits hold together is at most half the burst anyway: Redis hands
	// credit only from a pool that stays at least half full.
	creditShare = 1
)

// creditBook holds the credit of one limit's keys on this instance, and
// the demand their deny cache held. It is safe for concurrent use.
type creditBook struct {
	mu      sync.Mutex
	keys    map[string]credit // guarded by mu
	sweepAt int               // guarded by mu: the size at which add drops ended credits
	clock   epoch             // guarded by mu: of the credits' ends and the held demands' times
	held    map[string]held   // guarded by mu
	heldAt  int               // guarded by mu: the size at which startHeld drops forgotten demand
	// counting is len(held), written under mu: a request its deny cache
	// holds (hold) takes mu only while some key's held demand is counted,
	// which is rare, not at every turn a key waits for.
	counting atomic.Int64
}

// held is the demand of a key's requests that the deny cache denied in
// process since its last take (global.ExactRequest.Held), measured at at,
// while the pool had no rate. With exact bursts Redis counts an exact user
// at the demand its takes show, and the leases leave the pool that much.
// A key held until the leases renew sends one take per hold: an instance
// that wanted its share showed Redis almost no demand, and waited seconds
// for it. Holds for a turn are not counted: the pool refills for the
// caller at least at what it is counted at, and counting what it held
// there too left the headroom of every light exact user unused beside a
// heavy lease (a key 90/10 over four instances: 0.974 of an exact bucket,
// against 0.997; see PLACEMENT.md, Known gaps).
type held struct {
	demand float64
	at     instant
}

// heldForgotten is how long after its last held request a held demand is
// dropped unsent when the book sweeps (five time constants: less than 1%
// of it is left).
const heldForgotten = 5 * global.DemandTau

// credit is a key's credit: tokens to admit in process until until. 16
// bytes, an instant where a time.Time takes 24: an entry per key that
// holds credit.
type credit struct {
	tokens int
	until  instant
}

// creditFor is the credit an exact decision of a limit of burst over n
// instances asks for.
func creditFor(burst, n int) int { return max(1, burst/(creditShare*max(n, 1))) }

// use takes n tokens of key's credit at t if it holds them, and reports
// how many are left.
func (b *creditBook) use(key string, n int, t time.Time) (left int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, found := b.keys[key]
	switch {
	case !found:
		return 0, false
	case !b.clock.instant(t).Before(c.until):
		delete(b.keys, key)
		return 0, false
	case c.tokens < n:
		return 0, false
	}
	c.tokens -= n
	if c.tokens == 0 {
		delete(b.keys, key)
	} else {
		b.keys[key] = c
	}
	return c.tokens, true
}

// surrender removes key's credit at t and returns the tokens still
// usable, which the next exact decision gives back to the pool: they are
// not admitted here from now on, whatever its answer.
func (b *creditBook) surrender(key string, t time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.surrenderLocked(key, b.clock.instant(t))
}

// beforeTake is what an exact take of key at t sends besides its tokens:
// the credit it gives back (surrender) and the demand its deny cache held
// (drawHeld), both removed from the book.
func (b *creditBook) beforeTake(key string, t time.Time) (back int, held float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.instant(t)
	return b.surrenderLocked(key, now), b.drawHeldLocked(key, now)
}

// surrenderLocked is surrender at now. Requires b.mu held.
func (b *creditBook) surrenderLocked(key string, now instant) int {
	c, found := b.keys[key]
	if !found {
		return 0
	}
	delete(b.keys, key)
	if !now.Before(c.until) {
		return 0
	}
	return c.tokens
}

// add puts tokens of credit for key in force from t until end, beside what
// it holds (a concurrent decision's), the whole ending at the later end.
func (b *creditBook) add(key string, tokens int, t, end time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now, until := b.clock.instant(t), b.clock.instant(end)
	if b.keys == nil {
		b.keys = make(map[string]credit)
	}
	c := b.keys[key]
	if !now.Before(c.until) {
		c = credit{}
	}
	c.tokens += tokens
	if until.After(c.until) {
		c.until = until
	}
	b.keys[key] = c
	if len(b.keys) >= b.sweepAt {
		for k, c := range b.keys {
			if !now.Before(c.until) {
				delete(b.keys, k)
			}
		}
		b.sweepAt = 2*len(b.keys) + 64
	}
}

// startHeld starts counting the demand key's deny cache holds from t on,
// if it is not counted already: Redis denied it from a pool with no rate.
func (b *creditBook) startHeld(key string, t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.instant(t)
	if b.held == nil {
		b.held = make(map[string]held)
	}
	if _, found := b.held[key]; !found {
		b.held[key] = held{at: now}
	}
	if len(b.held) >= b.heldAt {
		for k, h := range b.held {
			if now.Sub(h.at) >= heldForgotten {
				delete(b.held, k)
			}
		}
		b.heldAt = 2*len(b.held) + 64
	}
	b.counting.Store(int64(len(b.held)))
}

// hold adds n tokens that key's deny cache denied at t to its held demand,
// if it is counted (startHeld).
func (b *creditBook) hold(key string, n int, t time.Time) {
	if b.counting.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h, found := b.held[key]
	if !found {
		return
	}
	if now := b.clock.instant(t); now.After(h.at) {
		h = held{demand: global.DecayHeld(h.demand, now.Sub(h.at), n), at: now}
	} else {
		h.demand += float64(n) // a decision that took the lock late
	}
	b.held[key] = h
}

// drawHeld removes key's held demand at t and returns it decayed to t.
func (b *creditBook) drawHeld(key string, t time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.drawHeldLocked(key, b.clock.instant(t))
}

// drawHeldLocked is drawHeld at now. Requires b.mu held.
func (b *creditBook) drawHeldLocked(key string, now instant) float64 {
	h, found := b.held[key]
	if !found {
		return 0
	}
	delete(b.held, key)
	b.counting.Store(int64(len(b.held)))
	return global.DecayHeld(h.demand, now.Sub(h.at), 0)
}

// creditShares is the local limiter as the engine sees it, for a limit with
// exact bursts: tokens given to a key (what its exact pool held for it,
// when it takes a lease) come with the key's credit, which its decisions
// no longer use once it decides locally. Both were taken from the pool
// already: they move, they are not made.
type creditShares struct {
	*local.Limiter
	book *creditBook
}

func (s creditShares) Give(t time.Time, key string, tokens int) bool {
	return s.Limiter.Give(t, key, tokens+s.book.surrender(key, t))
}
