// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader/batchmem"
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

// Options returns the loader options r asks for, checked once
// (Options.Check). A daemon so refuses a request before it looks at any
// dataset. First come the bounds only r's form says: num_shards given
// (0 does not mean 1), the prefetch depth given, release_after,
// device_id and the size of backend_options. The slots are the prefetch
// depth + release_after + 1. NewPlan checks the rest against the map.
// Errors wrap ErrOptions and name the field, its value and the range.
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
	return Options{ReaderArgs: r.ReaderArgs, PrefetchQueueDepth: prefetch, ReleaseAfter: release, Memory: r.Memory, Device: r.Device,
		DeviceUUID: r.DeviceUUID, GPUPath: r.GPUPath, Backend: r.Backend, BackendOptions: r.BackendOptions, State: r.State, ROI: r.ROI}.Check()
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
	o, err := o.Check()
	if err != nil {
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
	if err := p.Sampling.checkDataset(); err != nil { // the reader arguments are checked
		return Plan{}, fmt.Errorf("loader: %w", err)
	}
	if st := o.State; st != nil {
		if err := checkState(st, p.Sampling); err != nil {
			return Plan{}, err
		}
		p.Sampling = p.Sampling.Resumed(st.Epoch, st.Stages)
		p.Sampling.listed = st.Version <= ListedVersion
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
	ways, err := chooseWays(m, o)
	if err != nil {
		return Plan{}, err
	}
	for _, w := range ways {
		if w.err != nil {
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
		d := batchmem.Desc{Kind: o.Memory, SlotSize: p.Footprint.SlotSize}
		p.DenseRow, _ = denseRow(m, d, o.BatchSize, len(m.Samples), func(i int) *bmap.Sample { return &m.Samples[i] })
	}
	return p, nil
}
