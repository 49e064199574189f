package global_test

import (
	"context"
	"errors"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestLeaseScriptGolden runs lease.lua (after records.lua, as Store does)
// on a clock of its own (server TIME replaced by two more arguments)
// through one key's history, and checks every reply, the stored hash and
// its TTL against values worked out by hand: the record formats, the
// cleanup of dead fields and of version 1's "born" and "r:" fields, the
// counting of unrecorded instances and exact users, yields, releases, lost
// state and the key's expiry are part of what the script promises.
func TestLeaseScriptGolden(t *testing.T) {
	records, err1 := os.ReadFile("records.lua")
	src, err2 := os.ReadFile("lease.lua")
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(src), "redis.call('TIME')") != 1 {
		t.Fatal("lease.lua: want exactly one redis.call('TIME') to replace")
	}
	script := redis.NewScript(string(records) + "\n" +
		strings.Replace(string(src), "redis.call('TIME')", "{ARGV[15], ARGV[16]}", 1))
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	const key = "golden"
	// The hash as version 1 left it, 1s after it was born, with an exact
	// user: live lease c in the three-field format; f, whose grant has
	// ended but which said it runs 2 until 1003000000; junk; an ended
	// marker; exact user e until 1005000000.
	if err := rdb.HSet(ctx, key, "born", "999000000", "i:c", "2 2 1004000000",
		"i:f", "1 3 999900000 2 1003000000", "i:x", "bad", "r:e", "999500000",
		"x:e", "1005000000").Err(); err != nil {
		t.Fatal(err)
	}
	// Rate 10, TTL 10s, MaxTTL 20s; N-hat 5 (default share 2) until step 9.
	steps := []struct {
		atMS  int64  // server time, ms after 1000000000 us
		flush bool   // delete the key first: Redis lost its state
		args  string // instance want n running running_us yield held
		want  string // the reply
		hash  string // the hash after, sorted fields
		ttl   int64  // PTTL after, ms (-2: no key)
	}{
		// c, f's claim, exact user e and one unrecorded instance (at 2)
		// are counted: 8 of 10, so a gets 2 of its fair 4.
		{0, false, "a 4 5 0 0 0 0", "2 4 10 0 1010000000 0",
			"i:a=2 4 1010000000 i:c=2 2 1004000000 i:f=1 3 999900000 2 1003000000 x:e=1005000000", 10000},
		// The unrecorded instance asks for 0.5 and gets that: while an
		// instance decides the key exactly (e), the pool takes up what
		// nobody wants (without e, d would get its default share 2).
		{500, false, "d 0.5 5 0 0 0 0", "0.5 0.5 8.5 0 1010500000 0",
			"i:a=2 4 1010000000 i:c=2 2 1004000000 i:d=0.5 0.5 1010500000 i:f=1 3 999900000 2 1003000000 x:e=1005000000", 10000},
		// c yields everything: a record granted 0, counted at the 2 it
		// runs for another second.
		{1000, false, "c 0 5 2 1000000 1 1", "0 0 6.5 0 1011000000 0",
			"i:a=2 4 1010000000 i:c=0 0 1011000000 2 1002000000 i:d=0.5 0.5 1010500000 i:f=1 3 999900000 2 1003000000 x:e=1005000000", 10000},
		// f has ended, c's claim too: contended, b's level is 3.75, and 4
		// is free.
		{3000, false, "b 9 5 0 0 0 0", "3.75 3.75 15.5 1 1013000000 0",
			"i:a=2 4 1010000000 i:b=3.75 9 1013000000 i:c=0 0 1011000000 2 1002000000 i:d=0.5 0.5 1010500000 x:e=1005000000", 10000},
		// a runs 2 for 6s more and gets what is left, its level 3.75:
		// five fields.
		{4000, false, "a 4 5 2 6000000 0 1", "3.75 3.75 15.5 1 1014000000 0",
			"i:a=3.75 4 1014000000 2 1010000000 i:b=3.75 9 1013000000 i:c=0 0 1011000000 2 1002000000 i:d=0.5 0.5 1010500000 x:e=1005000000", 10000},
		// e has ended, to the microsecond. d releases a record below its
		// default share: a's and b's grants, above theirs, counted it
		// lower, so it may run that share only once they have ended.
		{5000, false, "d 0 5 0 0 0 0", "0 0 15 1 1014000000 0",
			"i:a=3.75 4 1014000000 2 1010000000 i:b=3.75 9 1013000000 i:c=0 0 1011000000 2 1002000000 w:d=1014000000", 9000},
		// c releases a record of 0: a's and b's grants counted it at 0, so
		// it may run its default share only once they have ended, which
		// its "w:" record keeps (an exact record it takes before then
		// keeps it too).
		{5500, false, "c 0 5 0 0 0 0", "0 0 17 1 1014000000 0",
			"i:a=3.75 4 1014000000 2 1010000000 i:b=3.75 9 1013000000 w:c=1014000000 w:d=1014000000", 8500},
		// Redis lost everything; a says it holds a grant, running 1: lost
		// until MaxTTL from now, and a may not grow beyond 1.
		{6000, true, "a 4 5 1 4000000 0 1", "1 2 12 1 1016000000 1",
			"i:a=1 4 1016000000 1 1010000000 lost=1026000000", 20000},
		// While lost, b, which runs nothing, is granted nothing.
		{7000, false, "b 9 5 0 0 0 0", "0 2 19 1 1017000000 1",
			"i:a=1 4 1016000000 1 1010000000 i:b=0 9 1017000000 lost=1026000000", 19000},
		// Lost has ended, and every lease: a alone (N-hat 1) gets it all.
		{26000, false, "a 4 1 0 0 0 0", "10 10 4 0 1036000000 0",
			"i:a=10 4 1036000000", 10000},
		// The last lease released: the key goes.
		{27000, false, "a 0 1 0 0 0 0", "0 0 0 0 1027000000 0", "", -2},
	}
	// How many instances each step counted without a record: n minus the
	// asker minus the others with a live record.
	unrecorded := []int{1, 0, 0, 0, 0, 1, 2, 4, 3, 0, 0}
	for i, s := range steps {
		if s.flush {
			if err := rdb.Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
		}
		a := strings.Fields(s.args)
		now := 1_000_000_000 + s.atMS*1000
		v, err := script.Run(ctx, rdb, []string{key}, a[0], a[1], "10", a[2], "10000000", a[3], a[4], a[5], a[6], "20000000", "0", "0", "0", "",
			strconv.FormatInt(now/1_000_000, 10), strconv.FormatInt(now%1_000_000, 10)).StringSlice()
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, s.args, err)
		}
		// The reply ends with the expiry as a span from now and the count
		// of unrecorded instances, which unrec lists step by step.
		if len(v) != 10 || v[9] != "-1" {
			t.Fatalf("step %d (%s): reply %q has %d fields, want 10 ending in -1 (no burst given)", i, s.args, v, len(v))
		}
		if got := strings.Join(v[:6], " "); got != s.want {
			t.Errorf("step %d (%s): reply %q, want %q", i, s.args, got, s.want)
		}
		expiry, _ := strconv.ParseInt(v[4], 10, 64)
		if in := strconv.FormatInt(expiry-now, 10); v[6] != in {
			t.Errorf("step %d (%s): in %s, want %s (expiry - now)", i, s.args, v[6], in)
		}
		if unrec := strconv.Itoa(unrecorded[i]); v[7] != unrec {
			t.Errorf("step %d (%s): unrecorded %s, want %s", i, s.args, v[7], unrec)
		}
		h, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		var fields []string
		for f, v := range h {
			fields = append(fields, f+"="+v)
		}
		sort.Strings(fields)
		if got := strings.Join(fields, " "); got != s.hash {
			t.Errorf("step %d (%s): hash\n%s\nwant\n%s", i, s.args, got, s.hash)
		}
		// PEXPIRE is relative: the key lives as long on the real clock.
		ttl, err := rdb.PTTL(ctx, key).Result()
		want := time.Duration(s.ttl) * time.Millisecond
		if s.ttl < 0 {
			want = time.Duration(s.ttl) // go-redis reports -2 for no key as is
		}
		if err != nil || ttl > want || (s.ttl >= 0 && ttl < want-time.Second) {
			t.Errorf("step %d (%s): PTTL %v, %v; want %v", i, s.args, ttl, err, want)
		}
	}
}
