// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/numa"
)

// cudaDevice is gpuDevice on a real GPU: every call runs on the device's
// locked OS thread (cuda.Thread), with one stream for the copies and one
// event per slot.
type cudaDevice struct {
	t      *cuda.Thread
	drv    *cuda.Driver
	uuid   string // the GPU's UUID (Desc.UUID)
	stream cuda.Stream
	events map[int]cuda.Event // on the thread only
	node   int                // the GPU's NUMA node, -1 unknown
}

// openCUDADevice finds the GPU o names (o.DeviceUUID, else o.Device),
// starts its thread and resolves what GPU memory needs; without a driver
// it fails with ErrNoCUDA, for a GPU not here with ErrUnknownGPU. The
// libraries are o.CUDA's, else discovered for this open.
func openCUDADevice(o Options) (*cudaDevice, error) {
	libs := o.CUDA
	if libs == nil {
		libs = cuda.NewLibs(cuda.SearchFromEnv(), o.Logger)
	}
	rt, err := libs.Load()
	if err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			return nil, fmt.Errorf("batchmem: memory kind gpu: %w: %w", ErrNoCUDA, err)
		}
		return nil, fmt.Errorf("batchmem: memory kind gpu: %w: %w", ErrUnsupported, err)
	}
	drv, err := rt.Driver() // the device queries need no context
	if err != nil {
		return nil, fmt.Errorf("batchmem: memory kind gpu: %w: %w", ErrUnsupported, err)
	}
	devs, err := drv.Devices()
	if err != nil {
		return nil, fmt.Errorf("batchmem: memory kind gpu: listing the GPUs: %w", err)
	}
	device, err := pickDevice(devs, o.Device, o.DeviceUUID)
	if err != nil {
		return nil, err
	}
	t, err := rt.NewThread(device)
	if err != nil {
		return nil, fmt.Errorf("batchmem: memory kind gpu: %w: %w", ErrUnsupported, err)
	}
	d := &cudaDevice{t: t, drv: drv, uuid: devs[device].UUID, events: map[int]cuda.Event{}, node: -1}
	var bus string
	err = t.Do(func() error {
		var err error
		if bus, err = rt.PCIBusID(device); err != nil {
			return err
		}
		d.stream, err = rt.NewStream()
		return err
	})
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("batchmem: memory kind gpu on device %d (%s): %w", device, d.uuid, err)
	}
	d.place(bus, o.Logger)
	return d, nil
}

// pickDevice returns the ordinal of the GPU uuid names, or with uuid ""
// ordinal itself, among devs; else ErrUnknownGPU listing devs.
func pickDevice(devs []cuda.Device, ordinal int, uuid string) (int, error) {
	seen := func() string {
		if len(devs) == 0 {
			return "it sees no GPU"
		}
		var l []string
		for _, d := range devs {
			l = append(l, fmt.Sprintf("%d: %s", d.Ordinal, d.UUID))
		}
		return "it sees " + strings.Join(l, ", ")
	}
	if uuid != "" {
		if i, ok := cuda.FindDevice(devs, uuid); ok {
			return i, nil
		}
		return 0, fmt.Errorf("batchmem: %w: GPU %s is not one of this process's GPUs (%s)", ErrUnknownGPU, uuid, seen())
	}
	if ordinal < 0 || ordinal >= len(devs) {
		return 0, fmt.Errorf("batchmem: %w: GPU ordinal %d (%s)", ErrUnknownGPU, ordinal, seen())
	}
	return ordinal, nil
}

// registerStaging page-locks the host staging area for CUDA on the GPU's
// thread (the GPU's context: a registration from a thread with no device
// set would make a context on GPU 0), so that Publish's copies are DMA.
// A failure is logged: the copies still work, staged by the driver.
func (d *cudaDevice) registerStaging(h *host, log *slog.Logger) {
	rt := d.t.Runtime
	if err := d.t.Do(func() error { return rt.HostRegister(h.mem) }); err != nil {
		log.Warn("batchmem: staging memory is not registered with CUDA: copies to the GPU are not DMA", "gpu", d.uuid, "err", err)
		return
	}
	mem := h.mem
	h.unregister = func() error { return d.t.Do(func() error { return rt.HostUnregister(mem) }) }
}

// place pins the device's thread to the CPUs of its GPU's NUMA node (host
// staging memory goes there too: openHost), where the machine has NUMA
// information.
func (d *cudaDevice) place(bus string, log *slog.Logger) {
	if d.node = numa.OfPCI(numa.SysFS, bus); d.node < 0 {
		return
	}
	cpus, err := numa.CPUs(numa.SysFS, d.node)
	if err == nil {
		err = d.t.Pin(cpus)
	}
	if err != nil {
		log.Warn("batchmem: the GPU's thread is not on its NUMA node", "gpu", d.t.Device, "node", d.node, "err", err)
	}
}

// NUMANode returns the GPU's NUMA node.
func (d *cudaDevice) NUMANode() int { return d.node }

// cudaAlloc is a gpuAlloc of exportable device memory.
type cudaAlloc struct {
	d *cudaDevice
	m *cuda.DeviceMemory
}

// Ptr returns the allocation's device address.
func (a cudaAlloc) Ptr() uintptr { return a.m.Ptr }

// Size returns its size, granularity-rounded.
func (a cudaAlloc) Size() int64 { return a.m.Size }

// Export returns a new VMM POSIX file descriptor for it, made on the
// device's thread.
func (a cudaAlloc) Export() (*os.File, error) {
	var f *os.File
	err := a.d.t.Do(func() error {
		var err error
		f, err = a.m.Export()
		return err
	})
	return f, err
}

// Free unmaps and releases it on the device's thread.
func (a cudaAlloc) Free() error { return a.d.t.Do(a.m.Free) }

// Alloc allocates exportable memory on the device (cuMemCreate with POSIX
// file descriptor handles, mapped read-write).
func (d *cudaDevice) Alloc(size int64) (gpuAlloc, error) {
	var m *cuda.DeviceMemory
	err := d.t.Do(func() error {
		var err error
		m, err = d.drv.Alloc(d.t.Device, size)
		return err
	})
	if err != nil {
		return nil, err
	}
	return cudaAlloc{d, m}, nil
}

// Run enqueues ops on the stream, records the slot's event and waits for
// it; when an op fails to enqueue, it still waits for the ones before it
// (their source must not change under them).
func (d *cudaDevice) Run(slot int, ops []devOp) error {
	rt := d.t.Runtime
	return d.t.Do(func() error {
		ev, ok := d.events[slot]
		if !ok {
			var err error
			if ev, err = rt.NewEvent(); err != nil {
				return err
			}
			d.events[slot] = ev
		}
		var err error
		for _, op := range ops {
			if err = d.enqueue(op); err != nil {
				break
			}
		}
		if rerr := rt.Record(ev, d.stream); rerr != nil {
			return errors.Join(err, rerr)
		}
		return errors.Join(err, rt.Wait(ev))
	})
}

// enqueue puts op on the stream; on the device's thread.
func (d *cudaDevice) enqueue(op devOp) error {
	rt := d.t.Runtime
	switch op.kind {
	case fromHost:
		if op.height == 1 {
			return rt.CopyToDevice(op.dst, op.src[:op.width], d.stream)
		}
		return rt.CopyToDevice2D(op.dst, op.dpitch, op.src, op.spitch, op.width, op.height, d.stream)
	case onDevice:
		return rt.CopyOnDevice(op.dst, op.srcDev, op.width, d.stream)
	case zero:
		return rt.ZeroDevice(op.dst, op.width, d.stream)
	}
	return fmt.Errorf("batchmem: device operation %d unknown", op.kind)
}

// Close destroys the events and the stream and ends the thread.
func (d *cudaDevice) Close() error {
	rt := d.t.Runtime
	err := d.t.Do(func() error {
		var errs []error
		for _, ev := range d.events {
			errs = append(errs, rt.DestroyEvent(ev))
		}
		if d.stream != 0 {
			errs = append(errs, rt.DestroyStream(d.stream))
		}
		return errors.Join(errs...)
	})
	d.t.Close()
	return err
}
