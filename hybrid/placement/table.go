package placement

import (
	"hash/maphash"

	"github.com/hybridlimit/hybridlimit/internal/table"
)

// A keyTable holds the keys a Policy tracks, by value, found by name in a
// table.Table: 8 bytes a slot, where a map[string]*key takes 24 a slot and
// an allocation a key. A forgotten key's place goes to the next key; Pack
// gives back the pages of forgotten keys. A pointer to a key is good until
// the next put, remove or Pack. The zero value is not ready: see
// newKeyTable.
type keyTable struct {
	seed maphash.Seed
	table.Table[key, *key]
}

// pageShift is log2 of the keys a page of the table holds. The first page
// starts at 8 keys and doubles as it fills. 1024 keys take 88 KB with their
// names, eleven pages of the Go heap's 8 KB, no byte rounded up.
const pageShift = 10

func newKeyTable() keyTable {
	return keyTable{seed: maphash.MakeSeed(), Table: table.New[key](pageShift)}
}

// hash returns the hash of name, whose high half the table finds it by.
func (tb *keyTable) hash(name string) uint64 { return maphash.String(tb.seed, name) }

// get returns the key of name, or nil.
func (tb *keyTable) get(name string) *key { return tb.Get(tb.hash(name), name) }

// put adds a key for name, which is not in tb, and returns it, zero.
func (tb *keyTable) put(name string) *key { return tb.Put(tb.hash(name), name) }

// remove drops the key of name, if held.
func (tb *keyTable) remove(name string) { tb.Remove(tb.hash(name), name) }

// Next and SetNext keep the link of the table's free list in a forgotten
// key, which is otherwise zero, in asked.
func (k *key) Next() uint32     { return k.asked }
func (k *key) SetNext(i uint32) { k.asked = i }
