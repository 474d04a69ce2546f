// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"

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
	backends                        backendCounts
}

// backendCounts are the backends' counters per dataset and backend.
// A session is in live until its close adds its counts to ended, so each is counted once.
type backendCounts struct {
	mu    sync.Mutex
	live  map[*session]struct{}  // under mu
	ended map[backendKey]float64 // under mu: the ended sessions' counts, summed (peak_*: the largest)
}

// backendKey names one series of nvfeed_backend.
type backendKey struct{ dataset, backend, counter string }

// add counts one session's backend counters into sums.
func addCounts(sums map[backendKey]float64, ss *session) {
	for _, ctr := range ss.l.Backend().Stats().Counters {
		k, v := backendKey{ss.dataset, ss.backend, ctr.Name}, float64(ctr.Value)
		if strings.HasPrefix(ctr.Name, "peak") {
			sums[k] = max(sums[k], v)
		} else {
			sums[k] += v
		}
	}
}

var sessionLabels = []string{"dataset", "backend"}

func newMetrics(reg *prometheus.Registry, mgr *Manager) *metrics {
	m := &metrics{
		backends: backendCounts{live: map[*session]struct{}{}, ended: map[backendKey]float64{}},
		samples:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_samples_total", Help: "Samples delivered."}, sessionLabels),
		bytes:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_bytes_total", Help: "Sample bytes delivered."}, sessionLabels),
		batches:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_batches_total", Help: "Batches delivered."}, sessionLabels),
		errors:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_errors_total", Help: "Failed samples and batches."}, sessionLabels),
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
	reg.MustRegister(m.samples, m.bytes, m.batches, m.errors, m.readSeconds, m.failed, m.sessions, m.memory, reserved, budget, &backendCollector{b: &m.backends}, &datasetCollector{m: mgr},
		mgr.access.opened, mgr.access.checks)
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

// forSession makes ss's series and counts its backend's counters from
// now until forget.
func (m *metrics) forSession(ss *session, kind string, device int, size int64, gpuPath string) sessionMetrics {
	m.backends.mu.Lock()
	m.backends.live[ss] = struct{}{}
	m.backends.mu.Unlock()
	dataset, backend := ss.dataset, ss.backend
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
// stay in the dataset's and backend's totals, its backend's counters
// too (their final values: call it after the loader has closed).
func (m *metrics) forget(ss *session) {
	ss.metrics.memory.Sub(ss.metrics.memoryBytes)
	m.backends.mu.Lock()
	defer m.backends.mu.Unlock()
	if _, ok := m.backends.live[ss]; ok {
		delete(m.backends.live, ss)
		addCounts(m.backends.ended, ss)
	}
}

// backendCollector exports the backends' counters per dataset and backend since start.
// Ended and open sessions are summed; peak_* counters take the largest.
type backendCollector struct{ b *backendCounts }

var backendDesc = prometheus.NewDesc("nvfeed_backend", "Backend counters by dataset and backend since the daemon started, every session's (ended ones' too) summed (peak_*: the largest) (cache_hits, cache_misses, stale_samples, fs_only_samples, requests, peak_in_flight, …).",
	[]string{"dataset", "backend", "counter"}, nil)

// Describe sends the one descriptor.
func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) { ch <- backendDesc }

// Collect sends the backend counters.
func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	c.b.mu.Lock()
	sums := maps.Clone(c.b.ended)
	for ss := range c.b.live {
		addCounts(sums, ss)
	}
	c.b.mu.Unlock()
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(backendDesc, prometheus.GaugeValue, v, k.dataset, k.backend, k.counter)
	}
}

// datasetCollector exports each dataset's samples by how they are read now, by cause.
type datasetCollector struct{ m *Manager }

var (
	datasetSamplesDesc = prometheus.NewDesc("nvfeed_dataset_samples", "Samples of each registered dataset by how they are read now: state fresh (raw), filesystem_only (mapped without extents), stale (mapped raw, read through the filesystem: nvfeed_dataset_stale_samples says why).",
		[]string{"dataset", "state"}, nil)
	datasetStaleDesc = prometheus.NewDesc("nvfeed_dataset_stale_samples", "Raw-mapped samples of each registered dataset read through the filesystem, by cause: changed_since_mapping, extents_not_the_files, writable_by_untrusted_users, unchecked (docs/daemon.md says the fix of each).",
		[]string{"dataset", "cause"}, nil)
)

// Describe sends the descriptors.
func (c *datasetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- datasetSamplesDesc
	ch <- datasetStaleDesc
}

// Collect sends every dataset's counts, each cause's (0 too: the series
// stay).
func (c *datasetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, info := range c.m.Datasets(context.Background(), Caller{}) { // root's: no access check
		notRaw := info.Stale + info.Writable + info.Pending
		for state, n := range map[string]int{"fresh": info.Fresh, "filesystem_only": info.FilesystemOnly, "stale": notRaw} {
			ch <- prometheus.MustNewConstMetric(datasetSamplesDesc, prometheus.GaugeValue, float64(n), info.Name, state)
		}
		byCause := map[string]int{CauseChanged: 0, CauseExtents: 0, CauseWritable: 0, CauseUnchecked: 0, CausePending: 0}
		for _, sc := range staleCauses(info) {
			byCause[sc.Cause] = sc.Samples
		}
		for cause, n := range byCause {
			ch <- prometheus.MustNewConstMetric(datasetStaleDesc, prometheus.GaugeValue, float64(n), info.Name, cause)
		}
	}
}
