package local

import (
	"fmt"
	"testing"
)

// TestTableGivesMemoryBack fills a shard's table, then empties most of it:
// the slots and the pages shrink to what the rest needs, and grow again as
// keys come back. A quarter of what the slots could hold stays: a key
// count that swings by 2x does not rebuild the table every round.
func TestTableGivesMemoryBack(t *testing.T) {
	sh := shard{keys: newTable()}
	for i := range 10_000 {
		sh.keys.Put(uint64(i)<<32, fmt.Sprint(i))
	}
	if got := sh.keys.Cap(); got != 16384*7/8 {
		t.Fatalf("10000 entries: room for %d, want 16384 slots", got)
	}
	sh.removeIf(func(key string, _ *entry) bool { return key != "1" && key != "2" })
	if sh.keys.Len() != 2 || sh.keys.Cap() != 7 {
		t.Fatalf("after removing all but 2: %d entries, room for %d, want 8 slots", sh.keys.Len(), sh.keys.Cap())
	}
	if sh.keys.Get(1<<32, "1") == nil || sh.keys.Get(2<<32, "2") == nil {
		t.Fatal("a kept entry was lost in the shrink")
	}
	for i := range 10_000 {
		if i != 1 && i != 2 {
			sh.keys.Put(uint64(i)<<32, fmt.Sprint(i))
		}
	}
	sh.removeIf(func(key string, _ *entry) bool { return key >= "5" })
	if got := sh.keys.Cap(); got != 16384*7/8 {
		t.Fatalf("%d of 10000 entries left: room for %d, want 16384 slots kept", sh.keys.Len(), got)
	}
	// A quarter of what the slots could hold stays; one fewer, and the
	// table is packed, its slots at most half full.
	for _, tc := range []struct{ left, slots int }{{16384 * 7 / 8 / 4, 16384}, {16384*7/8/4 - 1, 8192}} {
		sh.removeIf(func(string, *entry) bool { return sh.keys.Len() > tc.left })
		if sh.keys.Len() != tc.left || sh.keys.Cap() != tc.slots*7/8 {
			t.Fatalf("%d entries left, want %d: room for %d, want %d slots", sh.keys.Len(), tc.left, sh.keys.Cap(), tc.slots)
		}
	}
}
