package session

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvfeed/nvfeed/loader"
)

type metrics struct {
	samples, bytes, batches, errors *prometheus.CounterVec
	failed                          *prometheus.CounterVec // per dataset and backend: kept after sessions end
	readSeconds                     *prometheus.HistogramVec
	sessions                        prometheus.Gauge
}

var sessionLabels = []string{"dataset", "backend", "session"}

func newMetrics(reg *prometheus.Registry, mgr *Manager) *metrics {
	m := &metrics{
		samples: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_samples_total", Help: "Samples delivered."}, sessionLabels),
		bytes:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_bytes_total", Help: "Sample bytes delivered."}, sessionLabels),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_batches_total", Help: "Batches delivered."}, sessionLabels),
		errors:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_errors_total", Help: "Failed samples and batches."}, sessionLabels),
		readSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nvfeed_batch_read_seconds", Help: "Time to read one batch.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"dataset", "backend"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_failed_samples_total", Help: "Samples that could not be read, by dataset and backend."},
			[]string{"dataset", "backend"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvfeed_sessions", Help: "Open sessions."}),
	}
	reg.MustRegister(m.samples, m.bytes, m.batches, m.errors, m.readSeconds, m.failed, m.sessions, &backendCollector{m: mgr})
	return m
}

func (m *metrics) observe(ss *session, b *loader.Batch) {
	var bytes int64
	for _, n := range b.Lengths {
		bytes += n
	}
	lv := []string{ss.dataset, ss.backend, ss.id}
	m.samples.WithLabelValues(lv...).Add(float64(b.Len()))
	m.bytes.WithLabelValues(lv...).Add(float64(bytes))
	m.batches.WithLabelValues(lv...).Inc()
	if len(b.Errors) > 0 {
		m.errors.WithLabelValues(lv...).Add(float64(len(b.Errors)))
		m.failed.WithLabelValues(ss.dataset, ss.backend).Add(float64(len(b.Errors)))
	}
	m.readSeconds.WithLabelValues(ss.dataset, ss.backend).Observe(b.ReadTime().Seconds())
}

func (m *metrics) forget(ss *session) {
	l := prometheus.Labels{"session": ss.id}
	for _, v := range []*prometheus.CounterVec{m.samples, m.bytes, m.batches, m.errors} {
		v.DeletePartialMatch(l)
	}
}

// backendCollector exports each session's backend counters (cache hits,
// stale and filesystem-only samples, …) as gauges.
type backendCollector struct{ m *Manager }

var backendDesc = prometheus.NewDesc("nvfeed_backend", "Backend counters by session (cache_hits, cache_misses, stale_samples, fs_only_samples, requests, peak_in_flight, …).",
	[]string{"dataset", "backend", "session", "counter"}, nil)

// Describe sends the one descriptor.
func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) { ch <- backendDesc }

// Collect sends every open session's backend counters.
func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	for _, ss := range c.m.snapshot() {
		for _, ctr := range ss.l.Backend().Stats().Counters() {
			ch <- prometheus.MustNewConstMetric(backendDesc, prometheus.GaugeValue, float64(ctr.Value), ss.dataset, ss.backend, ss.id, ctr.Name)
		}
	}
}
