package table

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// A val is the value of the tests' tables: id is what a test writes to it,
// next the link of the free list.
type val struct {
	id   int
	next uint32
}

func (v *val) Next() uint32     { return v.next }
func (v *val) SetNext(i uint32) { v.next = i }

// hashOf returns a hash of high half hi, and a low half that the table
// must not look at.
func hashOf(hi uint32, low int) uint64 { return uint64(hi)<<32 | uint64(uint32(low)) }

// model runs a table and a map side by side: want holds each key's id,
// which its value keeps, and hash each key's hash.
type model struct {
	t    *testing.T
	tb   Table[val, *val]
	want map[string]int
	hash map[string]uint64
}

// check fails the test unless the table holds what the map does: every key
// held is found, with its id, Each visits each once, and no other.
func (m *model) check(step int) {
	m.t.Helper()
	if m.tb.Len() != len(m.want) {
		m.t.Fatalf("step %d: table holds %d, map %d", step, m.tb.Len(), len(m.want))
	}
	for k, id := range m.want {
		if v := m.tb.Get(m.hash[k], k); v == nil || v.id != id {
			m.t.Fatalf("step %d: Get(%q) = %+v, want id %d", step, k, v, id)
		}
	}
	seen := map[string]bool{}
	m.tb.Each(func(k string, v *val) {
		if id, ok := m.want[k]; !ok || v.id != id || seen[k] {
			m.t.Fatalf("step %d: Each visits %q (id %d, seen %v), which the table should not hold", step, k, v.id, seen[k])
		}
		seen[k] = true
	})
	if len(seen) != len(m.want) {
		m.t.Fatalf("step %d: Each visits %d keys, want %d", step, len(seen), len(m.want))
	}
}

// put adds k with id if it is not held, and checks that its value is zero.
func (m *model) put(step int, k string, id int) {
	if m.tb.Get(m.hash[k], k) != nil {
		return
	}
	v := m.tb.Put(m.hash[k], k)
	if *v != (val{}) {
		m.t.Fatalf("step %d: Put(%q) gave %+v, not a zero value", step, k, *v)
	}
	v.id = id
	m.want[k] = id
}

// removeIf removes each key with probability p, checking that RemoveIf
// asks about every key held and never about one it dropped.
func (m *model) removeIf(step int, rng *rand.Rand, p float64) {
	dropped, asked := map[string]bool{}, map[string]bool{}
	m.tb.RemoveIf(func(k string, v *val) bool {
		if dropped[k] {
			m.t.Fatalf("step %d: RemoveIf asked about %q after dropping it", step, k)
		}
		if id, ok := m.want[k]; !ok || v.id != id {
			m.t.Fatalf("step %d: RemoveIf asked about %q (id %d), which the table should not hold", step, k, v.id)
		}
		asked[k] = true
		if rng.Float64() < p {
			dropped[k] = true
			return true
		}
		return false
	})
	for k := range m.want {
		if !asked[k] {
			m.t.Fatalf("step %d: RemoveIf never asked about %q", step, k)
		}
	}
	for k := range dropped {
		delete(m.want, k)
	}
}

// TestAgainstMap runs random puts, lookups, removals and packs on a table
// and on a map side by side. The high halves of the hashes are drawn from
// a few values, so that keys share homes, clusters wrap round the end of
// the slots, and some keys share a whole hash, and every key must stay
// where a lookup finds it. Pages of 8 items make the keys span many pages.
func TestAgainstMap(t *testing.T) {
	for _, highs := range []int{1, 3, 40, 1 << 20} {
		t.Run(fmt.Sprint("highs=", highs), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(highs)))
			m := &model{t: t, tb: New[val](3), want: map[string]int{}, hash: map[string]uint64{}}
			for step := range 4000 {
				k := fmt.Sprint("k", rng.IntN(500))
				if _, ok := m.hash[k]; !ok {
					m.hash[k] = hashOf(uint32(rng.IntN(highs)), rng.IntN(7))
				}
				switch op := rng.IntN(20); {
				case op < 10:
					m.put(step, k, step+1)
				case op < 13:
					_, held := m.want[k]
					if got := m.tb.Remove(m.hash[k], k); got != held {
						t.Fatalf("step %d: Remove(%q) = %v, want %v", step, k, got, held)
					}
					delete(m.want, k)
				case op < 17:
					_, held := m.want[k]
					if got := m.tb.Get(m.hash[k], k); (got != nil) != held {
						t.Fatalf("step %d: Get(%q) = %p, want it held: %v", step, k, got, held)
					}
				case op < 19:
					m.removeIf(step, rng, rng.Float64())
				default:
					m.tb.Pack()
				}
				m.check(step)
			}
		})
	}
}

// TestHighHalf checks that the table finds a key by the high half of its
// hash alone, the low half being the caller's, and that keys whose high
// halves are equal all stay found as others come and go.
func TestHighHalf(t *testing.T) {
	tb := New[val](6)
	for i := range 20 {
		tb.Put(hashOf(7, i), fmt.Sprint(i)).id = i
	}
	for i := range 20 {
		if v := tb.Get(hashOf(7, 1000+i), fmt.Sprint(i)); v == nil || v.id != i {
			t.Fatalf("Get(%d) with another low half = %+v, want id %d", i, v, i)
		}
	}
	if tb.Get(hashOf(7, 0), "20") != nil || tb.Get(hashOf(8, 0), "1") != nil {
		t.Fatal("Get found a key not held, or one under another high half")
	}
	for i := 0; i < 20; i += 2 {
		if !tb.Remove(hashOf(7, -1), fmt.Sprint(i)) {
			t.Fatalf("Remove(%d) found nothing", i)
		}
	}
	for i := range 20 {
		if v := tb.Get(hashOf(7, 0), fmt.Sprint(i)); (v != nil) != (i%2 == 1) {
			t.Fatalf("Get(%d) = %+v after removing the even keys", i, v)
		}
	}
}

// TestNoTombstones fills a cluster that wraps round the end of the slots
// and empties it again, in an order that makes the later keys move back:
// every key stays found, and once all are gone every slot is empty.
func TestNoTombstones(t *testing.T) {
	tb := New[val](6)
	// 8 slots: three keys at home 7 take 7, 0 and 1; two at home 0 take
	// 2 and 3.
	homes := []uint32{7, 7, 7, 0, 0}
	for i, h := range homes {
		tb.Put(hashOf(h, 0), fmt.Sprint(i)).id = i
	}
	if len(tb.slots) != minSlots {
		t.Fatalf("%d slots for %d keys, want %d", len(tb.slots), len(homes), minSlots)
	}
	removed := map[int]bool{}
	for _, r := range []int{0, 3, 1, 4, 2} {
		tb.Remove(hashOf(homes[r], 0), fmt.Sprint(r))
		removed[r] = true
		for i, h := range homes {
			if v := tb.Get(hashOf(h, 0), fmt.Sprint(i)); (v == nil) != removed[i] || (v != nil && v.id != i) {
				t.Fatalf("after removing %d: Get(%d) = %+v", r, i, v)
			}
		}
	}
	for i, s := range tb.slots {
		if s != (slot{}) {
			t.Fatalf("slot %d holds %+v with the table empty", i, s)
		}
	}
}

// TestReusesRemoved checks that a removed key's place goes to the next key,
// not to a new one at the end of the pages, and comes back zero.
func TestReusesRemoved(t *testing.T) {
	tb := New[val](6)
	for i := range 100 {
		tb.Put(hashOf(uint32(i), 0), fmt.Sprint(i)).id = i + 1
	}
	tb.RemoveIf(func(k string, _ *val) bool { return k == "5" })
	tb.Remove(hashOf(50, 0), "50")
	// Removed items are zero but for the link: the key's string, and
	// whatever the value held, go with them.
	if it := *tb.at(tb.ref(5)); it != (item[val]{}) {
		t.Errorf("the item removed first holds %+v", it)
	}
	if it := *tb.at(tb.ref(50)); it != (item[val]{val: val{next: tb.ref(5)}}) {
		t.Errorf("the item removed last holds %+v, want only a link to the first", it)
	}
	for i := range 2 {
		if v := tb.Put(hashOf(uint32(100+i), 0), fmt.Sprint(100+i)); *v != (val{}) {
			t.Fatalf("Put into a removed place gave %+v, not a zero value", *v)
		}
	}
	for i := range 100 {
		if it := tb.at(tb.ref(i)); it.key == "" {
			t.Errorf("item %d is empty: %+v", i, *it)
		}
	}
	if len(tb.pages) != 2 || len(tb.pages[0]) != 64 || tb.free != 0 {
		t.Errorf("%d pages for 100 keys, the first of %d, free %d: want 2, the first full, none free", len(tb.pages), len(tb.pages[0]), tb.free)
	}
}

// TestPages checks that the first page starts at minPage and doubles up to
// the page size New was given, and that the pages after it hold that many.
func TestPages(t *testing.T) {
	for _, shift := range []int{3, 6, 10} {
		tb := New[val](shift)
		size := 1 << shift
		for n := 1; n <= 3*size+1; n++ {
			tb.Put(hashOf(uint32(n), 0), fmt.Sprint(n))
			first := minPage
			for first < n && first < size {
				first *= 2
			}
			if got := len(tb.pages[0]); got != first {
				t.Fatalf("shift %d, %d keys: the first page holds %d, want %d", shift, n, got, first)
			}
			if want := (n-1)/size + 1; len(tb.pages) != want {
				t.Fatalf("shift %d, %d keys: %d pages, want %d", shift, n, len(tb.pages), want)
			}
			for p, page := range tb.pages[1:] {
				if len(page) != size {
					t.Fatalf("shift %d, %d keys: page %d holds %d, want %d", shift, n, p+1, len(page), size)
				}
			}
		}
	}
}

// TestPackGivesMemoryBack fills a table, forgets most of its keys, and
// packs it: the slots shrink to at most half full and the pages to what
// the rest needs, and the keys left stay found. Until then a forgotten
// key's place goes to the next key, and the table does not grow.
func TestPackGivesMemoryBack(t *testing.T) {
	tb := New[val](10)
	for i := range 10_000 {
		tb.Put(hashOf(uint32(i), 0), fmt.Sprint(i)).id = i
	}
	if len(tb.slots) != 16384 || len(tb.pages) != 10 {
		t.Fatalf("10000 keys in %d slots and %d pages, want 16384 and 10", len(tb.slots), len(tb.pages))
	}
	tb.RemoveIf(func(k string, v *val) bool { return v.id >= 10 })
	for i := range 5000 {
		tb.Put(hashOf(uint32(20_000+i), 0), fmt.Sprint("again", i))
	}
	if len(tb.slots) != 16384 || len(tb.pages) != 10 {
		t.Errorf("after reusing forgotten places: %d slots and %d pages, want 16384 and 10", len(tb.slots), len(tb.pages))
	}
	for i := range 5000 {
		tb.Remove(hashOf(uint32(20_000+i), 0), fmt.Sprint("again", i))
	}
	tb.Pack()
	if tb.Len() != 10 || len(tb.slots) != 32 || len(tb.pages) != 1 || len(tb.pages[0]) != 16 || tb.free != 0 {
		t.Fatalf("packed: %d keys in %d slots and %d pages, the first of %d, %d free; want 10 in 32 slots and 1 page of 16, none free",
			tb.Len(), len(tb.slots), len(tb.pages), len(tb.pages[0]), tb.free)
	}
	for i := range 10 {
		if v := tb.Get(hashOf(uint32(i), 0), fmt.Sprint(i)); v == nil || v.id != i {
			t.Errorf("key %d lost in the pack: %+v", i, v)
		}
	}
	tb.RemoveIf(func(string, *val) bool { return true })
	tb.Pack()
	if tb.Len() != 0 || len(tb.slots) != minSlots || len(tb.pages) != 0 {
		t.Fatalf("packed empty: %d keys in %d slots and %d pages, want 0 in %d slots and no page", tb.Len(), len(tb.slots), len(tb.pages), minSlots)
	}
}

// TestCap checks that a table holds Cap keys in its slots and doubles them
// at the next.
func TestCap(t *testing.T) {
	tb := New[val](6)
	for i := range 1000 {
		c := tb.Cap()
		tb.Put(hashOf(uint32(i), 0), fmt.Sprint(i))
		if grew := tb.Cap() != c; grew != (i == c) {
			t.Fatalf("key %d: room for %d, then %d", i+1, c, tb.Cap())
		}
		if tb.Cap() != len(tb.slots)*7/8 {
			t.Fatalf("%d slots: Cap %d, want seven eighths", len(tb.slots), tb.Cap())
		}
	}
}

// TestItemSize checks that an item takes its key's string and its value,
// and nothing more: every byte is a byte on every key.
func TestItemSize(t *testing.T) {
	type v80 struct{ a [10]int64 }
	if got, want := unsafe.Sizeof(item[v80]{}), unsafe.Sizeof("")+unsafe.Sizeof(v80{}); got != want {
		t.Fatalf("an item of a value of 80 bytes takes %d, want %d", got, want)
	}
}
