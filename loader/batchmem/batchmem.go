// SPDX-License-Identifier: Apache-2.0

// Package batchmem is batch memory: the fixed set of equal slots that
// batches land in, allocated once per loader, and the only place that
// knows the kinds of memory (page-locked host memory, GPU memory) and how
// each is handed to a client process (a file descriptor).
//
// # The contract
//
// A Memory has Desc().Slots slots of Desc().SlotSize bytes; slot i starts
// at byte i·SlotSize of the memory a client maps. The loader owns the
// slots' turns; for each batch in slot i:
//
//  1. The loader takes slot i only after the consumer has released the
//     batch that used it before (never two batches in one slot).
//  2. Writers (the backend's reads) write only into Slot(i), only where
//     the batch's Placement puts its samples, and only between the loader
//     taking the slot and every read having completed. Slot(i) is the
//     same Region for the life of the Memory.
//  3. The loader calls Publish(ctx, i, p) once, after every write has
//     completed and before the batch is handed out, with the batch's
//     Placement. When Publish returns nil, the batch is in the memory the
//     client maps as p lays it out (for host memory it already was; for
//     GPU memory any staging copy, packing, zeroing and repeating is
//     complete) and nothing writes those bytes again until the slot's
//     next turn. When it returns an error, the batch must not be handed
//     out; the slot may be used again.
//  4. The consumer reads bytes of slot i only between a nil Publish and
//     its release of the batch.
//
// # Placement
//
// A batch is ragged or dense (Placement). Ragged: each sample has a room
// starting backend.Align-aligned in the slot, where its writer put it,
// and the client finds it there. Dense (Desc.PacksAt), when every sample of
// the batch has the same size S (the loader decides when: in GPU memory,
// and in host memory for tensors): sample i is at byte Lead + i·S of the
// slot, so the batch is one (batch, S) array there; Lead (< 4 KiB) is the
// rows' phase, their data's offset in their files modulo 4 KiB, so that
// blocks of the files land in place. In host memory writers write each
// row there, exactly S bytes, and Publish copies repeated rows and zeroes
// failed ones. In GPU memory a backend that writes device memory writes
// sample i there, exactly S bytes; one that writes host memory writes it
// at Lead + i·Pitch of the staging area (4 KiB-aligned rooms of
// AlignUp(Lead+S) bytes, the data at the same phase as in its file, as
// O_DIRECT needs), and Publish packs the rows while copying, in one 2D
// copy.
//
// Memory methods other than Publish may be called from any goroutine;
// Publish of different slots may run at once. Close must not be called
// while a write or Publish runs.
package batchmem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// Kind says where batch memory lives. Its values are the wire names.
type Kind string

// Memory kinds.
const (
	Pinned Kind = "pinned" // page-locked host memory (a memfd); not CUDA-registered (see openHost)
	GPU    Kind = "gpu"    // device memory on one GPU
)

// OrDefault returns k, or Pinned for "".
func (k Kind) OrDefault() Kind {
	if k == "" {
		return Pinned
	}
	return k
}

// Check returns an error wrapping ErrKind for a kind not offered.
// The empty kind is Pinned.
func (k Kind) Check() error {
	switch k {
	case "", Pinned, GPU:
		return nil
	}
	return fmt.Errorf("%w %q (want %s or %s)", ErrKind, k, Pinned, GPU)
}

// OnGPU reports whether memory of kind k lives on a GPU.
// Batches then reach it by a GPU path.
func (k Kind) OnGPU() bool { return k == GPU }

// PacksFiles reports whether k places a batch of whole files dense.
// GPU memory does: a client gets a (batch, size) array.
// Host memory packs only tensors.
func (k Kind) PacksFiles() bool { return k == GPU }

// Desc describes a Memory to a client: the wire form (msgpack) that goes
// with its file descriptor, unchanged.
type Desc struct {
	Kind     Kind  `msgpack:"kind" json:"kind"`
	Size     int64 `msgpack:"size" json:"size"`           // bytes to map
	SlotSize int64 `msgpack:"slot_size" json:"slot_size"` // slot i starts at i·SlotSize
	Slots    int   `msgpack:"slots" json:"slots"`
	Device   int   `msgpack:"device" json:"device"` // the GPU's ordinal for GPU memory, as this process numbers it; -1 for host memory
	// UUID names the GPU of GPU memory the same way in every process
	// (GPU-xxxxxxxx-...; ordinals differ with CUDA_VISIBLE_DEVICES): a
	// client imports the memory on the device with this UUID. "" for host
	// memory.
	UUID string `msgpack:"uuid" json:"uuid"`
	// NUMANode is the node the memory (GPU memory: its GPU and staging
	// area) is placed on; -1 unknown or not placed.
	NUMANode int `msgpack:"numa_node" json:"numa_node"`
}

// Region is one slot: where writers put a batch's bytes. Host is the
// host-addressable view (backend.Align-aligned) that backends writing
// host memory read into: the slot itself for host memory, its staging
// area for GPU memory filled by such a backend. Dev is the slot's device
// address for GPU memory (0 for host memory); a backend that writes
// device memory (its Spec says DeviceWrites) writes there, and Host is
// then nil.
type Region struct {
	Host []byte
	Dev  uintptr
}

// Memory is batch memory (see the package's contract).
type Memory interface {
	// Desc describes the memory.
	Desc() Desc
	// Slot returns slot i's region.
	Slot(i int) Region
	// Publish makes the batch in slot i, laid out as p says, visible to
	// the consumer.
	Publish(ctx context.Context, i int, p Placement) error
	// Export returns a new file descriptor through which a client maps the
	// whole memory, read-only where the kind allows. The caller owns it
	// and closes it once passed on.
	Export() (*os.File, error)
	// Pinned returns nil when the memory is page-locked (always for GPU
	// memory), else why not.
	Pinned() error
	// Close frees the memory. A client's mapping outlives it.
	Close() error
}

// Options configures Open.
type Options struct {
	// Device is the GPU ordinal for GPU memory, unless DeviceUUID names
	// the GPU.
	Device int
	// DeviceUUID, when set, names the GPU by its UUID (as cuDeviceGetUuid
	// gives it, nvidia-smi's GPU-... form; case and the GPU- prefix do not
	// matter): its ordinal in this process is looked up, and Device is
	// ignored. A GPU this process does not see is ErrUnknownGPU.
	DeviceUUID string
	// DeviceWrites says the backend writes device memory itself (its
	// Spec's DeviceWrites): GPU memory then needs no host staging area.
	DeviceWrites bool
	// Logger, default slog.Default().
	Logger *slog.Logger
	// CUDA is the process's CUDA libraries, discovered once (the daemon
	// holds one for its life); nil: GPU memory discovers them again for
	// this Open (cuda.SearchFromEnv).
	CUDA *cuda.Libs
}

// Errors callers branch on.
var (
	// ErrKind is returned (wrapped) for an unknown kind.
	ErrKind = errors.New("unknown memory kind")
	// ErrNoCUDA is returned (wrapped) for GPU memory on a machine without
	// an NVIDIA driver.
	ErrNoCUDA = errors.New("no CUDA driver found")
	// ErrUnsupported is returned (wrapped) for a kind this build cannot
	// make on this machine.
	ErrUnsupported = errors.New("memory kind not supported")
	// ErrNoSpace is returned (wrapped) when the memory asked for is more
	// than the machine has available.
	ErrNoSpace = errors.New("no room for batch memory")
	// ErrUnknownGPU is returned (wrapped) when the GPU asked for (its UUID
	// or ordinal) is not one this process sees; the message lists those
	// it sees.
	ErrUnknownGPU = errors.New("no such GPU here")
)

// Granularity is what the sizes of batch memory's allocations are
// rounded up to: 2 MiB, the huge page of x86-64 (and of arm64 with 4 KiB
// pages) and the VMM allocation granularity of NVIDIA GPUs (and of the
// CUDA stand-in). A device that rounds further is refused (openGPU), so
// that what Sizing says is what Open holds.
const Granularity = 2 << 20

// Sizes is what Open(kind, slots, slotSize) allocates, as Sizing
// computes it before any allocation (the loader's plan, the daemon's
// budgets): the slot size (rounded up to backend.Align), the page-locked
// host bytes (host memory, or GPU memory's staging area) and the device
// bytes (rounded up to Granularity as Sizing says).
type Sizes struct {
	SlotSize int64 // Desc.SlotSize
	Host     int64 // page-locked host memory: Desc.Size of host memory, or GPU memory's staging area
	Device   int64 // device memory: Desc.Size of GPU memory
}

// Sizing returns what Open allocates for slots slots of at least
// slotSize bytes of kind ("" means Pinned) for a backend that writes
// device memory itself (deviceWrites) or not: host memory is slots ×
// SlotSize, rounded up to Granularity from Granularity on (so that it
// may go on huge pages; smaller memory stays on small pages, exact); GPU
// memory is slots × SlotSize rounded up to Granularity, device bytes,
// and, unless deviceWrites, a page-locked staging area of the same size.
// Open allocates with it; errors wrap ErrKind for an unknown kind.
func Sizing(kind Kind, slots int, slotSize int64, deviceWrites bool) (Sizes, error) {
	if slots <= 0 || slotSize <= 0 || slotSize > (1<<62)/int64(slots) {
		return Sizes{}, fmt.Errorf("batchmem: %d slots of %d bytes", slots, slotSize)
	}
	s := Sizes{SlotSize: backend.AlignUp(slotSize)}
	n := int64(slots) * s.SlotSize
	size := (n + Granularity - 1) / Granularity * Granularity
	switch kind {
	case "", Pinned:
		s.Host = n
		if n >= Granularity { // on huge pages where they are free
			s.Host = size
		}
	case GPU:
		s.Device = size
		if !deviceWrites {
			s.Host = size
		}
	default:
		return Sizes{}, fmt.Errorf("batchmem: %w", kind.Check())
	}
	return s, nil
}

// Open allocates slots slots of at least slotSize bytes each (rounded up
// to backend.Align) of the given kind ("" means Pinned): what Sizing
// says, exactly.
func Open(kind Kind, slots int, slotSize int64, o Options) (Memory, error) {
	s, err := Sizing(kind, slots, slotSize, o.DeviceWrites)
	if err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if kind == GPU {
		return openGPU(slots, s, o)
	}
	return openHost(slots, s.SlotSize, s.Host, o, -1)
}

// MaxRow bounds a dense row's staging room (backend.AlignUp of the
// samples' size): cudaMemcpy2DAsync refuses a pitch above the device's
// cudaDevAttrMaxPitch, which deviceQuery reports as 2147483647 bytes on
// current GPUs. Batches of larger samples stay ragged.
const MaxRow = 1<<31 - 1

// Placement is how one batch lies in its slot (see the package's
// Placement section): what writers were told and what Publish makes
// visible. Rows == 0 means ragged, Rows > 0 dense.
type Placement struct {
	// Used is, for a ragged batch, the bytes [0, Used) of the slot that
	// its samples' rooms take: Publish makes them visible where they lie.
	Used int64
	// Rows is a dense batch's number of samples (0: ragged) and Row each
	// one's size in bytes (> 0). Sample i is at DevOffset(i) in the
	// memory the client maps, and, for a writer of GPU memory's host
	// staging area, in its room at HostOffset(i) of the slot's
	// Region.Host, Lead bytes in.
	Rows int
	Row  int64
	// Lead is a dense batch's phase, in [0, backend.Align): where row 0
	// starts in the slot, and each row's data in its staging room.
	Lead int64
	// Zero lists the dense rows whose writer left them unfilled (failed
	// samples): Publish makes them read zeros, never another sample's or
	// an older batch's bytes. Repeats lists the dense rows that hold the
	// same sample as an earlier row (padding, read once): Publish copies
	// the earlier row there. Zero is applied first.
	Zero    []int
	Repeats []Repeat
}

// Repeat says dense row Row holds the same sample as row Of.
type Repeat struct{ Row, Of int }

// Ragged returns the placement of a ragged batch whose rooms take bytes
// [0, used) of its slot.
func Ragged(used int64) Placement { return Placement{Used: used} }

// Dense reports whether the placement is dense.
func (p Placement) Dense() bool { return p.Rows > 0 }

// DevOffset returns dense row i's offset in its slot in the memory the
// client maps: Lead + i·Row, the rows back to back.
func (p Placement) DevOffset(i int) int64 { return p.Lead + int64(i)*p.Row }

// Pitch returns the size of a dense row's room in GPU memory's host
// staging area: AlignUp(Lead+Row).
func (p Placement) Pitch() int64 { return backend.AlignUp(p.Lead + p.Row) }

// HostOffset returns where dense row i's room starts in its slot's host
// staging area (GPU memory): i·Pitch, every room backend.Align-aligned;
// the row's bytes are Lead bytes in.
func (p Placement) HostOffset(i int) int64 { return int64(i) * p.Pitch() }

// Packs is PacksAt with lead 0: rows of whole files.
func (d Desc) Packs(rows int, row int64) bool { return d.PacksAt(rows, row, 0) }

// PacksAt reports whether a batch of rows samples of row bytes each, lead
// bytes into a block of their files, is placed dense in this memory: row
// > 0, lead in [0, backend.Align), and the rows fit a slot: in host memory
// lead + rows·row bytes, in GPU memory rows·AlignUp(lead+row) (their
// staging rooms), each room at most MaxRow (padding may repeat a large
// sample more often than the slot's size, the sum of the largest rooms,
// allows: such a batch stays ragged). Whether a batch of such samples
// is dense at all is the loader's choice (loader.Batch.Dense).
func (d Desc) PacksAt(rows int, row, lead int64) bool {
	if rows <= 0 || row <= 0 || lead < 0 || lead >= backend.Align {
		return false
	}
	switch d.Kind {
	case GPU:
		pitch := backend.AlignUp(lead + row)
		return pitch <= MaxRow && pitch <= d.SlotSize/int64(rows)
	case Pinned:
		return row <= (d.SlotSize-lead)/int64(rows)
	}
	return false
}

// check returns why p cannot be published in slot i of memory d, nil
// when it can.
func (p Placement) check(d Desc, i int) error {
	if i < 0 || i >= d.Slots {
		return fmt.Errorf("batchmem: publish slot %d: out of range (%d slots)", i, d.Slots)
	}
	if !p.Dense() {
		if p.Used < 0 || p.Used > d.SlotSize || p.Rows < 0 {
			return fmt.Errorf("batchmem: publish %d bytes of slot %d: out of range (slots of %d bytes)", p.Used, i, d.SlotSize)
		}
		return nil
	}
	if !d.PacksAt(p.Rows, p.Row, p.Lead) {
		return fmt.Errorf("batchmem: publish slot %d: %d dense rows of %d bytes at lead %d do not fit %s memory's slots of %d bytes", i, p.Rows, p.Row, p.Lead, d.Kind, d.SlotSize)
	}
	for _, z := range p.Zero {
		if z < 0 || z >= p.Rows {
			return fmt.Errorf("batchmem: publish slot %d: row %d to zero of %d", i, z, p.Rows)
		}
	}
	for _, r := range p.Repeats {
		if r.Row < 0 || r.Row >= p.Rows || r.Of < 0 || r.Of >= p.Rows || r.Of == r.Row {
			return fmt.Errorf("batchmem: publish slot %d: row %d repeating row %d of %d", i, r.Row, r.Of, p.Rows)
		}
	}
	return nil
}

// fill applies a dense placement's Zero and Repeats to the rows row(j)
// returns, in host memory.
func (p Placement) fill(row func(j int) []byte) {
	for _, z := range p.Zero {
		clear(row(z))
	}
	for _, r := range p.Repeats {
		copy(row(r.Row), row(r.Of))
	}
}
