package local

import "github.com/hybridlimit/hybridlimit/internal/shrink"

// A table holds the entries of one shard by the 64-bit hash of their key,
// in open addressing with linear probing. It replaces a map[string]*entry,
// whose lookup hashes the key a second time and goes through the map's
// header, directory and table before reaching a slot: here a decision goes
// from the shard to the slot to the entry. Keys whose hashes are equal (one
// chance in 2^64 per pair) simply take two slots; the key is compared too.
// The zero value is an empty table. It is not safe for concurrent use: the
// shard's mutex guards it.
type table struct {
	slots []slot // empty or a power of two long, at most maxLoad full
	n     int    // entries held
}

type slot struct {
	h uint64
	e *entry // nil: the slot is empty
}

const (
	// minSlots is the length of a table's first slots.
	minSlots = 8
	// maxLoadNum/maxLoadDen is the fraction of the slots a table fills
	// before it doubles: linear probing stays short (2.5 probes for a key
	// held, on average) up to three quarters.
	maxLoadNum, maxLoadDen = 3, 4
)

// home returns the slot where a key of hash h starts probing. The shard
// was chosen by the low bits of h, so the high ones choose the slot.
func (tb *table) home(h uint64) int { return int(h>>32) & (len(tb.slots) - 1) }

// get returns the entry of key, whose hash is h, or nil.
func (tb *table) get(h uint64, key string) *entry {
	if len(tb.slots) == 0 {
		return nil
	}
	mask := len(tb.slots) - 1
	for i := tb.home(h); ; i = (i + 1) & mask {
		s := &tb.slots[i]
		if s.e == nil {
			return nil
		}
		if s.h == h && s.e.key == key {
			return s.e
		}
	}
}

// put adds e, whose key has hash h and is not in tb.
func (tb *table) put(h uint64, e *entry) {
	if (tb.n+1)*maxLoadDen > len(tb.slots)*maxLoadNum {
		tb.resize(max(2*len(tb.slots), minSlots))
	}
	tb.place(h, e)
	tb.n++
}

// place puts e in the first empty slot from h's home.
func (tb *table) place(h uint64, e *entry) {
	mask := len(tb.slots) - 1
	i := tb.home(h)
	for tb.slots[i].e != nil {
		i = (i + 1) & mask
	}
	tb.slots[i] = slot{h: h, e: e}
}

// resize moves the entries into n new slots, n a power of two.
func (tb *table) resize(n int) {
	old := tb.slots
	tb.slots = make([]slot, n)
	for _, s := range old {
		if s.e != nil {
			tb.place(s.h, s.e)
		}
	}
}

// removeAt empties slot i, moving back the entries after it that would
// otherwise no longer be found from their home (backward-shift deletion:
// no tombstones, so lookups stay as short as if the entry had never been).
// Only slots from i on in probing order change.
func (tb *table) removeAt(i int) {
	mask := len(tb.slots) - 1
	for j := (i + 1) & mask; tb.slots[j].e != nil; j = (j + 1) & mask {
		// The entry at j may move to i unless its home lies in the cyclic
		// range (i, j]: then it would be found before reaching i.
		home := tb.home(tb.slots[j].h)
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			tb.slots[i] = tb.slots[j]
			i = j
		}
	}
	tb.slots[i] = slot{}
	tb.n--
}

// removeIf removes every entry for which drop reports true, calling drop
// once on each entry (twice on some that it keeps), and gives the slots'
// memory back once they are mostly empty.
func (tb *table) removeIf(drop func(*entry) bool) {
	for i := 0; i < len(tb.slots); {
		if e := tb.slots[i].e; e != nil && drop(e) {
			// A later entry may move into i: look at i again. An entry can
			// only move back to i or to a slot not yet looked at, or come
			// round from the start to be looked at twice.
			tb.removeAt(i)
			continue
		}
		i++
	}
	if held := len(tb.slots) * maxLoadNum / maxLoadDen; held >= shrink.From && tb.n*shrink.Below < held {
		// Below a quarter of the most it could hold: halve until the
		// entries fill at most half.
		n := len(tb.slots)
		for n > minSlots && tb.n*4 <= n {
			n /= 2
		}
		tb.resize(n)
	}
}

// each calls f on every entry.
func (tb *table) each(f func(*entry)) {
	for _, s := range tb.slots {
		if s.e != nil {
			f(s.e)
		}
	}
}
