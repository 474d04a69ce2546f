// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// gpuDevice is the small CUDA surface GPU memory uses: cudaDevice
// (internal/cuda, on the device's locked thread) on a real GPU; an
// in-memory double in tests, where device memory is host memory.
type gpuDevice interface {
	// Alloc allocates at least size bytes of exportable device memory
	// (the device rounds up to its allocation granularity).
	Alloc(size int64) (gpuAlloc, error)
	// CopyAndWait copies src (host memory registered with CUDA) to the
	// device address dst on the memory's stream, records slot's event
	// after it and returns once the event has completed.
	CopyAndWait(slot int, dst uintptr, src []byte) error
	// NUMANode is the GPU's NUMA node, -1 when unknown.
	NUMANode() int
	// Close frees the stream, events and thread.
	Close() error
}

// gpuAlloc is one allocation of exportable device memory.
type gpuAlloc interface {
	Ptr() uintptr
	Size() int64
	// Export returns a new descriptor another process imports.
	Export() (*os.File, error)
	Free() error
}

// gpu is GPU memory: one exportable allocation holding every slot; a
// backend that writes only host memory gets a host staging area of the
// same shape (Region.Host), which Publish copies to the device (the
// "bounce" path).
type gpu struct {
	desc    Desc
	dev     gpuDevice
	alloc   gpuAlloc
	staging *host // nil when the backend writes device memory itself
}

// openGPU makes GPU memory on o.Device (or the GPU o.DeviceUUID names).
// Without a driver it fails with ErrNoCUDA; a GPU not here is
// ErrUnknownGPU.
func openGPU(slots int, slotSize int64, o Options) (Memory, error) {
	dev, err := openCUDADevice(o)
	if err != nil {
		return nil, err
	}
	o.Device = dev.t.Device // DeviceUUID's ordinal here
	m, err := newGPU(dev, slots, slotSize, o)
	if err != nil {
		dev.Close()
		return nil, err
	}
	m.desc.UUID = dev.uuid
	if m.staging != nil {
		dev.registerStaging(m.staging, o.Logger)
	}
	return m, nil
}

// newGPU allocates the slots on dev and, unless o.DeviceWrites, their host
// staging area.
func newGPU(dev gpuDevice, slots int, slotSize int64, o Options) (*gpu, error) {
	size := int64(slots) * slotSize
	alloc, err := dev.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("batchmem: %d slots of %d KiB on GPU %d: %w", slots, slotSize>>10, o.Device, err)
	}
	m := &gpu{desc: Desc{Kind: GPU, Size: alloc.Size(), SlotSize: slotSize, Slots: slots, Device: o.Device, NUMANode: dev.NUMANode()}, dev: dev, alloc: alloc}
	if !o.DeviceWrites {
		if m.staging, err = openHost(slots, slotSize, o, dev.NUMANode()); err != nil {
			alloc.Free()
			return nil, fmt.Errorf("batchmem: host staging for GPU memory: %w", err)
		}
	}
	return m, nil
}

// Desc describes the memory; Size is the whole allocation (at least
// Slots·SlotSize: the device's granularity rounds it up).
func (m *gpu) Desc() Desc { return m.desc }

// Slot returns slot i's device address and, for a backend that writes host
// memory, its staging area.
func (m *gpu) Slot(i int) Region {
	r := Region{Dev: m.alloc.Ptr() + uintptr(int64(i)*m.desc.SlotSize)}
	if m.staging != nil {
		r.Host = m.staging.Slot(i).Host
	}
	return r
}

// Publish copies bytes [0, n) of slot i's staging area to the device and
// returns once the copy has completed (its event); with no staging (the
// backend wrote the device, synchronously) there is nothing to do.
func (m *gpu) Publish(ctx context.Context, i int, n int64) error {
	if i < 0 || i >= m.desc.Slots || n < 0 || n > m.desc.SlotSize {
		return fmt.Errorf("batchmem: publish %d bytes of slot %d: out of range (%d slots of %d bytes)", n, i, m.desc.Slots, m.desc.SlotSize)
	}
	if m.staging == nil || n == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r := m.Slot(i)
	if err := m.dev.CopyAndWait(i, r.Dev, r.Host[:n]); err != nil {
		return fmt.Errorf("batchmem: copy slot %d (%d bytes) to GPU %d: %w", i, n, m.desc.Device, err)
	}
	return nil
}

// Export returns a descriptor of the device allocation (a CUDA VMM POSIX
// file descriptor) for the client to import.
func (m *gpu) Export() (*os.File, error) {
	f, err := m.alloc.Export()
	if err != nil {
		return nil, fmt.Errorf("batchmem: export GPU memory: %w", err)
	}
	return f, nil
}

// Pinned returns nil: device memory is not swapped.
func (m *gpu) Pinned() error { return nil }

// Close frees the allocation (a client's import keeps it alive until it
// unmaps), the staging area and the device's resources.
func (m *gpu) Close() error {
	var errs []error
	if m.alloc != nil {
		errs = append(errs, m.alloc.Free())
		m.alloc = nil
	}
	if m.staging != nil {
		errs = append(errs, m.staging.Close())
		m.staging = nil
	}
	if m.dev != nil {
		errs = append(errs, m.dev.Close())
		m.dev = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("batchmem: close GPU memory: %w", err)
	}
	return nil
}

var _ Memory = (*gpu)(nil)
