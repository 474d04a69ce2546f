// SPDX-License-Identifier: Apache-2.0

// Package loader reads shuffled, sharded, labeled batches of a block-mapped
// dataset with DALI fn.readers.file semantics (fn.readers.numpy's for a
// tensor map: each sample its array's data) into batch memory (package
// loader/batchmem: a fixed set of slots, page-locked host or GPU memory),
// through a backend chosen by name from Backends (the contract is package
// loader/backend).
//
// A Loader prefetches up to PrefetchQueueDepth batches while the consumer
// holds earlier ones; a batch's slot is reused only after Release. Batches
// run on across epochs: Next returns io.EOF once between epochs, as DALI's
// external_source sees StopIteration, and the call after it starts the next
// epoch. State and Options.State save and resume the exact sequence.
package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// Loader produces batches. Next, Release and State may be called from
// one consumer goroutine; Release may also be called from others.
type Loader struct {
	m       *bmap.Map
	smp     Sampling
	opts    Options
	mem     batchmem.Memory
	desc    batchmem.Desc // mem.Desc(), fixed
	backend backend.Backend
	spec    *backend.Spec // the backend's description
	params  backend.Params
	log     *slog.Logger
	gpuPath string // GPUPathCuFile or GPUPathBounce for GPU memory, "" for host memory
	gpuWhy  string // why that path
	// backendWhy: why the backend, for a loader that named none (auto)
	backendWhy string

	ctx     context.Context
	cancel  context.CancelFunc
	pcancel context.CancelFunc // stops the current producer (Seek starts another)
	wg      sync.WaitGroup
	free    chan int
	ready   chan *Batch
	batches []*Batch // one per slot

	// Consumer position; posMu guards epoch and next for State, which
	// may be called from any goroutine.
	posMu       sync.Mutex
	epoch, next int
	pendingEOF  bool
	waiting     *Batch // taken from ready but not complete when Next's ctx ended
	closed      atomic.Bool
	failed      atomic.Pointer[error] // why a producer panicked: every later Next returns it
}

// Batch is one batch in a ring slot. Its memory stays valid until Release.
type Batch struct {
	Epoch     int     // epoch number
	Iteration int     // batch number within the epoch
	Indices   []int32 // sample index of each position
	Labels    []int32 // label of each position
	Offsets   []int64 // byte offset of each sample in the ring's shared memory (see Dense)
	Lengths   []int64 // byte length of each sample
	Slot      int     // ring slot
	Errors    []error // with Options.SkipErrors: one *backend.SampleError per failed sample
	Failed    []int   // with Options.SkipErrors: the positions whose sample failed (their Lengths are 0)
	// Shapes, with Options.ROI, is each position's region shape (its
	// sample's bytes are that region, C-contiguous); nil without.
	Shapes  [][]int64
	place   batchmem.Placement // how the samples lie in the slot
	roi     roiBatch           // with Options.ROI: the regions' runs, reads and scratch memory
	repeats []batchmem.Repeat  // place.Repeats' storage

	readStart, readEnd time.Time

	l    *Loader
	mem  []byte  // the slot's host view (batchmem.Region.Host)
	dev  uintptr // the slot's device address (batchmem.Region.Dev), 0 for host memory
	base int64   // the slot's offset in the shared memory
	reqs []backend.Request
	// Of a webdataset batch: the requests' samples (a member's range of
	// its tar's record, the tar being the request's Whole), each
	// request's position, the outputs' components (scratch), why
	// planning failed.
	members []bmap.Sample
	reqPos  []int32
	comps   []int
	planErr error
	// denied is each position's refusal by Options.Access, asked before
	// the batch is planned (nil where none, or no Access): a refused
	// sample gets an empty room, so the layout tells nothing of its size.
	denied []error
	// ask, askAt and askWhy are admit's scratch, kept with the slot so
	// that asking allocates nothing per batch: the distinct samples asked,
	// each one's place in ask, each one's refusal.
	ask    []int
	askAt  map[int]int
	askWhy []error
	// marks is Options.Guard's Marks before the batch's Access: a change
	// no sample's freshness shows, after it, has the batch asked and read
	// again (reread).
	marks    uint64
	refused  []bool // per request: it failed before its read (Access refused it); reread's
	done     chan struct{}
	err      error
	released atomic.Bool
}

// Len returns the number of samples in the batch.
func (b *Batch) Len() int { return len(b.Indices) }

// Dense reports the size S of every sample of a dense batch, 0 for a
// ragged one. A batch is dense when its samples all have the same size
// S > 0 and, of a tensor map, the same dtype, shape and phase (their data's
// offset in their files modulo backend.Align), and the memory places it
// so (batchmem.Desc.PacksAt): in GPU memory, and for a tensor map in host
// memory too. Its samples lie back to back, sample i at Offsets[0] + i·S:
// one C-contiguous (Len, S) array, for a tensor map one (Len, *shape)
// array of its dtype. A padding sample's row holds a copy of its bytes; a
// failed sample's row reads zeros (its Lengths entry is 0). In a ragged
// batch each distinct sample has a room of its own starting
// backend.Align-aligned, its bytes at the room's start plus its phase,
// and a padding sample shares its first copy's offset.
func (b *Batch) Dense() int64 { return b.place.Row }

// Sample returns a view of sample i's bytes in host batch memory
// (batchmem.Pinned); it is not for GPU memory, whose bytes are on the
// device.
func (b *Batch) Sample(i int) []byte {
	off := b.Offsets[i] - b.base
	return b.mem[off : off+b.Lengths[i] : off+b.Lengths[i]]
}

// ReadTime returns how long the batch's reads took, from the first
// request issued to the last completed.
func (b *Batch) ReadTime() time.Duration { return b.readEnd.Sub(b.readStart) }

// Release returns the batch's slot to the ring. Calling it twice is a
// no-op.
func (b *Batch) Release() {
	if b.released.Swap(true) {
		return
	}
	b.l.free <- b.Slot
}

// New starts a loader over map m: NewPlan, then Open. It fills in the
// options' defaults and validates them, allocates the batch ring and
// starts the backend and the prefetching producer; ctx bounds the
// loader's life as Close does. For GPU memory it takes the GPU path the
// options ask for; with GPUPathAuto and no backend named it tries cufile
// and, where cuFile cannot run (ErrUnavailable) or runs in its
// compatibility mode (measured: slower than bounce), bounce with the
// default backend. GPUPath says which ran and why.
func New(ctx context.Context, m *bmap.Map, o Options) (*Loader, error) {
	p, err := NewPlan(m, o)
	if err != nil {
		return nil, err
	}
	return Open(ctx, p)
}

// Open starts the loader p plans (NewPlan), as New does: nothing of the
// plan is derived again; from p.Options it takes only what serves the
// process (Logger, Trace, Guard, Shared, Cred, CUDA, Replays, SkipErrors).
func Open(ctx context.Context, p Plan) (*Loader, error) {
	if p.m == nil || len(p.ways) == 0 {
		return nil, fmt.Errorf("loader: %w: open of a plan NewPlan did not make", ErrOptions)
	}
	return openGPUPath(ctx, p)
}

// openGPUPath opens p's loader on the first of its GPU ways that works.
// Under GPUPathAuto, the backend writing the device is kept only where it
// opens (not backend.ErrUnavailable) and, if its Spec says MeasuresMode,
// does not report backend.ModeCompat at its opening; else bounce, with
// the reason logged and in GPUPath.
func openGPUPath(ctx context.Context, p Plan) (*Loader, error) {
	o := p.Options
	ways := slices.Clone(p.ways)
	var err error
	for i, w := range ways {
		last := i+1 == len(ways)
		var l *Loader
		if l, err = open(ctx, p, w); err != nil {
			if !last && w.auto && ctx.Err() == nil {
				why := fmt.Sprintf("auto: %s did not open here (%v): %s", w.backend, err, ways[i+1].backend)
				o.Logger.Info("loader: backend " + why)
				ways[i+1].backendWhy = why
				if ways[i+1].path == w.path {
					ways[i+1].why = w.why
				}
				continue
			}
			if !last && errors.Is(err, ErrUnavailable) {
				why := fmt.Sprintf("%s cannot run here (%v): bounce", w.backend, err)
				o.Logger.Info("loader: gpu_path auto: " + why)
				ways[i+1].why = "auto: " + why
				continue
			}
			return nil, err
		}
		l.gpuPath, l.gpuWhy, l.backendWhy = w.path, w.why, w.backendWhy
		if w.path != GPUPathCuFile || !l.spec.MeasuresMode {
			return l, nil
		}
		md, ok := l.backend.(backend.ModeReporter)
		if !ok {
			l.Close()
			return nil, fmt.Errorf("loader: backend %s: its Spec says MeasuresMode but it has no Mode (backend.ModeReporter)", w.backend)
		}
		mode, why := md.Mode()
		if !last && (mode == backend.ModeCompat || mode == backend.ModeNone || mode == backend.ModeUnknown) {
			reason := fmt.Sprintf("%s runs in compatibility mode (%s): bounce", w.backend, why)
			if mode != backend.ModeCompat {
				reason = fmt.Sprintf("%s's mode could not be measured (%s, %s): bounce", w.backend, mode, why)
			}
			o.Logger.Info("loader: gpu_path auto: " + reason)
			if cerr := l.Close(); cerr != nil {
				o.Logger.Warn("loader: closing the loader", "backend", w.backend, "err", cerr)
			}
			ways[i+1].why = "auto: " + reason
			continue
		}
		l.gpuWhy = fmt.Sprintf("%s; %s mode %s (%s)", w.why, w.backend, mode, why)
		if mode == backend.ModeCompat {
			o.Logger.Warn("loader: gpu_path cufile: the backend runs in compatibility mode, slower than gpu_path bounce", "backend", w.backend, "why", why)
		}
		return l, nil
	}
	return nil, err
}

// open starts p's loader with one way (backend and GPU path).
func open(ctx context.Context, p Plan, w gpuWay) (*Loader, error) {
	if w.err != nil {
		return nil, w.err
	}
	o, m := p.Options, p.m
	l := &Loader{m: m, smp: p.Sampling, opts: o, log: o.Logger, params: w.params}
	if st := o.State; st != nil { // checked by NewPlan
		l.epoch, l.next = st.Epoch, st.Batch
	}
	spec := w.spec
	openMemory := batchmem.Open
	if o.openMemory != nil {
		openMemory = o.openMemory
	}
	mem, err := openMemory(o.Memory, p.Slots, p.SlotSize, batchmem.Options{Device: o.Device, DeviceUUID: o.DeviceUUID, DeviceWrites: spec.DeviceWrites, Logger: o.Logger, CUDA: o.CUDA})
	if err != nil {
		if errors.Is(err, batchmem.ErrKind) {
			return nil, fmt.Errorf("loader: %w: %w", ErrOptions, err)
		}
		return nil, fmt.Errorf("loader: %w", err)
	}
	l.spec = &spec
	if l.backend, err = spec.Open(m, l.params, backendEnv(o, mem, p.Slots)); err != nil {
		mem.Close()
		return nil, err
	}
	l.mem, l.desc = mem, mem.Desc()
	l.free = make(chan int, p.Slots)
	slotSize := mem.Desc().SlotSize
	per := 1 // outputs a sample
	if o.WebDataset != nil {
		per = o.WebDataset.Outputs()
	}
	for i := 0; i < p.Slots; i++ {
		r := mem.Slot(i)
		b := &Batch{Slot: i, l: l,
			Indices: make([]int32, 0, o.BatchSize), Labels: make([]int32, 0, o.BatchSize),
			Offsets: make([]int64, 0, o.BatchSize*per), Lengths: make([]int64, 0, o.BatchSize*per),
			reqs: make([]backend.Request, 0, o.BatchSize*per), mem: r.Host, dev: r.Dev, base: int64(i) * slotSize}
		if o.WebDataset != nil {
			// members never grows: requests point into it.
			b.members, b.reqPos, b.comps = make([]bmap.Sample, 0, o.BatchSize*per), make([]int32, 0, o.BatchSize*per), make([]int, per)
		}
		l.batches = append(l.batches, b)
		l.free <- i
	}
	l.ctx, l.cancel = context.WithCancel(ctx)
	startEpoch, startBatch := l.epoch, l.next
	if startBatch >= p.Sampling.EpochBatches(startEpoch) {
		l.pendingEOF = true
		startEpoch, startBatch = startEpoch+1, 0
	}
	l.start(startEpoch, startBatch)
	return l, nil
}

// backendEnv is what the backend gets, built-in or registered alike: o's
// logger, trace, caller, guard and shared resources, and mem's host slots
// and GPU memory.
func backendEnv(o Options, mem batchmem.Memory, slots int) backend.Env {
	env := backend.Env{Logger: o.Logger, Trace: o.Trace, Cred: o.Cred}
	if o.Guard != nil { // no typed nil in the interface
		env.Guard = o.Guard
	}
	if o.Shared != nil {
		env.Shared = &o.Shared.s
	}
	if o.Devices != nil {
		env.Devices = &o.Devices.s
	}
	for i := 0; i < slots; i++ {
		if h := mem.Slot(i).Host; len(h) > 0 {
			env.HostBuffers = append(env.HostBuffers, h)
		}
	}
	if d := mem.Desc(); d.Kind.OnGPU() {
		env.GPU = &backend.GPUMemory{Device: d.Device, Base: mem.Slot(0).Dev, Size: d.Size, NUMANode: d.NUMANode}
		if o.CUDA != nil {
			env.GPU.Driver = o.CUDA
		}
	}
	return env
}

// start runs a producer from (epoch, batch) with a fresh ready queue.
func (l *Loader) start(epoch, batch int) {
	ctx, cancel := context.WithCancel(l.ctx)
	l.pcancel = cancel
	l.ready = make(chan *Batch, l.opts.PrefetchQueueDepth)
	l.wg.Add(1)
	go l.produce(ctx, l.ready, epoch, batch)
}

// stop ends the current producer and takes back the slots of every batch
// it made that the consumer has not taken: their reads are waited for
// (they write into the slots) and their bytes dropped.
func (l *Loader) stop() {
	l.pcancel()
	l.wg.Wait()
	for b := range l.ready {
		<-b.done
		l.free <- b.Slot
	}
	if b := l.waiting; b != nil {
		<-b.done
		l.free <- b.Slot
		l.waiting = nil
	}
}

// produce plans batches in order from (epoch, batch) and starts their
// reads, staying at most PrefetchQueueDepth batches ahead of the consumer,
// until ctx ends.
func (l *Loader) produce(ctx context.Context, ready chan<- *Batch, epoch, batch int) {
	defer l.wg.Done()
	defer close(ready)
	// The last line of defense (the options' bounds are the first): a
	// panic here would end the process and every other loader in it. It
	// fails this loader instead: Next returns the cause from now on.
	defer func() {
		if r := recover(); r != nil {
			l.fail(fmt.Errorf("%w: the producer panicked at epoch %d batch %d: %v", ErrInternal, epoch, batch, r), debug.Stack())
		}
	}()
	var order []int32
	orders := l.smp.Orders()
	bs := l.smp.BatchSize
	computed := l.smp.computed()
	if computed {
		order = make([]int32, 0, bs) // one batch's: the order is computed batch by batch
	}
	for {
		var ok bool
		nb := l.smp.EpochBatches(epoch)
		if !computed {
			if order, ok = l.epochOrder(ctx, orders, epoch, order); !ok {
				return
			}
			nb = (len(order) + bs - 1) / bs
		}
		for ; batch < nb; batch++ {
			var slot int
			select {
			case slot = <-l.free:
			case <-ctx.Done():
				return
			}
			b := l.batches[slot]
			if computed {
				l.plan(b, epoch, batch, l.samples(l.smp.batchAt(epoch, batch, order[:0])))
			} else {
				l.plan(b, epoch, batch, order[batch*bs:min((batch+1)*bs, len(order))])
			}
			go func() {
				defer func() {
					if r := recover(); r != nil {
						b.err = fmt.Errorf("%w: reading epoch %d batch %d panicked: %v", ErrInternal, b.Epoch, b.Iteration, r)
						l.fail(b.err, debug.Stack())
						close(b.done)
					}
				}()
				b.readStart = time.Now()
				if l.opts.Guard != nil && l.opts.Access != nil {
					b.refused = b.refused[:0]
					for i := range b.reqs {
						b.refused = append(b.refused, b.reqs[i].Err != nil)
					}
				}
				err := l.read(ctx, b.reqs)
				if l.remarked(b) {
					err = l.reread(ctx, b)
				}
				if l.opts.ROI != nil {
					l.packROI(b)
				}
				scrub(b.reqs)
				if b.planErr != nil {
					b.err = b.planErr
				} else {
					b.err = l.finish(ctx, b, err)
				}
				b.readEnd = time.Now()
				close(b.done)
			}()
			select {
			case ready <- b:
			case <-ctx.Done():
				<-b.done
				l.free <- slot
				return
			}
		}
		epoch, batch = epoch+1, 0
	}
}

// remarked reports whether a change no sample's freshness check shows (a
// mount beneath the dataset's root: fresh.Guard.Marks) came after the
// batch's Access: what was judged then may not hold for what was read.
func (l *Loader) remarked(b *Batch) bool {
	g := l.opts.Guard
	if g == nil || l.opts.Access == nil {
		return false
	}
	g.Poll()
	return g.Marks() != b.marks
}

// rereads bounds reread's rounds while such changes keep coming.
const rereads = 3

// reread asks Access again for the samples a batch read (the guard's
// watch has moved: their paths are opened as the caller anew) and reads
// again those it still lets through, now checked as the change requires;
// one refused now fails. A sample refused before stays refused: its room
// was planned empty. While changes keep coming, after rereads rounds,
// every sample it read fails instead.
func (l *Loader) reread(ctx context.Context, b *Batch) error {
	refused := b.refused
	var err error
	for range rereads {
		b.marks = l.opts.Guard.Marks() // remarked has just polled
		var keys []int
		for i := range b.reqs {
			if !refused[i] {
				keys = append(keys, b.reqs[i].Index)
			}
		}
		why := map[int]error{}
		for _, r := range l.opts.Access(keys) {
			why[keys[r.At]] = &backend.SampleError{Index: keys[r.At], Path: r.Path, Err: r.Err}
		}
		for i := range b.reqs {
			if !refused[i] {
				b.reqs[i].Err = why[b.reqs[i].Index]
			}
		}
		if err = l.read(ctx, b.reqs); !l.remarked(b) {
			return err
		}
	}
	for i := range b.reqs {
		if !refused[i] {
			b.reqs[i].Err = &backend.SampleError{Index: b.reqs[i].Index, Path: b.reqs[i].Sample.Path,
				Err: fmt.Errorf("%w: mounts beneath the dataset's root kept changing while the batch was read", bmap.ErrStale)}
		}
	}
	return err
}

// read reads a batch's requests with the backend: those Options.Access
// let through when the batch was planned (Loader.admit); the others keep
// the error plan set, and the batch fails (per sample: SkipErrors
// delivers the rest).
func (l *Loader) read(ctx context.Context, reqs []backend.Request) error {
	if l.opts.Access == nil {
		return l.backend.ReadBatch(ctx, reqs)
	}
	var refused error
	n := 0 // requests let through
	for i := range reqs {
		if reqs[i].Err == nil {
			n++
		} else if refused == nil {
			refused = reqs[i].Err
		}
	}
	if refused == nil {
		return l.backend.ReadBatch(ctx, reqs) // the common case: no copy
	}
	if n == 0 {
		return refused
	}
	pos := make([]int, 0, n)
	for i := range reqs {
		if reqs[i].Err == nil {
			pos = append(pos, i)
		}
	}
	allowed := make([]backend.Request, len(pos))
	for j, i := range pos {
		allowed[j] = reqs[i]
	}
	err := l.backend.ReadBatch(ctx, allowed)
	for j, i := range pos {
		reqs[i] = allowed[j]
	}
	if err == nil {
		err = refused
	}
	return err
}

// admit asks Options.Access, before the batch is planned, which of the
// map samples keys (one a position; -1: none to ask) its reads may
// touch, and records each position's refusal in b.denied (nil: every
// position let through): the planners give a refused sample an empty
// room, so no offset depends on its size. Each distinct sample is asked
// once.
func (l *Loader) admit(b *Batch, keys []int) {
	b.denied = b.denied[:0]
	if l.opts.Access == nil {
		return
	}
	if b.askAt == nil {
		b.askAt = make(map[int]int, len(keys))
	}
	clear(b.askAt)
	b.ask = b.ask[:0]
	for _, k := range keys {
		if _, ok := b.askAt[k]; !ok && k >= 0 {
			b.askAt[k] = len(b.ask)
			b.ask = append(b.ask, k)
		}
	}
	refused := l.opts.Access(b.ask)
	if len(refused) == 0 {
		return
	}
	b.askWhy = append(b.askWhy[:0], make([]error, len(b.ask))...)
	for _, r := range refused {
		i := b.ask[r.At]
		b.askWhy[r.At] = &backend.SampleError{Index: i, Path: r.Path, Err: r.Err}
	}
	for _, k := range keys {
		var err error
		if j, ok := b.askAt[k]; ok {
			err = b.askWhy[j]
		}
		b.denied = append(b.denied, err)
	}
}

// deniedAt returns position i's refusal by Options.Access (nil: none).
func (b *Batch) deniedAt(i int) error {
	if i < len(b.denied) {
		return b.denied[i]
	}
	return nil
}

// epochOrder returns epoch's order (Orders.Epoch) into buf. A replay
// (ShuffleDALI from a resumed or sought epoch: up to MaxReplaySamples
// samples), and a ShuffleDALI reader's start (its list and its buffer's
// fill: at open and after every seek), runs in one of Options.Replays'
// turns; a replay ends with ctx: then it returns false.
func (l *Loader) epochOrder(ctx context.Context, orders *Orders, epoch int, buf []int32) ([]int32, bool) {
	if orders.replays(epoch) {
		if !l.opts.Replays.take(ctx.Done()) {
			return buf, false
		}
		defer l.opts.Replays.give()
	}
	order, ok := orders.epoch(epoch, buf, ctx.Done())
	return l.samples(order), ok
}

// samples maps order's positions in the sampling's list to the map's
// samples (Options.Files), in place, and returns it.
func (l *Loader) samples(order []int32) []int32 {
	if files := l.opts.Files; files != nil {
		for i, s := range order {
			order[i] = files[s]
		}
	}
	return order
}

// finish decides, once the batch's reads are over (ReadBatch returned
// err), whether it will be delivered, and publishes it if so: a batch
// whose reads all succeeded, or, with SkipErrors, one whose failures are
// all per sample (markFailed lists them; the others are delivered). It
// returns why the batch is not delivered, nil when it is.
func (l *Loader) finish(ctx context.Context, b *Batch, err error) error {
	if err != nil && !(l.opts.SkipErrors && l.markFailed(b)) {
		return err
	}
	if b.place.Dense() {
		b.place.Zero = b.Failed // rows are positions
	}
	return l.mem.Publish(ctx, b.Slot, b.place)
}

// fail records the first internal failure (a recovered panic) and logs
// it with its stack; Next returns it from then on.
func (l *Loader) fail(err error, stack []byte) {
	if l.failed.CompareAndSwap(nil, &err) {
		l.log.Error("loader: internal failure; this loader is stopped", "err", err, "stack", string(stack))
	}
}

// failure returns the recorded internal failure, nil when none.
func (l *Loader) failure() error {
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// plan lays the batch's samples out in its slot (batchmem.Placement):
// dense where the memory packs a batch of samples all of one size (and,
// of a tensor map, one dtype, shape and phase: denseRow), each sample
// read into its own row, a repeated padding sample copied from its first
// row by Publish; else ragged, each distinct sample in a room of its own
// (room) at a backend.Align-aligned offset, its bytes at the room's phase,
// and a repeated (padding) sample sharing its first copy.
func (l *Loader) plan(b *Batch, epoch, iter int, idx []int32) {
	b.Epoch, b.Iteration, b.err, b.Errors, b.Failed = epoch, iter, nil, b.Errors[:0], b.Failed[:0]
	b.done = make(chan struct{})
	b.released.Store(false)
	b.Indices = append(b.Indices[:0], idx...)
	b.Labels, b.Offsets, b.Lengths, b.reqs, b.planErr = b.Labels[:0], b.Offsets[:0], b.Lengths[:0], b.reqs[:0], nil
	if g := l.opts.Guard; g != nil && l.opts.Access != nil {
		b.marks = g.Marks() // before Access (which polls): a change it sees only costs a reread
	}
	if l.opts.WebDataset != nil {
		l.admit(b, l.shardsOf(b, idx))
		if b.planErr = l.planWebDataset(b, idx); b.planErr != nil {
			b.reqs, b.place = b.reqs[:0], batchmem.Ragged(0)
		}
		return
	}
	if l.opts.Access != nil {
		keys := make([]int, len(idx))
		for i, si := range idx {
			keys[i] = int(si)
		}
		l.admit(b, keys)
	}
	if l.opts.ROI != nil {
		l.planROI(b, idx)
		b.Shapes = b.roi.shapes
		return
	}
	row, lead := denseRow(l.m, l.desc, len(idx), len(idx), func(i int) *bmap.Sample {
		if b.deniedAt(i) != nil {
			return nil
		}
		return &l.m.Samples[idx[i]]
	})
	if row > 0 {
		l.planDense(b, idx, row, lead)
		return
	}
	base, slot := b.base, b.mem
	var off int64
	for i, si := range idx {
		s := &l.m.Samples[si]
		b.Labels = append(b.Labels, s.Label)
		b.Lengths = append(b.Lengths, s.Size)
		if i > 0 && si == idx[i-1] {
			b.Offsets = append(b.Offsets, b.Offsets[i-1])
			continue
		}
		if err := b.deniedAt(i); err != nil { // an empty room: nothing of its size
			b.Offsets = append(b.Offsets, base+off)
			b.reqs = append(b.reqs, backend.Request{Index: int(si), Sample: s, Err: err})
			continue
		}
		at, n := room(s)
		b.Offsets = append(b.Offsets, base+off+at)
		r := backend.Request{Index: int(si), Sample: s, At: at}
		if slot != nil {
			r.Buf = slot[off : off+n : off+n]
		}
		if b.dev != 0 {
			r.Dev, r.DevRoom = b.dev+uintptr(off+at), n-at
		}
		b.reqs = append(b.reqs, r)
		off += n
	}
	b.place = batchmem.Ragged(off)
}

// planDense lays out a dense batch of samples of row bytes each, whose
// data starts lead bytes into a block of its file: sample i at the
// place's DevOffset(i) in the memory the client maps. In host memory a
// backend reads it there, exactly row bytes (Request.At 0); on the GPU a
// backend writing device memory reads exactly row bytes there, and one
// writing host memory reads it into its room at HostOffset(i) of the
// staging area (4 KiB-aligned, its data at the room's lead, in place for
// O_DIRECT). A repeated (padding) sample is read once: Publish copies its
// row.
func (l *Loader) planDense(b *Batch, idx []int32, row, lead int64) {
	b.repeats = b.repeats[:0]
	p := batchmem.Placement{Rows: len(idx), Row: row, Lead: lead}
	host := !l.desc.Kind.OnGPU()
	pitch := p.Pitch()
	first := 0 // the row of the run of equal samples i is in
	for i, si := range idx {
		s := &l.m.Samples[si]
		b.Labels = append(b.Labels, s.Label)
		b.Lengths = append(b.Lengths, s.Size)
		b.Offsets = append(b.Offsets, b.base+p.DevOffset(i))
		if i > 0 && si == idx[i-1] {
			b.repeats = append(b.repeats, batchmem.Repeat{Row: i, Of: first})
			continue
		}
		first = i
		r := backend.Request{Index: int(si), Sample: s, Err: b.deniedAt(i)} // refused: not read, its row zeroed
		switch {
		case host:
			d := p.DevOffset(i)
			r.Buf = b.mem[d : d+row : d+row]
		default:
			r.Dev, r.DevRoom = b.dev+uintptr(p.DevOffset(i)), row
			if b.mem != nil {
				h := p.HostOffset(i)
				r.Buf, r.At = b.mem[h:h+pitch:h+pitch], lead
			}
		}
		b.reqs = append(b.reqs, r)
	}
	p.Repeats = b.repeats
	b.place = p
}

// scrub zeroes what of each sample's room in host memory (batch memory,
// or the GPU memory's staging area that Publish copies) no client may
// read: a failed sample's whole room (it may hold bytes read before the
// failure was found, of blocks the file no longer owns) and every other
// sample's slack before and after its bytes (reads may run into it: a
// tensor's header, the file's last block; and earlier batches' bytes
// would stay). The reads are over: ReadBatch has returned. Its cost:
// docs/decisions.md#slack-is-zeroed-not-left. Device memory a backend
// wrote itself has no host room: there Publish zeroes a dense batch's
// failed rows (batchmem.Placement.Zero).
func scrub(reqs []backend.Request) {
	for i := range reqs {
		r := &reqs[i]
		if r.Err != nil {
			clear(r.Buf)
			continue
		}
		if len(r.Buf) == 0 {
			continue
		}
		clear(r.Buf[:r.At])
		if end := r.At + r.Sample.Size; int64(len(r.Buf)) > end {
			clear(r.Buf[end:])
		}
	}
}

// Next returns the next batch, or io.EOF once at the end of each epoch
// (the call after it starts the next epoch). A failed read returns an error
// naming the sample; that batch is skipped and the next call goes on.
func (l *Loader) Next(ctx context.Context) (*Batch, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if err := l.failure(); err != nil {
		return nil, err
	}
	if l.pendingEOF {
		l.pendingEOF = false
		l.setPos(l.epoch+1, 0)
		return nil, io.EOF
	}
	b := l.waiting
	if b == nil {
		select {
		case b = <-l.ready:
			if b == nil {
				if err := l.failure(); err != nil {
					return nil, err
				}
				return nil, ErrClosed
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	select {
	case <-b.done:
		l.waiting = nil
	case <-ctx.Done():
		l.waiting = b
		return nil, ctx.Err()
	}
	l.setPos(b.Epoch, b.Iteration+1)
	if l.next >= l.smp.EpochBatches(l.epoch) {
		l.pendingEOF = true
	}
	if b.err != nil { // not delivered (finish)
		err := fmt.Errorf("loader: epoch %d batch %d: %w", b.Epoch, b.Iteration, b.err)
		b.Release()
		return nil, err
	}
	return b, nil
}

// markFailed zeroes the lengths of failed samples and lists their errors
// and positions; it reports false when the failure is not per sample (e.g.
// cancellation).
func (l *Loader) markFailed(b *Batch) bool {
	b.Errors, b.Failed = b.Errors[:0], b.Failed[:0]
	if l.opts.WebDataset != nil {
		return l.markFailedWebDataset(b)
	}
	for _, r := range b.reqs {
		if r.Err == nil {
			continue
		}
		var se *backend.SampleError
		if !errors.As(r.Err, &se) {
			return false
		}
		if l.opts.ROI != nil && slices.ContainsFunc(b.Failed, func(i int) bool { return int(b.Indices[i]) == r.Index }) {
			continue // another part of a sample already failed
		}
		b.Errors = append(b.Errors, r.Err)
		for i, idx := range b.Indices {
			if int(idx) == r.Index {
				b.Lengths[i] = 0
				b.Failed = append(b.Failed, i)
			}
		}
	}
	return len(b.Errors) > 0
}

// NextAt returns batch iteration of epoch (what DALI's BatchInfo names),
// or io.EOF when the epoch has no such batch; the following Next calls go
// on from there. Asking for the batch Next would return costs nothing
// more than Next; any other position discards the batches read ahead and
// starts reading there (the sequence is a function of the epoch, so this
// is a seek, not a replay; with ShuffleDALI the epochs before it are
// replayed, at most MaxReplaySamples samples).
func (l *Loader) NextAt(ctx context.Context, epoch, iteration int) (*Batch, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if err := l.failure(); err != nil {
		return nil, err
	}
	if err := CheckPosition(epoch, iteration); err != nil {
		return nil, fmt.Errorf("loader: %w", err)
	}
	if err := l.smp.checkReplay(epoch); err != nil {
		return nil, fmt.Errorf("loader: %w", err)
	}
	if iteration >= l.smp.EpochBatches(epoch) {
		l.seek(epoch+1, 0)
		return nil, io.EOF
	}
	l.seek(epoch, iteration)
	return l.Next(ctx)
}

// seek makes (epoch, batch) the next batch Next returns.
func (l *Loader) seek(epoch, batch int) {
	ne, nb := l.epoch, l.next // what Next returns next
	if l.pendingEOF {
		ne, nb = ne+1, 0
	}
	if l.waiting != nil {
		ne, nb = l.waiting.Epoch, l.waiting.Iteration
	}
	l.pendingEOF = false
	l.setPos(epoch, batch)
	if ne == epoch && nb == batch {
		return
	}
	l.stop()
	l.start(epoch, batch)
}

// setPos sets the consumer position.
func (l *Loader) setPos(epoch, next int) {
	l.posMu.Lock()
	l.epoch, l.next = epoch, next
	l.posMu.Unlock()
}

// State returns the position of the next batch Next will return. It may
// be called from any goroutine.
func (l *Loader) State() State {
	l.posMu.Lock()
	defer l.posMu.Unlock()
	return State{Version: l.smp.version(l.epoch), Sampling: l.smp, Epoch: l.epoch, Batch: l.next, Stages: l.smp.Stages(l.epoch)}
}

// Sampling returns the loader's sampling options.
func (l *Loader) Sampling() Sampling { return l.smp }

// Memory returns the batch memory.
func (l *Loader) Memory() batchmem.Memory { return l.mem }

// Backend returns the backend.
func (l *Loader) Backend() backend.Backend { return l.backend }

// Spec returns the backend's description: what it can do.
func (l *Loader) Spec() backend.Spec { return *l.spec }

// BackendWhy returns why the loader reads with its backend when its
// options named none (the fastest the map and the process allow: see
// AutoBackend); "" when they named it.
func (l *Loader) BackendWhy() string { return l.backendWhy }

// GPUPath returns how batches reach GPU memory — GPUPathCuFile (the
// backend writes the device) or GPUPathBounce (a staging copy per batch)
// — and why that path was taken; "" and "" for host memory.
func (l *Loader) GPUPath() (path, why string) { return l.gpuPath, l.gpuWhy }

// BackendOptions returns the backend's options, defaults filled in.
func (l *Loader) BackendOptions() map[string]any { return l.params.Map() }

// Close stops prefetching, waits for reads in flight, and frees the batch
// memory. Batches not yet released become invalid.
func (l *Loader) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	l.cancel()
	l.stop() // waits for reads started before the cancel
	return errors.Join(l.backend.Close(), l.mem.Close())
}
