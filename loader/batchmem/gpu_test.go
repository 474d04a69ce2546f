// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeDevice is the test double of gpuDevice: "device memory" is a
// host memfd mapping (so it can be exported and read back), allocations
// round up to a 64 KiB granularity, and every copy is recorded.
type fakeDevice struct {
	t       *testing.T
	allocs  []*fakeAlloc
	copies  []fakeCopy
	failOn  int // CopyAndWait of this slot fails (-1: none)
	closed  bool
	freed   int
	granule int64
	node    int
}

type fakeCopy struct {
	slot int
	dst  uintptr
	n    int
}

type fakeAlloc struct {
	d   *fakeDevice
	fd  int
	mem []byte
}

func (a *fakeAlloc) Ptr() uintptr { return uintptr(unsafeAddr(a.mem)) }
func (a *fakeAlloc) Size() int64  { return int64(len(a.mem)) }
func (a *fakeAlloc) Export() (*os.File, error) {
	nfd, err := unix.Dup(a.fd)
	return os.NewFile(uintptr(nfd), "fake-vmm"), err
}
func (a *fakeAlloc) Free() error {
	a.d.freed++
	unix.Munmap(a.mem)
	return unix.Close(a.fd)
}

func (d *fakeDevice) Alloc(size int64) (gpuAlloc, error) {
	size = (size + d.granule - 1) / d.granule * d.granule
	fd, err := unix.MemfdCreate("fake-gpu", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	unix.Ftruncate(fd, size)
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	a := &fakeAlloc{d: d, fd: fd, mem: mem}
	d.allocs = append(d.allocs, a)
	return a, nil
}

func (d *fakeDevice) CopyAndWait(slot int, dst uintptr, src []byte) error {
	if slot == d.failOn {
		return errors.New("cudaMemcpyAsync: cudaErrorIllegalAddress (700): an illegal memory access was encountered")
	}
	a := d.allocs[0]
	off := int64(dst) - int64(a.Ptr())
	if off < 0 || off+int64(len(src)) > a.Size() {
		d.t.Fatalf("copy of %d bytes to %#x: outside the allocation", len(src), dst)
	}
	copy(a.mem[off:], src)
	d.copies = append(d.copies, fakeCopy{slot, dst, len(src)})
	return nil
}

func (d *fakeDevice) Close() error  { d.closed = true; return nil }
func (d *fakeDevice) NUMANode() int { return d.node }

func newFake(t *testing.T) *fakeDevice {
	return &fakeDevice{t: t, failOn: -1, granule: 64 << 10, node: -1}
}

// TestGPUBounce: a backend writing host memory writes slot i's staging
// area; Publish copies exactly bytes [0, n) of it to slot i on the device,
// nothing else, and the device then holds them; the client's export sees
// them; a failed copy is an error naming the slot; Close frees all.
func TestGPUBounce(t *testing.T) {
	dev := newFake(t)
	m, err := newGPU(dev, 3, 8192, Options{Device: 1})
	if err != nil {
		t.Fatal(err)
	}
	d := m.Desc()
	if d.Kind != GPU || d.Device != 1 || d.Slots != 3 || d.SlotSize != 8192 || d.Size != 64<<10 || d.NUMANode != -1 {
		t.Fatalf("Desc() = %+v, want 3 slots of 8192 on GPU 1, size rounded to the 64 KiB granularity", d)
	}
	base := dev.allocs[0].Ptr()
	for i := range 3 {
		r := m.Slot(i)
		if r.Dev != base+uintptr(i*8192) || len(r.Host) != 8192 {
			t.Fatalf("slot %d: dev %#x (base %#x), %d host bytes", i, r.Dev, base, len(r.Host))
		}
	}
	slot := m.Slot(1)
	for i := range slot.Host {
		slot.Host[i] = byte(i*7 + 1)
	}
	if err := m.Publish(context.Background(), 1, 5000); err != nil {
		t.Fatal(err)
	}
	if len(dev.copies) != 1 || dev.copies[0] != (fakeCopy{1, slot.Dev, 5000}) {
		t.Fatalf("copies %+v, want one of 5000 bytes to slot 1", dev.copies)
	}
	onDev := dev.allocs[0].mem
	if !bytes.Equal(onDev[8192:8192+5000], slot.Host[:5000]) {
		t.Fatalf("device slot 1 does not hold the published bytes")
	}
	if bytes.ContainsFunc(onDev[8192+5000:], func(r rune) bool { return r != 0 }) || bytes.ContainsFunc(onDev[:8192], func(r rune) bool { return r != 0 }) {
		t.Fatalf("Publish wrote past its n bytes or into another slot")
	}
	f, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	view, err := unix.Mmap(int(f.Fd()), 0, int(d.Size), unix.PROT_READ, unix.MAP_SHARED)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(view[8192:8192+5000], slot.Host[:5000]) {
		t.Errorf("the export does not show the device's bytes")
	}
	unix.Munmap(view)
	for _, bad := range []struct {
		slot int
		n    int64
	}{{3, 1}, {-1, 1}, {0, 8193}, {0, -1}} {
		if err := m.Publish(context.Background(), bad.slot, bad.n); err == nil {
			t.Errorf("Publish(%d, %d): no error", bad.slot, bad.n)
		}
	}
	dev.failOn = 2
	if err := m.Publish(context.Background(), 2, 10); err == nil || !bytes.Contains([]byte(err.Error()), []byte("slot 2")) {
		t.Errorf("a failed copy: err = %v, want an error naming slot 2", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Publish(ctx, 0, 10); !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with an ended context: %v", err)
	}
	if len(dev.copies) != 1 {
		t.Errorf("refused publishes copied: %+v", dev.copies)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if dev.freed != 1 || !dev.closed {
		t.Errorf("Close: %d allocations freed, device closed %v", dev.freed, dev.closed)
	}
}

// TestGPUDeviceWrites: a backend that writes device memory gets no host
// view and Publish copies nothing.
func TestGPUDeviceWrites(t *testing.T) {
	dev := newFake(t)
	m, err := newGPU(dev, 2, 4096, Options{DeviceWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if r := m.Slot(1); r.Host != nil || r.Dev != dev.allocs[0].Ptr()+4096 {
		t.Fatalf("slot 1: %d host bytes, dev %#x", len(r.Host), r.Dev)
	}
	if err := m.Publish(context.Background(), 1, 4096); err != nil || len(dev.copies) != 0 {
		t.Fatalf("Publish: %v, copies %+v", err, dev.copies)
	}
}

// TestGPUStagingOnTheGPUsNode: for a GPU on NUMA node 0 (this machine has
// one), the host staging area prefers that node (mbind, before any page
// is used), and the description says so.
func TestGPUStagingOnTheGPUsNode(t *testing.T) {
	if _, err := os.Stat("/sys/devices/system/node/node0"); err != nil {
		t.Skipf("no NUMA node 0 here: %v", err)
	}
	dev := newFake(t)
	dev.node = 0
	m, err := newGPU(dev, 2, 1<<20, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Desc().NUMANode != 0 {
		t.Fatalf("Desc().NUMANode = %d, want 0", m.Desc().NUMANode)
	}
	maps, _ := os.ReadFile("/proc/self/numa_maps")
	addr := fmt.Sprintf("%x ", uintptr(unsafeAddr(m.Slot(0).Host)))
	for _, line := range strings.Split(string(maps), "\n") {
		if strings.HasPrefix(line, addr) {
			if !strings.Contains(line, "prefer:0") {
				t.Errorf("staging area's policy: %s, want prefer:0", line)
			}
			return
		}
	}
	t.Errorf("no numa_maps line for the staging area at %s", addr)
}
