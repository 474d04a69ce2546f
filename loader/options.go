// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
	"github.com/nvfeed/nvfeed/loader/internal/shared"
)

// Defaults and bounds of Options (Options.WithDefaults and
// Options.Validate apply them; the sampling bounds are in validate.go).
const (
	// DefaultPrefetchQueueDepth is the batches read ahead when
	// Options.PrefetchQueueDepth is 0 (DALI's default too).
	DefaultPrefetchQueueDepth = 2
	// MaxPrefetchQueueDepth bounds Options.PrefetchQueueDepth.
	MaxPrefetchQueueDepth = 64
)

// How batches reach GPU memory (Options.GPUPath); the loader's choice is
// Loader.GPUPath. The values are the daemon's wire names.
const (
	GPUPathAuto   = "auto"   // cufile when a backend writing the device (the built-in cufile) opens here and no other backend is named, else bounce
	GPUPathCuFile = "cufile" // a backend that writes the device (backend.Spec.DeviceWrites: the built-in cufile) reads each sample straight into the device slot
	GPUPathBounce = "bounce" // any backend reads into page-locked staging memory, copied to the device per batch
)

// Options configures a Loader. Names follow DALI's reader arguments.
// WithDefaults fills in the zero fields that have defaults, Validate
// checks every bound that needs no dataset; New does both.
type Options struct {
	ReaderArgs                       // batch_size (required), shard_id, num_shards (0 means 1), random_shuffle, seed, pad_last_batch, stick_to_shard, shuffle ("" means permute), initial_fill (0 means 1024)
	PrefetchQueueDepth int           // batches read ahead, at most MaxPrefetchQueueDepth; 0 means DefaultPrefetchQueueDepth
	ReleaseAfter       int           // batches the consumer holds beyond the one in use (it releases a batch after this many later ones), at most MaxReleaseAfter
	Slots              int           // batch slots; 0 means PrefetchQueueDepth+ReleaseAfter+1: each batch the consumer holds unreleased needs one beyond the prefetch depth.
	SlotSize           int64         // bytes per slot; 0 means SlotBytes(m, BatchSize)
	Memory             batchmem.Kind // "" means batchmem.Pinned
	Device             int           // the GPU ordinal for GPU memory (unless DeviceUUID names the GPU)
	// DeviceUUID names the GPU of GPU memory by its UUID (GPU-xxxxxxxx-...,
	// as cuDeviceGetUuid and nvidia-smi give it), the same in every
	// process: this process's ordinal for it is looked up and Device is
	// ignored. A GPU not here is ErrUnknownGPU.
	DeviceUUID string
	// GPUPath is how batches reach GPU memory (Memory batchmem.GPU only):
	// GPUPathCuFile, GPUPathBounce, or GPUPathAuto ("" too), which tries
	// cufile and falls back to bounce where cuFile cannot run.
	GPUPath string
	Backend string // a name from Backends; "" means the fastest the map allows (AutoBackend, else DefaultBackend: Loader.BackendWhy says which and why), or with GPUPath auto the cufile backend first (ignored when Spec is set)
	// Spec is the backend's description when the caller has already looked
	// it up (BackendSpec) or brings its own; nil: BackendSpec(Backend).
	Spec *backend.Spec
	// BackendOptions are the backend's options by name (see its
	// backend.Spec); missing ones take their defaults.
	BackendOptions map[string]any
	// ROI, if set, reads each tensor sample as this region of interest
	// (fn.readers.numpy's roi_* arguments), packed C-contiguous: host
	// memory only, a tensor map's samples all within it (ROISlotBytes
	// checks each). nil: whole arrays.
	ROI        *ROI
	SkipErrors bool         // deliver a batch whose samples partly failed: failed samples have length 0 and are listed in Batch.Errors
	State      *State       // resume from this state
	Logger     *slog.Logger // default slog.Default()
	Trace      io.Writer    // raw backends write every device read here as a fio iolog (v2)
	// WebDataset, if set, makes the loader serve its selection of a
	// webdataset map: the map New is given must be its Shards (the tars,
	// which the backend reads byte ranges of and Guard guards); each
	// sample's K outputs lie in rooms of their own, Batch.Offsets and
	// Lengths K a sample (Batch.Output), no labels; the sampling is
	// Sampling.WebDataset's.
	WebDataset *WebDataset
	// Guard is the map's freshness state shared by several loaders (the
	// daemon keeps one per dataset); nil: raw backends make their own.
	Guard *fresh.Guard
	// Shared lets loaders share backend resources (the daemon: one raw
	// engine per device for all sessions); nil: each loader has its own.
	Shared *Shared
	// Cred is who the loader reads for: every filesystem open is made as
	// this user (the kernel checks it) and a raw sample whose file changed
	// is read only after the user's check passes; nil: the process's own
	// credentials. The daemon sets it to its client's.
	Cred *backend.Cred
	// CUDA is the process's CUDA libraries, discovered once (the daemon
	// holds one for its life) and used by GPU memory and the cufile
	// backend; nil: each GPU loader discovers them again.
	CUDA *cuda.Libs
	// Replays bounds the ShuffleDALI replays that run at once among the
	// loaders given the same *Replays (the daemon: one per uid); nil: no
	// bound.
	Replays *Replays
	// SlotSizes keeps the slot size NewPlan works out for a batch size
	// (SlotBytes: a pass over every sample of the map) for the plans given
	// the same *SlotSizes over the same map (the daemon: one per dataset,
	// so the ranks of a job opening together pay for it once); nil: each
	// plan works it out.
	SlotSizes *SlotSizes
	// Access, when set, is asked before each batch's reads which of its
	// samples (indices into the map) may be read: it returns those that
	// must not be, each failing (a *backend.SampleError: with SkipErrors,
	// a failed sample of the batch), and those are not read — no byte of
	// theirs reaches the batch memory. The daemon checks there, as
	// samples are first read, that its client may open each one.
	Access func(samples []int) []Refused
	// Files, when set, are the map's samples this loader reads (indices
	// into the map's Samples, repeats allowed), in this order: the
	// sampling's dataset is this list (DALI's files=), its sample i
	// the map's sample Files[i]. Nil: the whole map.
	Files []int32

	// checked is what Check checked of these options. NewPlan takes
	// them as they are while those fields are unchanged.
	checked *checkedFields

	// openMemory opens the batch memory in place of batchmem.Open: the
	// loader's tests give it GPU memory on a machine without a GPU. nil
	// everywhere else.
	openMemory func(kind batchmem.Kind, slots int, slotSize int64, o batchmem.Options) (batchmem.Memory, error)
}

// Refused is a sample Options.Access refuses: its position in the
// samples asked about, its path as the error may show it, and why.
type Refused struct {
	At   int
	Path string
	Err  error
}

// Shared is what loaders given the same *Shared share: the raw backends'
// engines, one per device and configuration. The zero value is ready to
// use; it is safe for concurrent use.
type Shared struct{ s shared.Shared }

// Len returns how many resources are shared now.
func (s *Shared) Len() int { return s.s.Len() }

// Replays bounds how many ShuffleDALI replays run at once among the
// loaders that share it (Options.Replays). A replay — reaching a resumed
// or sought epoch by going through every epoch before it, up to
// MaxReplaySamples samples, one CPU core for tens of seconds at worst;
// also a reader's start, at open or after any seek: its file list and
// its buffer's fill, up to MaxInitialFill samples — takes one of its
// turns first, waiting for one while all are taken (or
// until its loader closes or seeks elsewhere), and gives it back when it
// ends. Safe for concurrent use.
type Replays struct{ turns chan struct{} }

// NewReplays returns a bound of n replays at once (at least 1).
func NewReplays(n int) *Replays { return &Replays{turns: make(chan struct{}, max(n, 1))} }

// Running returns how many replays hold a turn now.
func (r *Replays) Running() int { return len(r.turns) }

// take waits for a turn; false when stop closed first. A nil Replays
// always has one.
func (r *Replays) take(stop <-chan struct{}) bool {
	if r == nil {
		return true
	}
	select {
	case r.turns <- struct{}{}:
		return true
	case <-stop:
		return false
	}
}

// give gives a turn back.
func (r *Replays) give() {
	if r != nil {
		<-r.turns
	}
}

// WithDefaults returns o with every zero field that has a default and
// needs no dataset filled in: NumShards, Shuffle, InitialFill,
// PrefetchQueueDepth, Slots, Memory, GPUPath (for GPU memory) and Logger.
// SlotSize's default needs the map: NewPlan fills it in.
func (o Options) WithDefaults() Options {
	o.ReaderArgs = o.ReaderArgs.withDefaults()
	if o.PrefetchQueueDepth == 0 {
		o.PrefetchQueueDepth = DefaultPrefetchQueueDepth
	}
	if o.Slots == 0 {
		o.Slots = o.PrefetchQueueDepth + o.ReleaseAfter + 1
	}
	o.Memory = o.Memory.OrDefault()
	if o.GPUPath == "" && o.Memory.OnGPU() {
		o.GPUPath = GPUPathAuto
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Batch memory's vocabulary as the loader's callers name it (package
// batchmem has the rest).
type (
	// MemoryKind says where batch memory lives (Options.Memory).
	MemoryKind = batchmem.Kind
	// MemoryDesc describes a loader's batch memory to a client (Loader.Memory().Desc()).
	MemoryDesc = batchmem.Desc
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

// checkPrefetch checks a prefetch depth: in [1, MaxPrefetchQueueDepth].
func checkPrefetch(n int) error {
	if n < 1 || n > MaxPrefetchQueueDepth {
		return fmt.Errorf("%w: prefetch_queue_depth %d not in [1, %d]", ErrOptions, n, MaxPrefetchQueueDepth)
	}
	return nil
}

// MaxDeviceUUID bounds DeviceUUID's length (a GPU UUID is 40 characters,
// GPU- and 36).
const MaxDeviceUUID = 64

// checkDeviceUUID checks DeviceUUID's form: letters, digits and dashes,
// at most MaxDeviceUUID of them. Whether the GPU is here is batch
// memory's to say.
func checkDeviceUUID(u string) error {
	if len(u) > MaxDeviceUUID {
		return fmt.Errorf("%w: device_uuid of %d characters, at most %d", ErrOptions, len(u), MaxDeviceUUID)
	}
	for _, c := range u {
		if !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("%w: device_uuid %q: want a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", ErrOptions, u)
		}
	}
	return nil
}

// checkedFields are the fields of Options that Validate reads.
type checkedFields struct {
	ReaderArgs
	prefetch, release, slots int
	memory                   batchmem.Kind
	uuid, gpuPath, backend   string
	spec                     *backend.Spec
	roi                      *ROI
	state                    *State
}

// fields returns the fields of o that Validate reads, for Check.
func (o Options) fields() checkedFields {
	return checkedFields{ReaderArgs: o.ReaderArgs, prefetch: o.PrefetchQueueDepth, release: o.ReleaseAfter, slots: o.Slots,
		memory: o.Memory, uuid: o.DeviceUUID, gpuPath: o.GPUPath, backend: o.Backend, spec: o.Spec, roi: o.ROI, state: o.State}
}
