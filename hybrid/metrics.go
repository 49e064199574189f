package hybrid

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit/local"
)

// metrics holds the collectors of one Limiter. Labels are limit, outcome
// and source only: never a key, whose cardinality is unbounded.
type metrics struct {
	decisions      *decisionsCollector
	redisCommands  *prometheus.CounterVec
	redisErrors    *prometheus.CounterVec
	leasesGranted  *prometheus.CounterVec
	leasesReleased *prometheus.CounterVec
	leasesExpired  *prometheus.CounterVec
	leasedRate     *prometheus.GaugeVec
	contendedKeys  *prometheus.GaugeVec
	degraded       *prometheus.GaugeVec
	disagreeing    *prometheus.GaugeVec
	peers          prometheus.Gauge
	renewal        prometheus.Histogram
}

// byLimitCounter and byLimitGauge are metrics labelled by limit alone.
func byLimitCounter(name, help string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"limit"})
}

func byLimitGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"limit"})
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: &decisionsCollector{
			desc: prometheus.NewDesc("hybridlimit_decisions_total",
				"Decisions made, by limit, outcome (allowed, denied, or exceeds_burst: a cost that can never be admitted) and source (lease, local, global, exact, fail_open, fail_closed). A limit in shadow mode counts the outcome it decided, though it admits every request.",
				[]string{"limit", "outcome", "source"}, nil),
			limits: make(map[string]*decisionCounts),
		},
		redisCommands: byLimitCounter("hybridlimit_redis_commands_total",
			"Redis commands sent, by limit."),
		redisErrors: byLimitCounter("hybridlimit_redis_errors_total",
			"Redis commands that failed, by limit."),
		leasesGranted: byLimitCounter("hybridlimit_leases_granted_total",
			"Rate leases granted or renewed, by limit."),
		leasesReleased: byLimitCounter("hybridlimit_leases_released_total",
			"Rate leases released (idle keys and Close), by limit."),
		leasesExpired: byLimitCounter("hybridlimit_leases_expired_total",
			"Rate leases that ran out before they could be renewed, by limit."),
		leasedRate: byLimitGauge("hybridlimit_leased_rate",
			"Sum of the rates (tokens per second) leased by this instance, by limit."),
		contendedKeys: byLimitGauge("hybridlimit_contended_keys",
			"Keys whose instances want more than the limit together, by limit."),
		degraded: byLimitGauge("hybridlimit_degraded",
			"1 while the limit runs on its outage policy because Redis is unreachable, 0 when normal."),
		disagreeing: byLimitGauge("hybridlimit_limit_disagreeing_instances",
			"Other live instances that run the limit at another rate, burst or mode, as last compared in Redis (every 5 s), by limit."),
		peers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hybridlimit_peers",
			Help: "Live instance count N, self included.",
		}),
		renewal: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hybridlimit_renewal_duration_seconds",
			Help:    "Duration of one lease renewal round trip.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.decisions, m.redisCommands, m.redisErrors, m.leasesGranted,
		m.leasesReleased, m.leasesExpired, m.leasedRate, m.contendedKeys, m.degraded, m.disagreeing, m.peers, m.renewal} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// limitMetrics are the children of one limit, resolved once so that the hot
// path only increments.
type limitMetrics struct {
	decisions      *decisionCounts
	redisCommands  prometheus.Counter
	redisErrors    prometheus.Counter
	leasesGranted  prometheus.Counter
	leasesReleased prometheus.Counter
	leasesExpired  prometheus.Counter
	leasedRate     prometheus.Gauge
	contendedKeys  prometheus.Gauge
	degraded       prometheus.Gauge
	disagreeing    prometheus.Gauge
}

// forLimit returns the children of the named limit, whose decisions in
// process loc and keys count.
func (m *metrics) forLimit(name string, loc, keys *local.Limiter) *limitMetrics {
	lm := &limitMetrics{
		decisions:      m.decisions.add(name, loc, keys),
		redisCommands:  m.redisCommands.WithLabelValues(name),
		redisErrors:    m.redisErrors.WithLabelValues(name),
		leasesGranted:  m.leasesGranted.WithLabelValues(name),
		leasesReleased: m.leasesReleased.WithLabelValues(name),
		leasesExpired:  m.leasesExpired.WithLabelValues(name),
		leasedRate:     m.leasedRate.WithLabelValues(name),
		contendedKeys:  m.contendedKeys.WithLabelValues(name),
		degraded:       m.degraded.WithLabelValues(name),
		disagreeing:    m.disagreeing.WithLabelValues(name),
	}
	return lm
}

// forget deletes the children of the named limit from every collector: the
// limit was removed, and its gauges must not linger at their last values.
func (m *metrics) forget(name string) {
	labels := prometheus.Labels{"limit": name}
	m.decisions.remove(name)
	for _, v := range []*prometheus.CounterVec{m.redisCommands, m.redisErrors, m.leasesGranted, m.leasesReleased, m.leasesExpired} {
		v.DeletePartialMatch(labels)
	}
	for _, v := range []*prometheus.GaugeVec{m.leasedRate, m.contendedKeys, m.degraded, m.disagreeing} {
		v.DeletePartialMatch(labels)
	}
}

// decisionsCollector is hybridlimit_decisions_total. The decisions made in
// process (Local limits, Hybrid keys on a lease,
// FailLocal) are counted by each limit's local.Limiter, in the shard each
// decision locks anyway (see local.Tally), and summed here when the
// metrics are gathered: one counter that every decision increments would
// be a cache line that every core writes, which costs a parallel decision
// more than the rest of the counting. The other decisions (exact, Global,
// the outage policies, n above the burst) are counted in
// decisionCounts.out, an atomic each: they wait on Redis, or happen while
// it is down.
type decisionsCollector struct {
	desc *prometheus.Desc

	mu     sync.Mutex
	limits map[string]*decisionCounts // guarded by mu: by name, the limits in force
}

// decisionCounts are the decisions of one limit.
type decisionCounts struct {
	name string
	// loc and keys count the decisions made in process: Counts.Assigned
	// are those on a lease (source lease), Counts.Default the others
	// (source local).
	loc, keys *local.Limiter
	// out counts the decisions loc does not, by [source][outcome]:
	// denied, allowed, exceeds_burst.
	out [numSources][3]atomic.Uint64
}

// count counts one decision of source src that loc did not count.
func (c *decisionCounts) count(src Source, allowed bool) { c.out[src][b2i(allowed)].Add(1) }

// exceeds counts one request of source src above the burst.
func (c *decisionCounts) exceeds(src Source) { c.out[src][2].Add(1) }

// add starts the counts of the named limit, whose in-process decisions loc
// counts, replacing any of that name.
func (dc *decisionsCollector) add(name string, loc, keys *local.Limiter) *decisionCounts {
	c := &decisionCounts{name: name, loc: loc, keys: keys}
	dc.mu.Lock()
	dc.limits[name] = c
	dc.mu.Unlock()
	return c
}

// remove drops the counts of the named limit: it was removed.
func (dc *decisionsCollector) remove(name string) {
	dc.mu.Lock()
	delete(dc.limits, name)
	dc.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (dc *decisionsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- dc.desc }

// Collect implements prometheus.Collector: every (outcome, source) pair of
// every limit, zeros included.
func (dc *decisionsCollector) Collect(ch chan<- prometheus.Metric) {
	// The shards are read without dc.mu held: add and remove (SetLimits)
	// never wait for a gather.
	dc.mu.Lock()
	limits := make([]*decisionCounts, 0, len(dc.limits))
	for _, c := range dc.limits {
		limits = append(limits, c)
	}
	dc.mu.Unlock()
	for _, c := range limits {
		var v [numSources][3]uint64
		for s := range v {
			for o := range v[s] {
				v[s][o] = c.out[s][o].Load()
			}
		}
		for _, loc := range [2]*local.Limiter{c.loc, c.keys} {
			in := loc.Counts()
			v[SourceLocal][0] += in.DefaultDenied
			v[SourceLocal][1] += in.DefaultAllowed
			v[SourceLease][0] += in.AssignedDenied
			v[SourceLease][1] += in.AssignedAllowed
		}
		for s := SourceLease; int(s) < numSources; s++ {
			for o, outcome := range [3]string{"denied", "allowed", "exceeds_burst"} {
				ch <- prometheus.MustNewConstMetric(dc.desc, prometheus.CounterValue, float64(v[s][o]), c.name, outcome, s.String())
			}
		}
	}
}
