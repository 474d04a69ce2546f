// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvfeed/nvfeed/loader"
)

// The metrics name no session: /metrics is open to every client of the
// daemon, and a session's id is what lets its owner drive it. Every
// series is per dataset and backend, summed over the sessions.
type metrics struct {
	samples, bytes, batches, errors *prometheus.CounterVec
	failed                          *prometheus.CounterVec // per dataset and backend: kept after sessions end
	readSeconds                     *prometheus.HistogramVec
	sessions                        prometheus.Gauge
	memory                          *prometheus.GaugeVec // batch memory of open sessions, by kind and GPU path
}

var sessionLabels = []string{"dataset", "backend"}

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
			Help: "Batch memory allocated by open sessions: kind pinned or gpu, the GPU, and for gpu the path in (cufile or bounce)."},
			[]string{"dataset", "backend", "kind", "device", "gpu_path"}),
	}
	reserved := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nvfeed_batch_memory_reserved_bytes",
		Help: "Batch memory reserved by open sessions, counted against the budget."},
		func() float64 { n, _ := mgr.Locked(); return float64(n) })
	budget := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nvfeed_batch_memory_budget_bytes",
		Help: "The daemon's budget of batch memory for all sessions together (--max-locked-mb)."},
		func() float64 { _, n := mgr.Locked(); return float64(n) })
	reg.MustRegister(m.samples, m.bytes, m.batches, m.errors, m.readSeconds, m.failed, m.sessions, m.memory, reserved, budget, &backendCollector{m: mgr})
	return m
}

// sessionMetrics are one session's series, looked up once at open
// rather than by labels for every batch.
type sessionMetrics struct {
	samples, bytes, batches, errors, failed prometheus.Counter
	readSeconds                             prometheus.Observer
	memory                                  prometheus.Gauge // its share: added at open, taken back at close
	memoryBytes                             float64
}

func (m *metrics) forSession(dataset, backend, kind string, device int, size int64, gpuPath string) sessionMetrics {
	lv := []string{dataset, backend}
	sm := sessionMetrics{samples: m.samples.WithLabelValues(lv...), bytes: m.bytes.WithLabelValues(lv...),
		batches: m.batches.WithLabelValues(lv...), errors: m.errors.WithLabelValues(lv...),
		failed: m.failed.WithLabelValues(dataset, backend), readSeconds: m.readSeconds.WithLabelValues(dataset, backend),
		memory: m.memory.WithLabelValues(dataset, backend, kind, fmt.Sprint(device), gpuPath), memoryBytes: float64(size)}
	sm.memory.Add(sm.memoryBytes)
	return sm
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

// forget takes a closed session's memory out of the gauge; its counts
// stay in the dataset's and backend's totals.
func (m *metrics) forget(ss *session) {
	ss.metrics.memory.Sub(ss.metrics.memoryBytes)
}

// backendCollector exports the open sessions' backend counters (cache
// hits, stale and filesystem-only samples, …) as gauges, summed per
// dataset and backend (peak_* counters: the largest).
type backendCollector struct{ m *Manager }

var backendDesc = prometheus.NewDesc("nvfeed_backend", "Backend counters of the open sessions by dataset and backend, summed (peak_*: the largest) (cache_hits, cache_misses, stale_samples, fs_only_samples, requests, peak_in_flight, …).",
	[]string{"dataset", "backend", "counter"}, nil)

// Describe sends the one descriptor.
func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) { ch <- backendDesc }

// Collect sends the open sessions' backend counters.
func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ dataset, backend, counter string }
	sums := map[key]float64{}
	for _, ss := range c.m.snapshot() {
		for _, ctr := range ss.l.Backend().Stats().Counters {
			k, v := key{ss.dataset, ss.backend, ctr.Name}, float64(ctr.Value)
			if strings.HasPrefix(ctr.Name, "peak") {
				sums[k] = max(sums[k], v)
			} else {
				sums[k] += v
			}
		}
	}
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(backendDesc, prometheus.GaugeValue, v, k.dataset, k.backend, k.counter)
	}
}
