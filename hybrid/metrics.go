package hybrid

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the collectors of one Limiter. Labels are limit, outcome
// and source only: never a key, whose cardinality is unbounded.
type metrics struct {
	decisions      *prometheus.CounterVec
	redisCommands  *prometheus.CounterVec
	redisErrors    *prometheus.CounterVec
	leasesGranted  *prometheus.CounterVec
	leasesReleased *prometheus.CounterVec
	leasesExpired  *prometheus.CounterVec
	leasedRate     *prometheus.GaugeVec
	contendedKeys  *prometheus.GaugeVec
	degraded       *prometheus.GaugeVec
	peers          prometheus.Gauge
	renewal        prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hybridlimit_decisions_total",
			Help: "Decisions made, by limit, outcome (allowed or denied) and source (lease, local, global, fail_open, fail_closed). A limit in shadow mode counts the outcome it decided, though it admits every request.",
		}, []string{"limit", "outcome", "source"}),
		redisCommands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hybridlimit_redis_commands_total",
			Help: "Redis commands sent, by limit.",
		}, []string{"limit"}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hybridlimit_redis_errors_total",
			Help: "Redis commands that failed, by limit.",
		}, []string{"limit"}),
		leasesGranted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hybridlimit_leases_granted_total",
			Help: "Rate leases granted or renewed, by limit.",
		}, []string{"limit"}),
		leasesReleased: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hybridlimit_leases_released_total",
			Help: "Rate leases released (idle keys and Close), by limit.",
		}, []string{"limit"}),
		leasesExpired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hybridlimit_leases_expired_total",
			Help: "Rate leases that ran out before they could be renewed, by limit.",
		}, []string{"limit"}),
		leasedRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hybridlimit_leased_rate",
			Help: "Sum of the rates (tokens per second) leased by this instance, by limit.",
		}, []string{"limit"}),
		contendedKeys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hybridlimit_contended_keys",
			Help: "Keys whose instances want more than the limit together, by limit.",
		}, []string{"limit"}),
		degraded: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hybridlimit_degraded",
			Help: "1 while the limit runs on its outage policy because Redis is unreachable, 0 when normal.",
		}, []string{"limit"}),
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
		m.leasesReleased, m.leasesExpired, m.leasedRate, m.contendedKeys, m.degraded, m.peers, m.renewal} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// limitMetrics are the children of one limit, resolved once so that the hot
// path only increments.
type limitMetrics struct {
	decisions      [numSources][2]prometheus.Counter // [source][allowed]
	redisCommands  prometheus.Counter
	redisErrors    prometheus.Counter
	leasesGranted  prometheus.Counter
	leasesReleased prometheus.Counter
	leasesExpired  prometheus.Counter
	leasedRate     prometheus.Gauge
	contendedKeys  prometheus.Gauge
	degraded       prometheus.Gauge
}

func (m *metrics) forLimit(name string) *limitMetrics {
	lm := &limitMetrics{
		redisCommands:  m.redisCommands.WithLabelValues(name),
		redisErrors:    m.redisErrors.WithLabelValues(name),
		leasesGranted:  m.leasesGranted.WithLabelValues(name),
		leasesReleased: m.leasesReleased.WithLabelValues(name),
		leasesExpired:  m.leasesExpired.WithLabelValues(name),
		leasedRate:     m.leasedRate.WithLabelValues(name),
		contendedKeys:  m.contendedKeys.WithLabelValues(name),
		degraded:       m.degraded.WithLabelValues(name),
	}
	for s := SourceLease; int(s) < numSources; s++ {
		lm.decisions[s][0] = m.decisions.WithLabelValues(name, "denied", s.String())
		lm.decisions[s][1] = m.decisions.WithLabelValues(name, "allowed", s.String())
	}
	return lm
}

// forget deletes the children of the named limit from every collector: the
// limit was removed, and its gauges must not linger at their last values.
func (m *metrics) forget(name string) {
	labels := prometheus.Labels{"limit": name}
	m.decisions.DeletePartialMatch(labels)
	for _, v := range []*prometheus.CounterVec{m.redisCommands, m.redisErrors, m.leasesGranted, m.leasesReleased, m.leasesExpired} {
		v.DeletePartialMatch(labels)
	}
	for _, v := range []*prometheus.GaugeVec{m.leasedRate, m.contendedKeys, m.degraded} {
		v.DeletePartialMatch(labels)
	}
}
