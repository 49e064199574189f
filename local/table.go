package local

import (
	"github.com/hybridlimit/hybridlimit/internal/shrink"
	"github.com/hybridlimit/hybridlimit/internal/table"
)

// A shard holds its entries in a table.Table, by the 64-bit hash of their
// key: the low bits of the hash choose the shard, the high half the slot,
// so a key is hashed once. A decision goes from the shard to the slot to
// the entry, with no allocation per key but the table's pages.
//
// pageShift is log2 of the entries a page of a shard's table holds: 64,
// 6 KB with their keys (see TestEntrySize). The first page starts at 8
// entries and doubles as it fills, so a shard of a few keys takes a few
// entries' memory.
const pageShift = 6

// newTable returns the empty table of a shard.
func newTable() table.Table[entry, *entry] { return table.New[entry](pageShift) }

// Next and SetNext keep the link of the table's free list in a removed
// entry, which is otherwise zero, in attempted.
func (e *entry) Next() uint32     { return uint32(e.attempted) }
func (e *entry) SetNext(i uint32) { e.attempted = int64(i) }

// removeIf removes every entry for which drop reports true, calling drop
// once on each entry (twice on some that it keeps), and gives the memory
// of the table back once it is mostly empty: below a quarter of what its
// slots could hold (shrink.Sparse), it is packed, its slots then at most
// half full. Requires sh.mu held.
func (sh *shard) removeIf(drop func(key string, e *entry) bool) {
	sh.keys.RemoveIf(drop)
	if shrink.Sparse(sh.keys.Len(), sh.keys.Cap()) {
		sh.keys.Pack()
	}
}
