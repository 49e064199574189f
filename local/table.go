package local

import "github.com/hybridlimit/hybridlimit/internal/shrink"

// A table holds the entries of one shard by the 64-bit hash of their key,
// in open addressing with linear probing. It replaces a map[string]*entry,
// whose lookup hashes the key a second time and goes through the map's
// header, directory and table before reaching a slot: here a decision goes
// from the shard to the slot to the entry.
//
// The entries themselves live in the table's pages, by value, and a slot
// holds the high half of its key's hash and the entry's index: 8 bytes a
// slot, where a hash and a pointer to an entry allocated on its own take
// 16, and no allocation per key. A slot is found by the high half of the
// hash (the low bits chose the shard); keys whose halves are equal simply
// take two slots, the key being compared too. A removed entry's place is
// reused by the next key; when the slots shrink, the entries are moved
// together and the pages that held the removed ones are given back.
//
// put may move the entries of the first page, and removeIf any entry: a
// pointer to an entry is good until the next put or removeIf. The zero
// value is an empty table. It is not safe for concurrent use: the shard's
// mutex guards it.
type table struct {
	slots []slot    // empty or a power of two long, at most maxLoad full
	pages [][]entry // pageSize entries each, but the first, which may be shorter
	n     int       // entries held
	// free is 1 + the index of the entry removed last, 0 if none: removed
	// entries are zero but for attempted, which holds the next free one
	// the same way. The entries held and those free are the first of the
	// pages, with no gap.
	free uint32
}

type slot struct {
	h uint32 // the high half of the key's hash
	i uint32 // 1 + the entry's index in the pages; 0: the slot is empty
}

const (
	// minSlots is the length of a table's first slots.
	minSlots = 8
	// maxLoadNum/maxLoadDen is the fraction of the slots a table fills
	// before it doubles. Slots of 8 bytes keep linear probing within a
	// cache line or two up to seven eighths: 4.5 probes for a key held at
	// most, on average (36 bytes), 32 for a new key (256 bytes, read in
	// order). Deciding on 200 000 keys takes a few ns more than at three
	// quarters, and 10 bytes a key less.
	maxLoadNum, maxLoadDen = 7, 8
	// A page holds pageSize entries (6 KB), but the first, which starts
	// at minPage and doubles as it fills: a shard of a few keys takes a
	// few entries' memory, and one of many wastes at most the part of its
	// last page not yet used.
	pageShift = 6
	pageSize  = 1 << pageShift
	minPage   = 8
)

// at returns the entry of slot index i (1 + its index in the pages).
func (tb *table) at(i uint32) *entry {
	i--
	return &tb.pages[i>>pageShift][i&(pageSize-1)]
}

// grow makes room in the pages for the entry of index i, the first not yet
// used.
func (tb *table) grow(i int) {
	switch p := i >> pageShift; {
	case p == len(tb.pages):
		n := pageSize
		if p == 0 {
			n = minPage
		}
		tb.pages = append(tb.pages, make([]entry, n))
	case p == 0 && i >= len(tb.pages[0]):
		// Only the first page is ever short: double it. Its entries move
		// (see table).
		p0 := make([]entry, 2*len(tb.pages[0]))
		copy(p0, tb.pages[0])
		tb.pages[0] = p0
	}
}

// home returns the slot where a key whose hash has high half h starts
// probing. The shard was chosen by the low bits of the hash, so the high
// ones choose the slot.
func (tb *table) home(h uint32) int { return int(h) & (len(tb.slots) - 1) }

// get returns the entry of key, whose hash is h, or nil.
func (tb *table) get(h uint64, key string) *entry {
	if len(tb.slots) == 0 {
		return nil
	}
	hi := uint32(h >> 32)
	mask := len(tb.slots) - 1
	for i := tb.home(hi); ; i = (i + 1) & mask {
		s := tb.slots[i]
		if s.i == 0 {
			return nil
		}
		if s.h == hi {
			if e := tb.at(s.i); e.key == key {
				return e
			}
		}
	}
}

// put adds an entry for a key of hash h that is not in tb, and returns it,
// zero, for the caller to fill.
func (tb *table) put(h uint64) *entry {
	if (tb.n+1)*maxLoadDen > len(tb.slots)*maxLoadNum {
		tb.resize(max(2*len(tb.slots), minSlots))
	}
	i := tb.free
	if i != 0 {
		e := tb.at(i)
		tb.free, e.attempted = uint32(e.attempted), 0
	} else {
		i = uint32(tb.n + 1) // no index is free: the n held are the first n
		tb.grow(tb.n)
	}
	tb.place(slot{h: uint32(h >> 32), i: i})
	tb.n++
	return tb.at(i)
}

// place puts s in the first empty slot from its home.
func (tb *table) place(s slot) {
	mask := len(tb.slots) - 1
	i := tb.home(s.h)
	for tb.slots[i].i != 0 {
		i = (i + 1) & mask
	}
	tb.slots[i] = s
}

// resize moves the slots into n new ones, n a power of two.
func (tb *table) resize(n int) {
	old := tb.slots
	tb.slots = make([]slot, n)
	for _, s := range old {
		if s.i != 0 {
			tb.place(s)
		}
	}
}

// removeAt empties slot i and frees its entry, moving back the slots after
// it that would otherwise no longer be found from their home
// (backward-shift deletion: no tombstones, so lookups stay as short as if
// the entry had never been). Only slots from i on in probing order change.
func (tb *table) removeAt(i int) {
	e := tb.slots[i].i
	*tb.at(e) = entry{attempted: int64(tb.free)} // the key's string goes with it
	tb.free = e
	mask := len(tb.slots) - 1
	for j := (i + 1) & mask; tb.slots[j].i != 0; j = (j + 1) & mask {
		// The slot at j may move to i unless its home lies in the cyclic
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
// once on each entry (twice on some that it keeps), and gives the memory
// of the slots and the pages back once they are mostly empty.
func (tb *table) removeIf(drop func(*entry) bool) {
	for i := 0; i < len(tb.slots); {
		if s := tb.slots[i]; s.i != 0 && drop(tb.at(s.i)) {
			// A later slot may move into i: look at i again. A slot can
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
		tb.pack()
	}
}

// pack moves the entries to the first n indexes, in new pages, and drops
// the free list: the pages that held removed entries are given back.
func (tb *table) pack() {
	old := *tb
	tb.pages, tb.free = nil, 0
	next := 0
	for i, s := range old.slots {
		if s.i == 0 {
			continue
		}
		tb.grow(next)
		next++
		tb.slots[i].i = uint32(next)
		*tb.at(uint32(next)) = *old.at(s.i)
	}
}

// each calls f on every entry.
func (tb *table) each(f func(*entry)) {
	for _, s := range tb.slots {
		if s.i != 0 {
			f(tb.at(s.i))
		}
	}
}
