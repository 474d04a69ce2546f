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
//  2. Writers (the backend's reads) write only into Slot(i), only into
//     bytes [0, n) where n is the batch's size, and only between the
//     loader taking the slot and every read having completed. Slot(i) is
//     the same Region for the life of the Memory.
//  3. The loader calls Publish(ctx, i, n) once, after every write has
//     completed and before the batch is handed out. When Publish returns
//     nil, bytes [0, n) of slot i are in the memory the client maps (for
//     host memory they already were; for GPU memory any staging copy is
//     complete) and nothing writes them again until the slot's next turn.
//     When it returns an error, the batch must not be handed out; the
//     slot may be used again.
//  4. The consumer reads bytes of slot i only between a nil Publish and
//     its release of the batch.
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

	"github.com/nvfeed/nvfeed/loader/backend"
)

// Kind says where batch memory lives. Its values are the wire names.
type Kind string

// Memory kinds.
const (
	Pinned Kind = "pinned" // page-locked host memory (a memfd); not CUDA-registered (see openHost)
	GPU    Kind = "gpu"    // device memory on one GPU
)

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
	// Publish makes bytes [0, n) of slot i visible to the consumer.
	Publish(ctx context.Context, i int, n int64) error
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

// Open allocates slots slots of at least slotSize bytes each (rounded up
// to backend.Align) of the given kind ("" means Pinned).
func Open(kind Kind, slots int, slotSize int64, o Options) (Memory, error) {
	if slots <= 0 || slotSize <= 0 {
		return nil, fmt.Errorf("batchmem: %d slots of %d bytes", slots, slotSize)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	slotSize = backend.AlignUp(slotSize)
	switch kind {
	case "", Pinned:
		return openHost(slots, slotSize, o, -1)
	case GPU:
		return openGPU(slots, slotSize, o)
	}
	return nil, fmt.Errorf("batchmem: %w %q (want %s or %s)", ErrKind, kind, Pinned, GPU)
}
