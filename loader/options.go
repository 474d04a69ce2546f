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

// Defaults and bounds of Options.
const (
	// DefaultPrefetchQueueDepth is the batches read ahead by default, as in DALI.
	DefaultPrefetchQueueDepth = 2
	// MaxPrefetchQueueDepth bounds Options.PrefetchQueueDepth.
	MaxPrefetchQueueDepth = 64
)

// How batches reach GPU memory (Options.GPUPath). The values are the wire names.
const (
	GPUPathAuto   = "auto"   // cufile when a backend writing the device (the built-in cufile) opens here and no other backend is named, else bounce
	GPUPathCuFile = "cufile" // a backend that writes the device (backend.Spec.DeviceWrites: the built-in cufile) reads each sample straight into the device slot
	GPUPathBounce = "bounce" // any backend reads into page-locked staging memory, copied to the device per batch
)

// Options configures a Loader. Names follow DALI's reader arguments.
// WithDefaults fills in defaults and Validate checks bounds; New does both.
type Options struct {
	ReaderArgs                       // batch_size (required), shard_id, num_shards (0 means 1), random_shuffle, seed, pad_last_batch, stick_to_shard, shuffle ("" means permute), initial_fill (0 means 1024)
	PrefetchQueueDepth int           // batches read ahead, at most MaxPrefetchQueueDepth; 0 means DefaultPrefetchQueueDepth
	ReleaseAfter       int           // batches the consumer holds beyond the one in use (it releases a batch after this many later ones), at most MaxReleaseAfter
	Slots              int           // batch slots; 0 means PrefetchQueueDepth+ReleaseAfter+1: each batch the consumer holds unreleased needs one beyond the prefetch depth.
	SlotSize           int64         // bytes per slot; 0 means SlotBytes(m, BatchSize)
	Memory             batchmem.Kind // "" means batchmem.Pinned
	Device             int           // the GPU ordinal for GPU memory (unless DeviceUUID names the GPU)
	// DeviceUUID names the GPU by its UUID; Device is then ignored.
	DeviceUUID string
	// GPUPath is how batches reach GPU memory: cufile, bounce, or auto ("" too).
	GPUPath string
	Backend string // a name from Backends; "" means the fastest the map allows (AutoBackend, else DefaultBackend: Loader.BackendWhy says which and why), or with GPUPath auto the cufile backend first (ignored when Spec is set)
	// Spec is the backend's description; nil: BackendSpec(Backend).
	Spec *backend.Spec
	// BackendOptions are the backend's options by name; missing ones take defaults.
	BackendOptions map[string]any
	// ROI, if set, reads each tensor sample as this region, packed C-contiguous.
	// Host memory only; nil: whole arrays.
	ROI        *ROI
	SkipErrors bool         // deliver a batch whose samples partly failed: failed samples have length 0 and are listed in Batch.Errors
	State      *State       // resume from this state
	Logger     *slog.Logger // default slog.Default()
	Trace      io.Writer    // raw backends write every device read here as a fio iolog (v2)
	// WebDataset, if set, serves its selection of a webdataset map.
	// The map given to New must be its Shards. Each sample has K outputs and no label.
	WebDataset *WebDataset
	// Guard is the map's freshness state shared by loaders; nil: raw backends make their own.
	Guard *fresh.Guard
	// Shared lets loaders share raw engines; nil: each loader has its own.
	Shared *Shared
	// Devices lets loaders split each block device's queue among their own
	// raw engines; nil: each engine keeps its own depth in flight.
	Devices *Devices
	// Cred is who the loader reads for: every open is made as this user.
	// nil: the process's own credentials.
	Cred *backend.Cred
	// CUDA is the process's CUDA libraries; nil: each GPU loader finds them.
	CUDA *cuda.Libs
	// Replays bounds the ShuffleDALI replays at once among loaders sharing it; nil: no bound.
	Replays *Replays
	// SlotSizes shares the slot size by batch size among plans over one map; nil: each works it out.
	SlotSizes *SlotSizes
	// Access, when set, is asked before each batch's reads which samples may not be read.
	// Each refused sample fails and no byte of it reaches the batch memory.
	// With Guard, it is asked again and the batch read again when the
	// guard's Marks moved meanwhile (a mount beneath the root).
	Access func(samples []int) []Refused
	// Files, when set, lists the map's samples to read, in order: DALI's files=.
	// Nil: the whole map.
	Files []int32

	// checked is what Check checked; NewPlan trusts it while those fields are unchanged.
	checked *checkedFields

	// openMemory replaces batchmem.Open in the loader's tests; nil elsewhere.
	openMemory func(kind batchmem.Kind, slots int, slotSize int64, o batchmem.Options) (batchmem.Memory, error)
}

// Refused is a sample Options.Access refuses: its position, its path and why.
type Refused struct {
	At   int
	Path string
	Err  error
}

// Shared is what loaders given the same *Shared share: the raw engines.
// The zero value is ready to use; it is safe for concurrent use.
type Shared struct{ s shared.Shared }

// Len returns how many resources are shared now.
func (s *Shared) Len() int { return s.s.Len() }

// Devices is what loaders given the same *Devices share: each block
// device's request queue, its tags split among their raw engines.
// The zero value is ready to use; it is safe for concurrent use.
type Devices struct{ s shared.Shared }

// Len returns how many devices are shared now.
func (d *Devices) Len() int { return d.s.Len() }

// Replays bounds how many ShuffleDALI replays run at once among the loaders sharing it.
// A replay goes through every epoch before a resumed or sought one; a reader's start counts too.
// It waits for a turn while all are taken, or until its loader closes or seeks.
// Safe for concurrent use.
type Replays struct{ turns chan struct{} }

// NewReplays returns a bound of n replays at once (at least 1).
func NewReplays(n int) *Replays { return &Replays{turns: make(chan struct{}, max(n, 1))} }

// Running returns how many replays hold a turn now.
func (r *Replays) Running() int { return len(r.turns) }

// take waits for a turn; false when stop closed first. A nil Replays always has one.
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

// WithDefaults returns o with the zero fields that have a dataset-free default filled in.
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

// Batch memory's vocabulary as the loader's callers name it.
type (
	// MemoryKind says where batch memory lives (Options.Memory).
	MemoryKind = batchmem.Kind
	// MemoryDesc describes a loader's batch memory to a client (Loader.Memory().Desc()).
	MemoryDesc = batchmem.Desc
)

// Bounds of a Request beyond those of Options.
const (
	// MaxReleaseAfter bounds Request.ReleaseAfter and Options.ReleaseAfter.
	MaxReleaseAfter = 64
	// MaxSlots is the most batch slots: prefetched, held, and the one just delivered.
	MaxSlots = MaxPrefetchQueueDepth + MaxReleaseAfter + 1
	// MaxDevice bounds Request.Device: a CUDA device ordinal.
	MaxDevice = 1023
	// MaxBackendOptions bounds the entries of Request.BackendOptions.
	MaxBackendOptions = 64
)

// checkPrefetch checks a prefetch depth: in [1, MaxPrefetchQueueDepth].
func checkPrefetch(n int) error {
	if n < 1 || n > MaxPrefetchQueueDepth {
		return fmt.Errorf("%w: prefetch_queue_depth %d not in [1, %d]", ErrOptions, n, MaxPrefetchQueueDepth)
	}
	return nil
}

// MaxDeviceUUID bounds DeviceUUID's length; a GPU UUID has 40 characters.
const MaxDeviceUUID = 64

// checkDeviceUUID checks DeviceUUID's form: letters, digits and dashes, at most MaxDeviceUUID.
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
