package global_test

import (
	"math"
	"testing"
	"time"

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
