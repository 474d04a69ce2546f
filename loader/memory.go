package loader

import "context"

// MemoryKind says where batch memory lives.
type MemoryKind string

// Memory kinds.
const (
	MemoryPinned MemoryKind = "pinned" // page-locked host memory, shareable with other processes
	MemoryGPU    MemoryKind = "gpu"    // GPU memory (not available in this build)
)

// Memory is where batches land: a fixed set of equal slots, allocated
// once. The loader lays a batch out in a slot, the backend reads into the
// slot's host view, and Publish makes the batch visible to its consumer
// before Next returns it. The host ring (NewRing) is the implementation
// today; a device-memory destination plugs in here, reading through a
// host staging view or straight into the device, and copying in Publish.
type Memory interface {
	// Slots returns the number of slots.
	Slots() int
	// Slot returns slot i's host-addressable memory, backend.Align-aligned:
	// what backends read into. It stays valid until Close.
	Slot(i int) []byte
	// Publish is called once every read into slot i has completed, with
	// the bytes of the slot the batch uses, before the batch is handed out.
	Publish(ctx context.Context, i int, n int64) error
	// Handle says how another process reaches the memory.
	Handle() MemoryHandle
	// Share lets the user uid, and no other user but root, map the memory.
	Share(uid int) error
	// Pinned returns nil when the memory is page-locked, else why not.
	Pinned() error
	// Close frees the memory.
	Close() error
}

// MemoryHandle is how a client process reaches batch memory. Batch
// offsets count from the start of this memory; slot i starts at
// i·SlotSize.
type MemoryHandle struct {
	Kind     MemoryKind // MemoryPinned
	Path     string     // the shared-memory file to map read-only; "" for a memfd (not shareable by name)
	Size     int64      // bytes to map
	SlotSize int64
}
