package global_test

import (
	"context"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestLeaseScriptGolden runs lease.lua on a clock of its own (server TIME
// replaced by two more arguments) through one key's history, and checks
// every reply, the stored hash and its TTL against values worked out by
// hand: the record formats, released markers, "born", the cleanup of dead
// fields and the key's expiry are part of what the script promises.
func TestLeaseScriptGolden(t *testing.T) {
	src, err := os.ReadFile("lease.lua")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(src), "redis.call('TIME')") != 1 {
		t.Fatal("lease.lua: want exactly one redis.call('TIME') to replace")
	}
	script := redis.NewScript(strings.Replace(string(src), "redis.call('TIME')", "{ARGV[9], ARGV[10]}", 1))
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	const key = "golden"
	// The hash as an older version left it, 1s after it was born: live
	// lease c in the three-field format; f, whose grant has ended but
	// which said it runs 2 until 1003000000; junk; an ended marker.
	if err := rdb.HSet(ctx, key, "born", "999000000", "i:c", "2 2 1004000000",
		"i:f", "1 3 999900000 2 1003000000", "i:x", "bad", "r:e", "999500000").Err(); err != nil {
		t.Fatal(err)
	}
	// Rate 10, TTL 10s, cold 5s: the key is young until 1004000000.
	steps := []struct {
		atMS int64  // server time, ms after 1000000000 us
		args string // instance want n running running_us
		want string // the reply
		hash string // the hash after, sorted fields
		ttl  int64  // PTTL after, ms (-2: no key)
	}{
		// Young: c and one unasked instance (at 10/3) beside a's 4; f's
		// 2 counts against the rate, its want does not.
		{0, "a 4 3 0 0", "4 4 9.3333333333333339 0 1010000000",
			"born=999000000 i:a=4 4 1010000000 i:c=2 2 1004000000 i:f=1 3 999900000 2 1003000000", 10000},
		// A release while young is remembered until the key is no longer.
		{500, "d 0 3 0 0", "0 0 6 0 1000500000",
			"born=999000000 i:a=4 4 1010000000 i:c=2 2 1004000000 i:f=1 3 999900000 2 1003000000 r:d=1004000000", 9500},
		// Contended: level 4, but only 2 is free.
		{1000, "b 9 4 0 0", "2 4 15 1 1011000000",
			"born=999000000 i:a=4 4 1010000000 i:b=2 9 1011000000 i:c=2 2 1004000000 i:f=1 3 999900000 2 1003000000 r:d=1004000000", 10000},
		// a shrinks to 1 but runs 4 until 1010000000: five fields.
		{2000, "a 1 4 4 8000000", "1 1 12 1 1012000000",
			"born=999000000 i:a=1 1 1012000000 4 1010000000 i:b=2 9 1011000000 i:c=2 2 1004000000 i:f=1 3 999900000 2 1003000000 r:d=1004000000", 10000},
		// f has ended; b's fair share is 7, but a may still run 4 and c 2.
		{3000, "b 9 4 2 8000000", "4 7 12 1 1013000000",
			"born=999000000 i:a=1 1 1012000000 4 1010000000 i:b=4 9 1013000000 2 1011000000 i:c=2 2 1004000000 r:d=1004000000", 10000},
		// No longer young, to the microsecond: c and the marker are gone;
		// uncontended, b gets its want plus half of what nobody wants (7),
		// capped by a's 4.
		{4000, "b 5 2 4 5000000", "6 7 6 0 1014000000",
			"born=999000000 i:a=1 1 1012000000 4 1010000000 i:b=6 5 1014000000 4 1009000000", 10000},
		// A release, no longer young: no marker.
		{7000, "a 0 2 0 0", "0 0 5 0 1007000000",
			"born=999000000 i:b=6 5 1014000000 4 1009000000", 7000},
		// The last lease released: the key goes.
		{8000, "b 0 2 0 0", "0 0 0 0 1008000000", "", -2},
	}
	for i, s := range steps {
		a := strings.Fields(s.args)
		now := 1_000_000_000 + s.atMS*1000
		v, err := script.Run(ctx, rdb, []string{key}, a[0], a[1], "10", a[2], "10000000", "5000000", a[3], a[4],
			strconv.FormatInt(now/1_000_000, 10), strconv.FormatInt(now%1_000_000, 10)).StringSlice()
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, s.args, err)
		}
		if got := strings.Join(v, " "); got != s.want {
			t.Errorf("step %d (%s): reply %q, want %q", i, s.args, got, s.want)
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
