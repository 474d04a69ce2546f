// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"
	"sync"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// Bounds of a Request beyond those of Options (the daemon's open
// request).
const (
	// MaxReleaseAfter bounds Request.ReleaseAfter and Options.ReleaseAfter.
	MaxReleaseAfter = 64
	// MaxSlots is the most batch slots a loader has: prefetched batches,
	// the batches its consumer holds, and the one just delivered.
	MaxSlots = MaxPrefetchQueueDepth + MaxReleaseAfter + 1
	// MaxDevice bounds Request.Device: a CUDA device ordinal.
	MaxDevice = 1023
	// MaxBackendOptions bounds the entries of Request.BackendOptions (no
	// backend has nearly as many options).
	MaxBackendOptions = 64
)

// Request is what a client sets of a loader, as the daemon's open
// request carries it (its msgpack keys are the wire's): the reader
// arguments, the backend and its options, the prefetch depth and the
// batches the client holds, the memory and GPU, and a state to resume.
// Options turns it into a loader's Options; NewPlan does the rest.
type Request struct {
	ReaderArgs     `msgpack:",inline"`
	Backend        string         `msgpack:"backend"`         // a name from Backends; "" means the default
	BackendOptions map[string]any `msgpack:"backend_options"` // the backend's options by name; at most MaxBackendOptions
	// PrefetchQueueDepth is in [1, MaxPrefetchQueueDepth]; nil means
	// DefaultPrefetchQueueDepth (a depth given is checked as it is: 0 is
	// no depth).
	PrefetchQueueDepth *int `msgpack:"prefetch_queue_depth"`
	// ReleaseAfter: the client releases a batch after this many later
	// ones, in [0, MaxReleaseAfter]; nil means PrefetchQueueDepth+1.
	ReleaseAfter *int          `msgpack:"release_after"`
	Memory       batchmem.Kind `msgpack:"memory"`    // batchmem.Pinned ("" too) or batchmem.GPU
	Device       int           `msgpack:"device_id"` // the GPU ordinal for GPU memory, in [0, MaxDevice], used when DeviceUUID is ""
	// DeviceUUID names the GPU of GPU memory by UUID (Options.DeviceUUID).
	DeviceUUID string `msgpack:"device_uuid"`
	// GPUPath is how batches reach GPU memory (Options.GPUPath).
	GPUPath string `msgpack:"gpu_path"`
	State   *State `msgpack:"state"` // resume here
	// ROI: nil, or fn.readers.numpy's region of interest each tensor
	// sample is read as (Options.ROI; its keys are DALI's argument names).
	ROI *ROI `msgpack:"roi"`
}

// Options returns the loader options r asks for, the slots among them
// (prefetch depth + release_after + 1), their defaults filled in and
// checked against every bound that needs no dataset, so that a daemon
// refuses a request before it looks at any: what only r's form can say
// (num_shards given: 0 does not mean 1; the prefetch depth given;
// release_after, device_id, backend_options' size; a state on its own),
// then Options.Validate. NewPlan checks the rest (against the map). Errors wrap ErrOptions and name the field, its
// value and the range.
func (r Request) Options() (Options, error) {
	if r.NumShards < 1 || r.NumShards > MaxSamples {
		return Options{}, fmt.Errorf("%w: num_shards %d not in [1, %d]", ErrOptions, r.NumShards, MaxSamples)
	}
	prefetch := DefaultPrefetchQueueDepth
	if r.PrefetchQueueDepth != nil { // given: 0 is no depth, not the default
		prefetch = *r.PrefetchQueueDepth
	}
	if err := checkPrefetch(prefetch); err != nil {
		return Options{}, err
	}
	release, why := prefetch+1, " (its default, prefetch_queue_depth+1: give release_after)"
	if r.ReleaseAfter != nil {
		release, why = *r.ReleaseAfter, ""
	}
	if release < 0 || release > MaxReleaseAfter {
		return Options{}, fmt.Errorf("%w: release_after %d not in [0, %d]%s", ErrOptions, release, MaxReleaseAfter, why)
	}
	if r.Device < 0 || r.Device > MaxDevice {
		return Options{}, fmt.Errorf("%w: device_id %d not in [0, %d]", ErrOptions, r.Device, MaxDevice)
	}
	if n := len(r.BackendOptions); n > MaxBackendOptions {
		return Options{}, fmt.Errorf("%w: backend_options has %d entries, at most %d", ErrOptions, n, MaxBackendOptions)
	}
	if r.State != nil {
		if err := r.State.Validate(); err != nil {
			return Options{}, fmt.Errorf("state: %w", err)
		}
	}
	o := Options{ReaderArgs: r.ReaderArgs, PrefetchQueueDepth: prefetch, ReleaseAfter: release, Memory: r.Memory, Device: r.Device,
		DeviceUUID: r.DeviceUUID, GPUPath: r.GPUPath, Backend: r.Backend, BackendOptions: r.BackendOptions, State: r.State, ROI: r.ROI}.WithDefaults()
	if err := o.Validate(); err != nil {
		return Options{}, err
	}
	return o, nil
}

// checkPrefetch checks a prefetch depth: in [1, MaxPrefetchQueueDepth].
func checkPrefetch(n int) error {
	if n < 1 || n > MaxPrefetchQueueDepth {
		return fmt.Errorf("%w: prefetch_queue_depth %d not in [1, %d]", ErrOptions, n, MaxPrefetchQueueDepth)
	}
	return nil
}

// Plan is everything a loader will be, decided before anything is
// allocated or opened: NewPlan makes it, Open opens it, and a daemon
// admits its Footprint against its budgets in between. Its fields are
// read-only: Open takes them as they are.
type Plan struct {
	// Options are the options planned from, their defaults filled in and
	// valid. Open takes from them only what serves the process (Logger,
	// Trace, Guard, Shared, Cred, CUDA, Replays, SkipErrors), which may be
	// set between NewPlan and Open; the rest is the plan's.
	Options Options
	// Sampling is the sampling over the map's samples (validated; a
	// resume state checked against it).
	Sampling Sampling
	// PrefetchQueueDepth, ReleaseAfter and Slots: the batches read ahead,
	// those the consumer holds beyond the one in use, and the slots for
	// all of them and that one (unless Options.Slots asked for more).
	PrefetchQueueDepth, ReleaseAfter, Slots int
	// SlotSize is the bytes a slot holds (SlotBytes of the batch size, or
	// Options.SlotSize; the memory rounds it up: Footprint.SlotSize).
	SlotSize int64
	// DenseRow is the size of every sample when every batch is placed
	// dense (Batch.Dense: a map of one sample size, and of a tensor map one
	// dtype, shape and phase, in GPU memory or of a tensor map in host
	// memory, rows that fit a slot); 0 when batches are ragged, or dense
	// only where one happens to hold samples of one size.
	DenseRow int64
	// Footprint is the batch memory the loader holds (batchmem.Sizing,
	// what batchmem.Open allocates): page-locked host bytes (host memory,
	// or GPU memory's staging area for a backend writing host memory) and
	// device bytes; with several GPU ways, the most any of them holds.
	Footprint batchmem.Sizes
	// SamplerBytes is the sample order's memory (SamplerBytes).
	SamplerBytes int64

	m    *bmap.Map
	ways []gpuWay
}

// GPUPaths returns the GPU paths Open tries, in order, and why each:
// one for host memory ("" and ""), or for GPUPathAuto with no backend
// named, cufile and then bounce; a path is listed once per backend it
// may try (with no backend named over a raw map: AutoBackend, then
// DefaultBackend should it not open).
func (p Plan) GPUPaths() (paths, whys []string) {
	for _, w := range p.ways {
		paths, whys = append(paths, w.path), append(whys, w.why)
	}
	return paths, whys
}

// NewPlan plans a loader over m with options o: their defaults filled
// in and every bound checked, once (Options.Validate, the sampling over
// m, a resume state against it); the backend of each GPU way and its
// options; the slots and their size; whether batches are dense; and the
// exact memory footprint. Errors wrap ErrOptions for what o asks wrongly
// (naming the field, its value and what is allowed).
func NewPlan(m *bmap.Map, o Options) (Plan, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return Plan{}, fmt.Errorf("loader: %w", err)
	}
	n := len(m.Samples)
	if o.Files != nil { // the sampling's dataset is this list (DALI's files=)
		for i, s := range o.Files {
			if s < 0 || int(s) >= n {
				return Plan{}, fmt.Errorf("loader: %w: files[%d] is sample %d, the map has %d", ErrOptions, i, s, n)
			}
		}
		n = len(o.Files)
	}
	p := Plan{Options: o, m: m, Sampling: Sampling{N: n, ReaderArgs: o.ReaderArgs},
		PrefetchQueueDepth: o.PrefetchQueueDepth, ReleaseAfter: o.ReleaseAfter, Slots: o.Slots, SlotSize: o.SlotSize}
	if w := o.WebDataset; w != nil {
		switch {
		case m != w.view.Map().Shards:
			return Plan{}, fmt.Errorf("loader: %w: the map is not the webdataset's shards", ErrOptions)
		case o.ROI != nil:
			return Plan{}, fmt.Errorf("loader: %w: a region of interest is for tensor maps, not a webdataset", ErrOptions)
		}
		p.Sampling.N, p.Sampling.WebDataset = w.view.Len(), true
	}
	if err := p.Sampling.Validate(); err != nil {
		return Plan{}, fmt.Errorf("loader: %w", err)
	}
	if st := o.State; st != nil {
		if err := checkState(st, p.Sampling); err != nil {
			return Plan{}, err
		}
		p.Sampling = p.Sampling.Resumed(st.Epoch, st.Stages)
	}
	p.SamplerBytes = SamplerBytes(p.Sampling)
	switch {
	case o.ROI != nil: // the regions' sizes, each checked against its sample
		n, err := ROISlotBytes(m, o.BatchSize, o.ROI)
		if err != nil {
			return Plan{}, fmt.Errorf("loader: %w", err)
		}
		p.SlotSize = max(p.SlotSize, n)
	case p.SlotSize == 0 && o.WebDataset != nil:
		p.SlotSize = o.WebDataset.SlotBytes(o.BatchSize)
	case p.SlotSize == 0:
		p.SlotSize = o.SlotSizes.slotBytes(m, o.BatchSize)
	}
	ways, _ := o.gpuWays() // Validate checked them
	ways = autoBackends(m, o, ways)
	for i := range ways {
		w := &ways[i]
		if err := w.resolve(o); err != nil {
			if i == 0 {
				return Plan{}, err
			}
			w.err = err // only if the ways before it fail
			continue
		}
		s, err := batchmem.Sizing(o.Memory, p.Slots, p.SlotSize, w.spec.DeviceWrites)
		if err != nil {
			return Plan{}, fmt.Errorf("loader: %w: %w", ErrOptions, err)
		}
		p.Footprint.SlotSize = s.SlotSize
		p.Footprint.Host, p.Footprint.Device = max(p.Footprint.Host, s.Host), max(p.Footprint.Device, s.Device)
	}
	p.ways = ways
	if o.ROI == nil && o.WebDataset == nil { // regions: dense where a batch's regions have one shape; a webdataset's outputs: ragged
		p.DenseRow = denseRowOf(m, batchmem.Desc{Kind: o.Memory, SlotSize: p.Footprint.SlotSize}, o.BatchSize)
	}
	return p, nil
}

// autoBackends fills in the backend of every way that names none: the
// fastest the map and the caller allow. A map of a block device with a
// sample mapped raw gets AutoBackend, which reads raw only what the
// freshness guard allows and the rest through the filesystem as the
// caller, followed by a way with DefaultBackend should it not open here;
// any other map, or backend options given without a backend name (they
// are DefaultBackend's), gets DefaultBackend. Each way says why
// (backendWhy).
func autoBackends(m *bmap.Map, o Options, ways []gpuWay) []gpuWay {
	if o.backendName() != "" {
		return ways
	}
	why := ""
	switch {
	case len(o.BackendOptions) > 0:
		why = "backend_options without a backend name are " + DefaultBackend + "'s"
	case m.FSOnly():
		why = fmt.Sprintf("auto: the map's filesystem (%s) has no block device to read raw", m.Device.FSType)
	case !anyRaw(m):
		why = "auto: no sample is mapped raw"
	}
	out := make([]gpuWay, 0, 2*len(ways))
	for _, w := range ways {
		if w.backend != "" {
			out = append(out, w)
			continue
		}
		fs := w
		fs.backend = DefaultBackend
		if why != "" {
			fs.backendWhy = why
			out = append(out, fs)
			continue
		}
		raw := w
		raw.backend, raw.auto = AutoBackend, true
		raw.backendWhy = fmt.Sprintf("auto: raw reads from %s where the freshness guard allows, the filesystem as the caller for the rest", m.Device.Path)
		fs.backendWhy = "auto: " + AutoBackend + " did not open here"
		out = append(out, raw, fs)
	}
	return out
}

// anyRaw reports whether a sample of m is mapped raw (the first one
// found ends the search).
func anyRaw(m *bmap.Map) bool {
	for i := range m.Samples {
		if m.Samples[i].Reason == bmap.Raw {
			return true
		}
	}
	return false
}

// resolve looks up the way's backend (o's own Spec when it is the one o
// names) and checks o's backend options against it.
func (w *gpuWay) resolve(o Options) error {
	if o.Spec != nil && w.backend == o.backendName() {
		w.spec = *o.Spec
	} else {
		s, err := BackendSpec(w.backend)
		if err != nil {
			return err
		}
		w.spec = s
	}
	var err error
	w.params, err = w.spec.Resolve(o.BackendOptions)
	return err
}

// denseRowOf returns the row every batch of batchSize samples of m has
// in memory d when all are placed dense (Loader.denseRow): every sample
// of one size > 0, of a tensor map one dtype, shape and phase too; GPU
// memory, or a tensor map; rows that fit a slot. Else 0.
func denseRowOf(m *bmap.Map, d batchmem.Desc, batchSize int) int64 {
	tensors := m.Reader == bmap.ReaderNumpy
	if len(m.Samples) == 0 || (d.Kind != batchmem.GPU && !tensors) {
		return 0
	}
	s0 := &m.Samples[0]
	row, lead := s0.Size, s0.Offset%backend.Align
	for i := range m.Samples[1:] {
		s := &m.Samples[i+1]
		if s.Size != row || (tensors && (s.Offset%backend.Align != lead || !sameTensor(s.Tensor, s0.Tensor))) {
			return 0
		}
	}
	if !tensors {
		lead = 0
	}
	if !d.PacksAt(batchSize, row, lead) {
		return 0
	}
	return row
}

// maxSlotSizes bounds the batch sizes a SlotSizes keeps: past it, a plan
// works out its own.
const maxSlotSizes = 64

// SlotSizes keeps SlotBytes of one map by batch size, for the plans
// given it (Options.SlotSizes): the first plan of a batch size works it
// out while the others wait. It keeps at most maxSlotSizes batch sizes,
// for the last map asked about. Its zero value is ready; it is safe for
// concurrent use.
type SlotSizes struct {
	mu sync.Mutex
	m  *bmap.Map
	by map[int]int64
}

// slotBytes returns SlotBytes(m, batch), kept by s (s nil: worked out).
func (s *SlotSizes) slotBytes(m *bmap.Map, batch int) int64 {
	if s == nil {
		return SlotBytes(m, batch)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m != m {
		s.m, s.by = m, nil
	}
	if n, ok := s.by[batch]; ok {
		return n
	}
	n := SlotBytes(m, batch)
	if s.by == nil {
		s.by = map[int]int64{}
	}
	if len(s.by) < maxSlotSizes {
		s.by[batch] = n
	}
	return n
}
