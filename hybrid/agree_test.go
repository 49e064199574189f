package hybrid_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// Two instances that run one limit at different rates are told, through
// Redis: each logs the disagreement with both definitions and counts the
// other in hybridlimit_limit_disagreeing_instances, and says so again when
// they agree once more. A limit change is compared at once.
func TestInstancesThatDisagreeAreTold(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	var logs [2]records
	regs := [2]*prometheus.Registry{prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()}
	var inst [2]*hybrid.Limiter
	for i := range inst {
		l := lim
		l.Rate = float64(100 * (i + 1))
		inst[i] = newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Members: membership.NewStatic([]string{"a", "b"}[i], 2),
			Logger: slog.New(&logs[i]), Registerer: regs[i], Limits: []hybrid.Limit{l}})
	}
	disagreeing := func(i int) float64 {
		for _, m := range metricsNamed(t, regs[i], "hybridlimit_limit_disagreeing_instances") {
			return m.GetGauge().GetValue()
		}
		return -1
	}
	// Each compares at its first tick, and at once after a change: a
	// change of b's limit to what it is makes both compare now, whichever
	// started first.
	if err := inst[0].SetLimits([]hybrid.Limit{lim}); err != nil {
		t.Fatal(err)
	}
	l1 := lim
	l1.Rate = 200
	if err := inst[1].SetLimits([]hybrid.Limit{l1}); err != nil {
		t.Fatal(err)
	}
	// Each SetLimits makes the instance compare at its next tick: b's,
	// repeated, sees a's definition once a has written it.
	eventually(t, 5*time.Second, "b sees a at another rate", func() bool {
		if err := inst[1].SetLimits([]hybrid.Limit{l1}); err != nil {
			t.Fatal(err)
		}
		return disagreeing(1) == 1
	})
	warned := logs[1].logged("instances run a limit at different definitions")
	if len(warned) != 1 || warned[0]["definition"] != "rate=200 burst=10 mode=hybrid" ||
		!strings.Contains(warned[0]["others"], "a: rate=100 burst=10 mode=hybrid") {
		t.Errorf("b logged %v, want one warning with both definitions", warned)
	}
	// b back at a's rate: both agree, and b says so once.
	if err := inst[1].SetLimits([]hybrid.Limit{lim}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "b agrees again", func() bool { return disagreeing(1) == 0 })
	if n := len(logs[1].logged("instances agree on the limit again")); n != 1 {
		t.Errorf("b logged agreement %d times, want 1", n)
	}
	// a agrees too, then changes its burst: it is told at once, as the
	// one that differs.
	eventually(t, 5*time.Second, "a agrees again", func() bool {
		if err := inst[0].SetLimits([]hybrid.Limit{lim}); err != nil {
			t.Fatal(err)
		}
		return disagreeing(0) == 0
	})
	l0 := lim
	l0.Burst = 20
	if err := inst[0].SetLimits([]hybrid.Limit{l0}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a sees b at another burst", func() bool { return disagreeing(0) == 1 })
	if w := logs[0].logged("instances run a limit at different definitions"); len(w) == 0 || w[len(w)-1]["definition"] != "rate=100 burst=20 mode=hybrid" {
		t.Errorf("a logged %v, want a warning with its new definition last", w)
	}
}
