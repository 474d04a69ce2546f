// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// gpuDevice is the CUDA surface GPU memory uses: a real device, or a double in tests.
type gpuDevice interface {
	// Alloc allocates at least size bytes of exportable device memory
	// (the device rounds up to its allocation granularity).
	Alloc(size int64) (gpuAlloc, error)
	// Run enqueues ops on the stream, records slot's event and waits for it.
	Run(slot int, ops []devOp) error
	// NUMANode is the GPU's NUMA node, -1 when unknown.
	NUMANode() int
	// Close frees the stream, events and thread.
	Close() error
}

// devOp is one operation Publish enqueues on the memory's stream.
type devOp struct {
	kind devOpKind
	dst  uintptr // device address written
	// src is fromHost's source: height rows of width bytes, spitch apart
	// (host memory registered with CUDA, unchanged until the event).
	src []byte
	// srcDev is onDevice's source: width bytes at this device address.
	srcDev uintptr
	width  int64
	height int   // fromHost: rows (1: a plain copy)
	dpitch int64 // fromHost: the rows' distance on the device
	spitch int64 // fromHost: the rows' distance in src
}

// devOpKind says what a devOp does.
type devOpKind uint8

// The operations: a copy from host memory (cudaMemcpyAsync, or
// cudaMemcpy2DAsync for several rows), a copy on the device, zeroing.
const (
	fromHost devOpKind = iota
	onDevice
	zero
)

// gpuAlloc is one allocation of exportable device memory.
type gpuAlloc interface {
	Ptr() uintptr
	Size() int64
	// Export returns a new descriptor another process imports.
	Export() (*os.File, error)
	Free() error
}

// gpu is GPU memory: one exportable allocation holding every slot.
// A host writer gets a staging area Publish copies to the device: the bounce path.
type gpu struct {
	desc    Desc
	dev     gpuDevice
	alloc   gpuAlloc
	staging *host // nil when the backend writes device memory itself
}

// openGPU makes GPU memory on o.Device or o.DeviceUUID's GPU: ErrNoCUDA, ErrUnknownGPU.
func openGPU(slots int, s Sizes, o Options) (Memory, error) {
	dev, err := openCUDADevice(o)
	if err != nil {
		return nil, err
	}
	o.Device = dev.t.Device // DeviceUUID's ordinal here
	m, err := newGPU(dev, slots, s, o)
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

// newGPU allocates the slots on dev and, unless o.DeviceWrites, their staging area.
// A device that rounds past Granularity is refused: Sizing must hold.
func newGPU(dev gpuDevice, slots int, s Sizes, o Options) (*gpu, error) {
	alloc, err := dev.Alloc(s.Device)
	if err != nil {
		return nil, fmt.Errorf("batchmem: %d slots of %d KiB on GPU %d: %w", slots, s.SlotSize>>10, o.Device, err)
	}
	if alloc.Size() != s.Device {
		alloc.Free()
		return nil, fmt.Errorf("batchmem: %w: GPU %d allocates %d bytes for the %d asked for: its allocation granularity is over batch memory's %d bytes",
			ErrUnsupported, o.Device, alloc.Size(), s.Device, Granularity)
	}
	m := &gpu{desc: Desc{Kind: GPU, Size: alloc.Size(), SlotSize: s.SlotSize, Slots: slots, Device: o.Device, NUMANode: dev.NUMANode()}, dev: dev, alloc: alloc}
	if !o.DeviceWrites {
		if m.staging, err = openHost(slots, s.SlotSize, s.Host, o, dev.NUMANode()); err != nil {
			alloc.Free()
			return nil, fmt.Errorf("batchmem: host staging for GPU memory: %w", err)
		}
	}
	return m, nil
}

// Desc describes the memory; Size is the whole allocation (Sizing's
// Device: Slots·SlotSize rounded up to Granularity).
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

// Publish makes the batch in slot i visible on the device and waits for the device's work.
//
//   - ragged, with staging: bytes [0, p.Used) copied as they lie;
//   - dense, with staging: Zero and Repeats applied, then rows packed in one cudaMemcpy2DAsync;
//   - dense, device-written: Zero rows cleared, then Repeats copied on the device;
//   - ragged with no staging: nothing to do.
func (m *gpu) Publish(ctx context.Context, i int, p Placement) error {
	if err := p.check(m.desc, i); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ops := m.ops(i, p)
	if len(ops) == 0 {
		return nil
	}
	if err := m.dev.Run(i, ops); err != nil {
		if p.Dense() {
			return fmt.Errorf("batchmem: publish slot %d (%d rows of %d bytes) on GPU %d: %w", i, p.Rows, p.Row, m.desc.Device, err)
		}
		return fmt.Errorf("batchmem: copy slot %d (%d bytes) to GPU %d: %w", i, p.Used, m.desc.Device, err)
	}
	return nil
}

// ops returns what Publish enqueues for p in slot i (checked), having
// prepared the staging area's rows when there is one.
func (m *gpu) ops(i int, p Placement) []devOp {
	r := m.Slot(i)
	switch {
	case !p.Dense() && m.staging == nil:
		return nil
	case !p.Dense():
		if p.Used == 0 {
			return nil
		}
		return []devOp{{kind: fromHost, dst: r.Dev, src: r.Host[:p.Used], width: p.Used, height: 1}}
	case m.staging != nil:
		pitch := p.Pitch()
		row := func(j int) []byte { h := p.HostOffset(j) + p.Lead; return r.Host[h : h+p.Row] }
		p.fill(row)
		n := int64(p.Rows-1)*pitch + p.Row
		return []devOp{{kind: fromHost, dst: r.Dev + uintptr(p.DevOffset(0)), src: r.Host[p.Lead : p.Lead+n], width: p.Row, height: p.Rows, dpitch: p.Row, spitch: pitch}}
	}
	ops := make([]devOp, 0, len(p.Zero)+len(p.Repeats))
	for _, z := range p.Zero {
		ops = append(ops, devOp{kind: zero, dst: r.Dev + uintptr(p.DevOffset(z)), width: p.Row})
	}
	for _, rp := range p.Repeats {
		ops = append(ops, devOp{kind: onDevice, dst: r.Dev + uintptr(p.DevOffset(rp.Row)), srcDev: r.Dev + uintptr(p.DevOffset(rp.Of)), width: p.Row})
	}
	return ops
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
