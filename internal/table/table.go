// Package table is the hash table by string key that package local keeps
// each shard's keys in and package hybrid/placement the keys a policy
// tracks. It imports nothing of this module.
//
// It replaces a map[string]*V, whose lookup hashes the key a second time
// and goes through the map's header, directory and table before reaching a
// slot, and which takes an allocation a key: here a lookup goes from the
// caller's hash to the slot to the value. Keys are found in open
// addressing with linear probing. A slot holds the high half of its key's
// hash and the value's place in the pages: 8 bytes a slot, where a hash and a pointer
// to a value allocated on its own take 16. The keys and the values live in
// the table's pages, by value, and no key takes an allocation of its own
// but when a page fills. Keys whose halves are equal simply take two
// slots, the key being compared too. A removed value's place is reused by
// the next key; Pack moves the values together and gives back the pages
// that held removed ones.
package table

// A Table holds values of type E by string key. The caller hashes the key,
// 64 bits, and passes the hash to every lookup: the table uses the high
// half, so that the low bits are the caller's (package local chooses a
// shard by them). P is *E, whose methods hold the link of the free list in
// a removed value (see Link).
//
// Put may move the values of the first page, and Remove, RemoveIf and Pack
// any value: a pointer to a value is good until the next call to one of
// them. The zero value is not ready: see New. A Table is not safe for
// concurrent use.
type Table[E any, P Link[E]] struct {
	slots []slot      // empty or a power of two long, at most maxLoad full
	pages [][]item[E] // 1<<shift items each, but the first, which may be shorter
	n     int         // values held
	// free is the ref of the value removed last, 0 if none: removed
	// values are zero but for the link (see Link), which holds the next
	// free one the same way. The values held and those free are the first
	// of the pages, with no gap.
	free  uint32
	shift uint8 // log2 of the items a page holds, at most refShift
}

// Link is what a Table asks of its value type: the link of its free list
// is kept in a removed value, which is otherwise zero, so that the list
// takes no memory of its own. SetNext stores i in a zero value, and Next
// returns it. Neither is called on a value held: the field they use may
// be one the value needs while it is held.
type Link[E any] interface {
	*E
	Next() uint32
	SetNext(i uint32)
}

// An item is one key and its value, as the pages hold them.
type item[E any] struct {
	key string
	val E
}

type slot struct {
	h uint32 // the high half of the key's hash
	i uint32 // the item's ref; 0: the slot is empty
}

// A ref is how a slot and the free list name an item: 1 + its page
// shifted left by refShift, plus its index in the page. Its page and index
// come out by constant shifts whatever the page size: with the shift of
// the page size read from the table instead, a decision in package local
// took 10% longer in BenchmarkAllowN/impl=local/keys=1000/parallel. A table holds at most 1<<(32-refShift)
// pages but one: the last page's last ref would be 0.
const (
	refShift = 10
	maxPages = 1<<(32-refShift) - 1
)

const (
	// minSlots is the length of a table's first slots.
	minSlots = 8
	// maxLoadNum/maxLoadDen is the fraction of the slots a table fills
	// before it doubles. Slots of 8 bytes keep linear probing within a
	// cache line or two up to seven eighths: 4.5 probes for a key held at
	// most, on average (36 bytes), 32 for a new key (256 bytes, read in
	// order). Deciding on 200 000 keys in package local takes a few ns
	// more than at three quarters, and 10 bytes a key less.
	maxLoadNum, maxLoadDen = 7, 8
	// minPage is the length of the first page, which doubles as it fills
	// up to the page size: a table of a few keys takes a few items'
	// memory, and one of many wastes at most the part of its last page
	// not yet used.
	minPage = 8
)

// New returns an empty table whose pages hold 1<<pageShift items each,
// pageShift from 3 (minPage) to 10 (refShift).
func New[E any, P Link[E]](pageShift int) Table[E, P] {
	if pageShift < 3 || pageShift > refShift {
		panic("table: page shift out of range")
	}
	return Table[E, P]{shift: uint8(pageShift)}
}

// Len returns the number of values held.
func (t *Table[E, P]) Len() int { return t.n }

// Cap returns the number of values t can hold before its slots double.
func (t *Table[E, P]) Cap() int { return len(t.slots) * maxLoadNum / maxLoadDen }

// at returns the item of ref i.
func (t *Table[E, P]) at(i uint32) *item[E] {
	i--
	return &t.pages[i>>refShift][i&(1<<refShift-1)]
}

// ref returns the ref of the item of index n in the pages, counting from
// 0 in order.
func (t *Table[E, P]) ref(n int) uint32 {
	return uint32(n>>t.shift<<refShift|n&(1<<t.shift-1)) + 1
}

// home returns the slot where a key whose hash has high half h starts
// probing.
func (t *Table[E, P]) home(h uint32) int { return int(h) & (len(t.slots) - 1) }

// Get returns the value of key, whose hash is h, or nil. It is find
// written out, one call less on the path of every decision in package
// local.
func (t *Table[E, P]) Get(h uint64, key string) *E {
	if len(t.slots) == 0 {
		return nil
	}
	hi := uint32(h >> 32)
	mask := len(t.slots) - 1
	for i := t.home(hi); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s.i == 0 {
			return nil
		}
		if s.h == hi {
			if it := t.at(s.i); it.key == key {
				return &it.val
			}
		}
	}
}

// find returns the slot of key, whose hash is h, or -1.
func (t *Table[E, P]) find(h uint64, key string) int {
	if len(t.slots) == 0 {
		return -1
	}
	hi := uint32(h >> 32)
	mask := len(t.slots) - 1
	for i := t.home(hi); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s.i == 0 {
			return -1
		}
		if s.h == hi && t.at(s.i).key == key {
			return i
		}
	}
}

// Put adds key, whose hash is h and which t does not hold, and returns its
// value, zero, for the caller to fill.
func (t *Table[E, P]) Put(h uint64, key string) *E {
	if (t.n+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.resize(max(2*len(t.slots), minSlots))
	}
	i := t.free
	if i != 0 {
		it := t.at(i)
		t.free = P(&it.val).Next()
		var zero E
		it.val = zero
	} else {
		i = t.ref(t.n) // no index is free: the n held are the first n
		t.grow(t.n)
	}
	t.place(slot{h: uint32(h >> 32), i: i})
	t.n++
	it := t.at(i)
	it.key = key
	return &it.val
}

// grow makes room in the pages for the item of index i, the first not yet
// used.
func (t *Table[E, P]) grow(i int) {
	switch p := i >> t.shift; {
	case p == len(t.pages):
		if p >= maxPages {
			panic("table: full")
		}
		n := 1 << t.shift
		if p == 0 {
			n = minPage
		}
		t.pages = append(t.pages, make([]item[E], n))
	case p == 0 && i >= len(t.pages[0]):
		// Only the first page is ever short: double it. Its items move
		// (see Table).
		p0 := make([]item[E], 2*len(t.pages[0]))
		copy(p0, t.pages[0])
		t.pages[0] = p0
	}
}

// place puts s in the first empty slot from its home.
func (t *Table[E, P]) place(s slot) {
	mask := len(t.slots) - 1
	i := t.home(s.h)
	for t.slots[i].i != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = s
}

// resize moves the slots into n new ones, n a power of two.
func (t *Table[E, P]) resize(n int) {
	old := t.slots
	t.slots = make([]slot, n)
	for _, s := range old {
		if s.i != 0 {
			t.place(s)
		}
	}
}

// Remove removes key, whose hash is h, and reports whether t held it.
func (t *Table[E, P]) Remove(h uint64, key string) bool {
	i := t.find(h, key)
	if i < 0 {
		return false
	}
	t.removeAt(i)
	return true
}

// removeAt empties slot i and frees its item, moving back the slots after
// it that would otherwise no longer be found from their home
// (backward-shift deletion: no tombstones, so lookups stay as short as if
// the key had never been). Only slots from i on in probing order change.
func (t *Table[E, P]) removeAt(i int) {
	e := t.slots[i].i
	it := t.at(e)
	*it = item[E]{} // the key's string goes with it
	P(&it.val).SetNext(t.free)
	t.free = e
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].i != 0; j = (j + 1) & mask {
		// The slot at j may move to i unless its home lies in the cyclic
		// range (i, j]: then it would be found before reaching i.
		home := t.home(t.slots[j].h)
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}

// RemoveIf removes every key for which drop reports true, calling drop
// once on each key held (twice on some that it keeps). It gives no memory
// back: see Pack.
func (t *Table[E, P]) RemoveIf(drop func(key string, v *E) bool) {
	for i := 0; i < len(t.slots); {
		if s := t.slots[i]; s.i != 0 {
			if it := t.at(s.i); drop(it.key, &it.val) {
				// A later slot may move into i: look at i again. A slot
				// can only move back to i or to a slot not yet looked at,
				// or come round from the start to be looked at twice.
				t.removeAt(i)
				continue
			}
		}
		i++
	}
}

// Pack moves the keys into new slots sized for what t holds, at most half
// full, and their values to the first indexes, in new pages, and drops the
// free list: the pages that held removed values are given back.
func (t *Table[E, P]) Pack() {
	n := minSlots
	for n < 2*t.n {
		n *= 2
	}
	t.resize(n)
	old := *t
	t.pages, t.free = nil, 0
	next := 0
	for i, s := range old.slots {
		if s.i == 0 {
			continue
		}
		t.grow(next)
		r := t.ref(next)
		next++
		t.slots[i].i = r
		*t.at(r) = *old.at(s.i)
	}
}

// Each calls f on every key and its value.
func (t *Table[E, P]) Each(f func(key string, v *E)) {
	for _, s := range t.slots {
		if s.i != 0 {
			it := t.at(s.i)
			f(it.key, &it.val)
		}
	}
}
