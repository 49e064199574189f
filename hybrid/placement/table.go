package placement

import "hash/maphash"

// A table holds the keys a Policy tracks, by value in pages, found by name
// in open addressing with linear probing: a slot holds the high half of
// the name's hash and the key's index, 8 bytes, where a map[string]*key
// takes 24 a slot and an allocation a key. Names whose halves are equal
// simply take two slots, the name being compared too. A forgotten key's
// place goes to the next key; pack gives back the pages of forgotten keys.
// A pointer to a key is good until the next put, remove or pack. The zero
// value is not ready: see newTable.
type table struct {
	seed  maphash.Seed
	slots []slot  // empty or a power of two long, at most maxLoad full
	pages [][]key // pageSize keys each, but the first, which may be shorter
	n     int     // keys held
	// free is 1 + the index of the key removed last, 0 if none: removed
	// keys are zero but for asked, which holds the next free one the same
	// way. The keys held and those free are the first of the pages.
	free uint32
}

type slot struct {
	h uint32 // the high half of the name's hash
	i uint32 // 1 + the key's index in the pages; 0: the slot is empty
}

const (
	// minSlots is the length of a table's first slots.
	minSlots = 8
	// maxLoadNum/maxLoadDen is the fraction of the slots a table fills
	// before it doubles. The loop looks a key up once a tick, not once a
	// decision: seven eighths keep the probes within a cache line or two
	// (4.5 for a key held at most, on average; 32 for one not tracked).
	maxLoadNum, maxLoadDen = 7, 8
	// A page holds pageSize keys, but the first, which starts at minPage
	// and doubles as it fills. 1024 keys take 88 KB, eleven pages of the
	// Go heap's 8 KB, no byte rounded up.
	pageShift = 10
	pageSize  = 1 << pageShift
	minPage   = 8
)

func newTable() table { return table{seed: maphash.MakeSeed()} }

func (tb *table) hash(name string) uint32 { return uint32(maphash.String(tb.seed, name) >> 32) }

// at returns the key of slot index i (1 + its index in the pages).
func (tb *table) at(i uint32) *key {
	i--
	return &tb.pages[i>>pageShift][i&(pageSize-1)]
}

func (tb *table) home(h uint32) int { return int(h) & (len(tb.slots) - 1) }

// find returns the slot of name, or -1.
func (tb *table) find(name string) int {
	if len(tb.slots) == 0 {
		return -1
	}
	h, mask := tb.hash(name), len(tb.slots)-1
	for i := tb.home(h); ; i = (i + 1) & mask {
		s := tb.slots[i]
		if s.i == 0 {
			return -1
		}
		if s.h == h && tb.at(s.i).name == name {
			return i
		}
	}
}

// get returns the key of name, or nil.
func (tb *table) get(name string) *key {
	if i := tb.find(name); i >= 0 {
		return tb.at(tb.slots[i].i)
	}
	return nil
}

// put adds a key for name, which is not in tb, and returns it, zero but
// for its name.
func (tb *table) put(name string) *key {
	if (tb.n+1)*maxLoadDen > len(tb.slots)*maxLoadNum {
		tb.resize(max(2*len(tb.slots), minSlots))
	}
	i := tb.free
	if i != 0 {
		k := tb.at(i)
		tb.free, k.asked = k.asked, 0
	} else {
		i = uint32(tb.n + 1) // no index is free: the n held are the first n
		tb.grow(tb.n)
	}
	tb.place(slot{h: tb.hash(name), i: i})
	tb.n++
	k := tb.at(i)
	k.name = name
	return k
}

// grow makes room in the pages for the key of index i, the first not yet
// used.
func (tb *table) grow(i int) {
	switch p := i >> pageShift; {
	case p == len(tb.pages):
		n := pageSize
		if p == 0 {
			n = minPage
		}
		tb.pages = append(tb.pages, make([]key, n))
	case p == 0 && i >= len(tb.pages[0]):
		// Only the first page is ever short: double it.
		p0 := make([]key, 2*len(tb.pages[0]))
		copy(p0, tb.pages[0])
		tb.pages[0] = p0
	}
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

// remove drops the key of name, if held, moving back the slots after its
// own that would otherwise no longer be found from their home
// (backward-shift deletion: no tombstones).
func (tb *table) remove(name string) {
	i := tb.find(name)
	if i < 0 {
		return
	}
	e := tb.slots[i].i
	*tb.at(e) = key{asked: tb.free} // the name's string goes with it
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

// pack moves the keys into new slots and pages sized for what is held:
// the slots at most half full, the keys at the first indexes.
func (tb *table) pack() {
	n := minSlots
	for n < 2*tb.n {
		n *= 2
	}
	old := *tb
	tb.slots, tb.pages, tb.free = make([]slot, n), nil, 0
	next := 0
	for _, s := range old.slots {
		if s.i == 0 {
			continue
		}
		tb.grow(next)
		next++
		*tb.at(uint32(next)) = *old.at(s.i)
		tb.place(slot{h: s.h, i: uint32(next)})
	}
}

// each calls f on every key.
func (tb *table) each(f func(*key)) {
	for _, s := range tb.slots {
		if s.i != 0 {
			f(tb.at(s.i))
		}
	}
}
