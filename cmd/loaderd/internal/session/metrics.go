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
	memory                          *prometheus.GaugeVec // batch memory per session, by kind and GPU path
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
		memory: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nvfeed_batch_memory_bytes",
			Help: "Batch memory allocated per session: kind pinned or gpu, the GPU, and for gpu the path in (cufile or bounce)."},
			[]string{"dataset", "backend", "session", "kind", "device", "gpu_path"}),
	}
	reg.MustRegister(m.samples, m.bytes, m.batches, m.errors, m.readSeconds, m.failed, m.sessions, m.memory, &backendCollector{m: mgr})
	return m
}

// sessionMetrics are one session's series, looked up once at open
// rather than by labels for every batch.
type sessionMetrics struct {
	samples, bytes, batches, errors, failed prometheus.Counter
	readSeconds                             prometheus.Observer
}

func (m *metrics) forSession(dataset, backend, id string) sessionMetrics {
	lv := []string{dataset, backend, id}
	return sessionMetrics{samples: m.samples.WithLabelValues(lv...), bytes: m.bytes.WithLabelValues(lv...),
		batches: m.batches.WithLabelValues(lv...), errors: m.errors.WithLabelValues(lv...),
		failed: m.failed.WithLabelValues(dataset, backend), readSeconds: m.readSeconds.WithLabelValues(dataset, backend)}
}

func (sm *sessionMetrics) observe(b *loader.Batch) {
	var bytes int64
	for _, n := range b.Lengths {
		bytes += n
	}
	sm.samples.Add(float64(b.Len()))
	sm.bytes.Add(float64(bytes))
	sm.batches.Inc()
	if len(b.Errors) > 0 {
		sm.errors.Add(float64(len(b.Errors)))
		sm.failed.Add(float64(len(b.Errors)))
	}
	sm.readSeconds.Observe(b.ReadTime().Seconds())
}

func (m *metrics) forget(ss *session) {
	l := prometheus.Labels{"session": ss.id}
	for _, v := range []*prometheus.CounterVec{m.samples, m.bytes, m.batches, m.errors} {
		v.DeletePartialMatch(l)
	}
	m.memory.DeletePartialMatch(l)
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
