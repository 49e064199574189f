package hybrid_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// checkMetricNames checks the metric names and labels DESIGN.md promises:
// hybridlimit_ names, labels limit, outcome and source only, and no label
// value that carries a key (every key of these tests holds "secret").
func checkMetricNames(t *testing.T, reg *prometheus.Registry) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{"limit": true, "outcome": true, "source": true}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "hybridlimit_") {
			t.Errorf("metric %s lacks the hybridlimit_ prefix", f.GetName())
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if !allowed[lp.GetName()] || strings.Contains(lp.GetValue(), "secret") {
					t.Errorf("metric %s has label %s=%q", f.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
}

// TestMetricsNeverCarryAKey: names and labels as DESIGN.md promises, and
// decisions counted by outcome and source.
func TestMetricsNeverCarryAKey(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	l := newLimiter(t, hybrid.Config{Registerer: reg, Limits: []hybrid.Limit{
		{Name: "api", Rate: 1, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailOpen},
	}})
	ctx := context.Background()
	for range 3 {
		if _, err := l.Allow(ctx, "api", "secret-user-key"); err != nil {
			t.Fatal(err)
		}
	}
	// A cost above the burst is counted apart: a mistake, not a denial.
	if _, err := l.AllowN(ctx, "api", "secret-user-key", 3); !errors.Is(err, hybrid.ErrExceedsBurst) {
		t.Fatalf("AllowN(3) of burst 2: %v, want ErrExceedsBurst", err)
	}
	checkMetricNames(t, reg)
	// Every (outcome, source) pair exists from the start, at zero.
	want := `
# HELP hybridlimit_decisions_total Decisions made, by limit, outcome (allowed, denied, or exceeds_burst: a cost that can never be admitted) and source (lease, local, global, exact, fail_open, fail_closed). A limit in shadow mode counts the outcome it decided, though it admits every request.
# TYPE hybridlimit_decisions_total counter
hybridlimit_decisions_total{limit="api",outcome="allowed",source="exact"} 0
hybridlimit_decisions_total{limit="api",outcome="allowed",source="fail_closed"} 0
hybridlimit_decisions_total{limit="api",outcome="allowed",source="fail_open"} 0
hybridlimit_decisions_total{limit="api",outcome="allowed",source="global"} 0
hybridlimit_decisions_total{limit="api",outcome="allowed",source="lease"} 0
hybridlimit_decisions_total{limit="api",outcome="allowed",source="local"} 2
hybridlimit_decisions_total{limit="api",outcome="denied",source="exact"} 0
hybridlimit_decisions_total{limit="api",outcome="denied",source="fail_closed"} 0
hybridlimit_decisions_total{limit="api",outcome="denied",source="fail_open"} 0
hybridlimit_decisions_total{limit="api",outcome="denied",source="global"} 0
hybridlimit_decisions_total{limit="api",outcome="denied",source="lease"} 0
hybridlimit_decisions_total{limit="api",outcome="denied",source="local"} 1
hybridlimit_decisions_total{limit="api",outcome="exceeds_burst",source="exact"} 0
hybridlimit_decisions_total{limit="api",outcome="exceeds_burst",source="fail_closed"} 0
hybridlimit_decisions_total{limit="api",outcome="exceeds_burst",source="fail_open"} 0
hybridlimit_decisions_total{limit="api",outcome="exceeds_burst",source="global"} 0
hybridlimit_decisions_total{limit="api",outcome="exceeds_burst",source="lease"} 0
hybridlimit_decisions_total{limit="api",outcome="exceeds_burst",source="local"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hybridlimit_decisions_total"); err != nil {
		t.Error(err)
	}
	// A second Limiter on the same registry is a configuration error, not
	// a panic.
	if _, err := hybrid.New(hybrid.Config{Registerer: reg, Limits: []hybrid.Limit{
		{Name: "api", Rate: 1, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailOpen},
	}}); err == nil {
		t.Error("a second Limiter registered the same metrics")
	}
}

// TestRedisMetricsNeverCarryAKey: the metrics of Redis commands, errors and
// leases, with Hybrid and Global limits at work on a real Redis, through an
// outage and back, name no key either.
func TestRedisMetricsNeverCarryAKey(t *testing.T) {
	srv := redistest.Start(t)
	reg := prometheus.NewPedanticRegistry()
	l := newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Registerer: reg, Limits: []hybrid.Limit{
		{Name: "h", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailOpen},
		{Name: "g", Rate: 100, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailClosed},
	}})
	ctx := context.Background()
	allow := func() {
		t.Helper()
		for _, limit := range []string{"h", "g"} {
			if _, err := l.Allow(ctx, limit, "secret-user-key"); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, 5*time.Second, "a lease granted", func() bool {
		allow()
		// warmKey makes the Hybrid key worth a lease: its first
		// decisions are exact, and the next tick asks for one.
		warmKey(t, l, "h", "secret-user-key", 10)
		return counterSum(t, reg, "hybridlimit_leases_granted_total") > 0
	})
	srv.Kill(t)
	eventually(t, 5*time.Second, "Redis errors counted", func() bool {
		allow()
		return counterSum(t, reg, "hybridlimit_redis_errors_total") > 0
	})
	checkMetricNames(t, reg)
	if n := counterSum(t, reg, "hybridlimit_redis_commands_total"); n == 0 {
		t.Error("no Redis command counted")
	}
}
