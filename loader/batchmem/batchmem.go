// SPDX-License-Identifier: Apache-2.0

// Package batchmem is batch memory: a fixed set of equal slots that batches land in.
// It is the only place that knows the kinds of memory and how each reaches a client.
//
// # The contract
//
// Slot i starts at byte i·SlotSize of the memory a client maps.
//
//  1. The loader takes slot i only after the consumer released its last batch.
//  2. Writers write only into Slot(i), where the Placement says, until every read completed.
//  3. The loader calls Publish once, after every write and before handing the batch out.
//     A nil return means the batch lies in the client's memory as p says.
//     After an error the batch is not handed out.
//  4. The consumer reads slot i only between a nil Publish and its release.
//
// # Placement
//
// A batch is ragged or dense. Ragged: each sample has an aligned room where its writer put it.
// Dense: sample i is at Lead + i·S, so the batch is one (batch, S) array.
// Lead is the rows' offset in their files modulo 4 KiB, so that file blocks land in place.
// In host memory writers write each row in place, and Publish repeats and zeroes rows.
// A device writer writes rows in place in GPU memory.
// A host writer writes row i at Lead + i·Pitch of the staging area; Publish packs with one 2D copy.
//
// Methods other than Publish may run on any goroutine.
// Publish of different slots may run at once. Close must not run during a write or Publish.
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

// Desc describes a Memory to a client: the wire form sent with its descriptor.
type Desc struct {
	Kind     Kind  `msgpack:"kind" json:"kind"`
	Size     int64 `msgpack:"size" json:"size"`           // bytes to map
	SlotSize int64 `msgpack:"slot_size" json:"slot_size"` // slot i starts at i·SlotSize
	Slots    int   `msgpack:"slots" json:"slots"`
	Device   int   `msgpack:"device" json:"device"` // the GPU's ordinal here; -1 for host memory
	// UUID names the GPU the same way in every process; "" for host memory.
	UUID string `msgpack:"uuid" json:"uuid"`
	// NUMANode is the node the memory is placed on; -1 unknown.
	NUMANode int `msgpack:"numa_node" json:"numa_node"`
}

// Region is one slot: where writers put a batch's bytes.
// Host is the host view: the slot itself, or GPU memory's staging area.
// Dev is the slot's device address for GPU memory; Host is then nil for device writers.
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
	// Publish makes the batch in slot i, laid out as p says, visible.
	Publish(ctx context.Context, i int, p Placement) error
	// Export returns a new descriptor a client maps the memory through; the caller closes it.
	Export() (*os.File, error)
	// Pinned returns nil when the memory is page-locked, else why not.
	Pinned() error
	// Close frees the memory. A client's mapping outlives it.
	Close() error
}

// Options configures Open.
type Options struct {
	// Device is the GPU ordinal for GPU memory, unless DeviceUUID names the GPU.
	Device int
	// DeviceUUID names the GPU by its UUID in any case, with or without GPU-.
	// A GPU this process does not see is ErrUnknownGPU.
	DeviceUUID string
	// DeviceWrites says the backend writes device memory: no staging area.
	DeviceWrites bool
	// Logger, default slog.Default().
	Logger *slog.Logger
	// CUDA is the process's CUDA libraries; nil discovers them for this Open.
	CUDA *cuda.Libs
}

// Errors callers branch on; each is returned wrapped.
var (
	ErrKind        = errors.New("unknown memory kind")
	ErrNoCUDA      = errors.New("no CUDA driver found")
	ErrUnsupported = errors.New("memory kind not supported")
	ErrNoSpace     = errors.New("no room for batch memory")
	// ErrUnknownGPU: the message lists the GPUs this process sees.
	ErrUnknownGPU = errors.New("no such GPU here")
)

// Granularity is what allocation sizes are rounded up to: 2 MiB.
// It is the x86-64 huge page and the GPU VMM granularity; a device that rounds further is refused.
const Granularity = 2 << 20

// Sizes is what Open allocates, computed before any allocation.
type Sizes struct {
	SlotSize int64 // Desc.SlotSize
	Host     int64 // page-locked host memory: Desc.Size of host memory, or GPU memory's staging area
	Device   int64 // device memory: Desc.Size of GPU memory
}

// Sizing returns what Open allocates for slots slots of at least slotSize bytes.
// Host memory is slots × SlotSize, rounded up to Granularity from Granularity on.
// GPU memory is that rounded up to Granularity, plus a staging area unless deviceWrites.
// Errors wrap ErrKind for an unknown kind.
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

// Open allocates slots slots of at least slotSize bytes of the given kind, as Sizing says.
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

// MaxRow bounds a dense row's staging room: cudaMemcpy2DAsync's largest pitch.
// Batches of larger samples stay ragged.
const MaxRow = 1<<31 - 1

// Placement is how one batch lies in its slot. Rows == 0 means ragged, Rows > 0 dense.
type Placement struct {
	// Used is the bytes [0, Used) a ragged batch's rooms take.
	Used int64
	// Rows is a dense batch's number of samples and Row each one's size.
	Rows int
	Row  int64
	// Lead is a dense batch's phase in [0, backend.Align): where row 0 starts.
	Lead int64
	// Zero lists failed dense rows: Publish makes them read zeros.
	// Repeats lists rows holding an earlier row's sample: Publish copies it.
	// Zero is applied first.
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

// DevOffset returns dense row i's offset in the slot the client maps: Lead + i·Row.
func (p Placement) DevOffset(i int) int64 { return p.Lead + int64(i)*p.Row }

// Pitch returns a dense row's room in the host staging area: AlignUp(Lead+Row).
func (p Placement) Pitch() int64 { return backend.AlignUp(p.Lead + p.Row) }

// HostOffset returns where dense row i's staging room starts: i·Pitch.
func (p Placement) HostOffset(i int) int64 { return int64(i) * p.Pitch() }

// Packs is PacksAt with lead 0: rows of whole files.
func (d Desc) Packs(rows int, row int64) bool { return d.PacksAt(rows, row, 0) }

// PacksAt reports whether rows samples of row bytes, lead bytes into a block, fit dense.
// In host memory they need lead + rows·row bytes of a slot.
// In GPU memory they need rows staging rooms of AlignUp(lead+row), each at most MaxRow.
// Whether such a batch is dense at all is the loader's choice.
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
