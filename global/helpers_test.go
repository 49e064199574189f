package global_test

import (
	"context"
	"math"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hybridlimit/hybridlimit/global"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// noNetwork is a Rediser whose every method panics: a Store built on it
// proves that a call never reaches the network.
type noNetwork struct{ global.Rediser }

func nan() float64 { return math.NaN() }
func inf() float64 { return math.Inf(1) }

// waitFor polls cond until it holds, failing the test after 5 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
}

// leaseField is one instance's lease as stored in the hash.
type leaseField struct {
	granted, want float64
	expiryUS      int64
}

// readLeases reads the lease hash at key back from Redis and parses it.
func readLeases(t *testing.T, rdb *redis.Client, key string) map[string]leaseField {
	t.Helper()
	h, err := rdb.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("HGETALL %s: %v", key, err)
	}
	out := make(map[string]leaseField, len(h))
	for id, v := range h {
		if id == "born" || strings.HasPrefix(id, "r:") {
			continue // the key's birth, and recent releases
		}
		if !strings.HasPrefix(id, "i:") {
			t.Fatalf("lease hash field %q: want born, r:<instance> or i:<instance>", id)
		}
		id = strings.TrimPrefix(id, "i:")
		f := strings.Fields(v)
		if len(f) != 3 {
			t.Fatalf("lease field %s = %q, want 3 fields", id, v)
		}
		g, err1 := strconv.ParseFloat(f[0], 64)
		w, err2 := strconv.ParseFloat(f[1], 64)
		e, err3 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("lease field %s = %q: %v %v %v", id, v, err1, err2, err3)
		}
		out[id] = leaseField{g, w, e}
	}
	return out
}

// checkSum fails the test if the grants stored at key add up to more than
// rate. Right after a script run every stored lease is live, so this is the
// lease invariant. The tolerance covers only floating-point rounding.
func checkSum(t *testing.T, rdb *redis.Client, key string, rate float64, when string) {
	t.Helper()
	sum := 0.0
	for _, l := range readLeases(t, rdb, key) {
		if l.granted < 0 {
			t.Fatalf("%s: negative grant %v", when, l.granted)
		}
		sum += l.granted
	}
	if sum > rate*(1+1e-12)+1e-12 {
		t.Fatalf("%s: sum of live grants %v exceeds rate %v", when, sum, rate)
	}
}

// waterFill is the reference max-min fair split of rate over wants.
func waterFill(rate float64, wants []float64) []float64 {
	idx := make([]int, len(wants))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return wants[idx[a]] < wants[idx[b]] })
	alloc := make([]float64, len(wants))
	left := rate
	for k, i := range idx {
		share := left / float64(len(idx)-k)
		if wants[i] > share {
			for _, j := range idx[k:] {
				alloc[j] = share
			}
			break
		}
		alloc[i] = wants[i]
		left -= wants[i]
	}
	return alloc
}

// fairSplit is what the lease script grants each of n instances with the
// given wants once every instance has renewed: the max-min fair split when
// the wants exceed rate; otherwise each want, plus an n-th of what nobody
// wants once the key is no longer young (while it is, that share only up to
// rate/n). A want of 0 (a release) is granted 0.
func fairSplit(rate float64, wants []float64, n int, young bool) []float64 {
	sum := 0.0
	for _, w := range wants {
		sum += w
	}
	if sum > rate {
		return waterFill(rate, wants)
	}
	out := make([]float64, len(wants))
	for i, w := range wants {
		switch {
		case w > 0 && young:
			out[i] = max(w, min(rate/float64(n), w+(rate-sum)/float64(max(n, len(wants)))))
		case w > 0:
			out[i] = w + (rate-sum)/float64(max(n, len(wants)))
		}
	}
	return out
}

func approx(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// eventually polls cond every 5ms until it holds, failing the test after 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}
