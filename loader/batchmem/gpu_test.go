// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeDevice is the test double of gpuDevice: "device memory" is a
// host memfd mapping (so it can be exported and read back), allocations
// round up to a 64 KiB granularity, and every operation is checked as
// CUDA would (ranges inside the allocation, a 2D copy's width within its
// pitches), carried out on that memory and recorded.
type fakeDevice struct {
	t       *testing.T
	allocs  []*fakeAlloc
	ops     []fakeOp
	failOn  int // Run of this slot fails (-1: none)
	closed  bool
	freed   int
	granule int64
	node    int
}

// fakeOp is one operation run: its slot and what it did.
type fakeOp struct {
	slot int
	op   devOp
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

// at returns the n device bytes at dst, failing the test outside the
// allocation.
func (d *fakeDevice) at(dst uintptr, n int64) []byte {
	a := d.allocs[0]
	off := int64(dst) - int64(a.Ptr())
	if off < 0 || n < 0 || off+n > a.Size() {
		d.t.Fatalf("%d device bytes at %#x: outside the allocation", n, dst)
	}
	return a.mem[off : off+n]
}

func (d *fakeDevice) Run(slot int, ops []devOp) error {
	if slot == d.failOn {
		return errors.New("cudaMemcpyAsync: cudaErrorIllegalAddress (700): an illegal memory access was encountered")
	}
	for _, op := range ops {
		switch op.kind {
		case fromHost:
			if op.height > 1 && (op.width > op.dpitch || op.width > op.spitch) {
				d.t.Fatalf("cudaMemcpy2DAsync: width %d over a pitch (%d, %d): cudaErrorInvalidPitchValue", op.width, op.dpitch, op.spitch)
			}
			if int64(op.height-1)*op.spitch+op.width > int64(len(op.src)) {
				d.t.Fatalf("copy of %d rows of %d bytes %d apart from %d host bytes", op.height, op.width, op.spitch, len(op.src))
			}
			for r := range int64(op.height) {
				copy(d.at(op.dst+uintptr(r*op.dpitch), op.width), op.src[r*op.spitch:r*op.spitch+op.width])
			}
		case onDevice:
			copy(d.at(op.dst, op.width), d.at(op.srcDev, op.width))
		case zero:
			clear(d.at(op.dst, op.width))
		default:
			d.t.Fatalf("operation %d unknown", op.kind)
		}
		d.ops = append(d.ops, fakeOp{slot, op})
	}
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
	m, err := openFake(dev, 3, 8192, Options{Device: 1})
	if err != nil {
		t.Fatal(err)
	}
	d := m.Desc()
	if d.Kind != GPU || d.Device != 1 || d.Slots != 3 || d.SlotSize != 8192 || d.Size != Granularity || d.NUMANode != -1 {
		t.Fatalf("Desc() = %+v, want 3 slots of 8192 on GPU 1, size rounded to batchmem's Granularity (the device's 64 KiB divides it)", d)
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
	if err := m.Publish(context.Background(), 1, Ragged(5000)); err != nil {
		t.Fatal(err)
	}
	if op := dev.ops; len(op) != 1 || op[0].slot != 1 || op[0].op.kind != fromHost || op[0].op.dst != slot.Dev || op[0].op.width != 5000 || op[0].op.height != 1 {
		t.Fatalf("operations %+v, want one copy of 5000 bytes to slot 1", dev.ops)
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
		if err := m.Publish(context.Background(), bad.slot, Ragged(bad.n)); err == nil {
			t.Errorf("Publish(%d, %d): no error", bad.slot, bad.n)
		}
	}
	dev.failOn = 2
	if err := m.Publish(context.Background(), 2, Ragged(10)); err == nil || !bytes.Contains([]byte(err.Error()), []byte("slot 2")) {
		t.Errorf("a failed copy: err = %v, want an error naming slot 2", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Publish(ctx, 0, Ragged(10)); !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with an ended context: %v", err)
	}
	if len(dev.ops) != 1 {
		t.Errorf("refused publishes copied: %+v", dev.ops)
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
	m, err := openFake(dev, 2, 4096, Options{DeviceWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if r := m.Slot(1); r.Host != nil || r.Dev != dev.allocs[0].Ptr()+4096 {
		t.Fatalf("slot 1: %d host bytes, dev %#x", len(r.Host), r.Dev)
	}
	if err := m.Publish(context.Background(), 1, Ragged(4096)); err != nil || len(dev.ops) != 0 {
		t.Fatalf("Publish: %v, operations %+v", err, dev.ops)
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
	m, err := openFake(dev, 2, 1<<20, Options{})
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

// placementSlot is the slot size placement tests use: 6 rooms of 8 KiB.
const placementSlot = 6 * 8192

// placements are the placement tests' cases: each Placement of slot 1, on
// memory with a host staging area (bounce) or written on the device, and
// the operations Publish runs for it (kind, widths, heights and pitches;
// addresses are not compared).
var placements = []struct {
	name    string
	staging bool
	p       Placement
	ops     []devOp
}{
	{"ragged bounce", true, Ragged(12288),
		[]devOp{{kind: fromHost, width: 12288, height: 1}}},
	{"dense bounce", true, Placement{Rows: 5, Row: 5000},
		[]devOp{{kind: fromHost, width: 5000, height: 5, dpitch: 5000, spitch: 8192}}},
	{"dense bounce, one row", true, Placement{Rows: 1, Row: 5000},
		[]devOp{{kind: fromHost, width: 5000, height: 1, dpitch: 5000, spitch: 8192}}},
	{"dense bounce, whole blocks", true, Placement{Rows: 6, Row: 8192},
		[]devOp{{kind: fromHost, width: 8192, height: 6, dpitch: 8192, spitch: 8192}}},
	{"dense bounce, a failed row and padding", true, Placement{Rows: 5, Row: 5000, Zero: []int{1}, Repeats: []Repeat{{3, 2}, {4, 2}}},
		[]devOp{{kind: fromHost, width: 5000, height: 5, dpitch: 5000, spitch: 8192}}},
	{"dense bounce at a lead, a failed row and padding", true, Placement{Rows: 5, Row: 5000, Lead: 128, Zero: []int{1}, Repeats: []Repeat{{3, 2}, {4, 2}}},
		[]devOp{{kind: fromHost, width: 5000, height: 5, dpitch: 5000, spitch: 8192}}},
	{"dense bounce, whole blocks at a lead", true, Placement{Rows: 4, Row: 8192, Lead: 4000},
		[]devOp{{kind: fromHost, width: 8192, height: 4, dpitch: 8192, spitch: 12288}}},
	{"ragged device writes", false, Ragged(12288), nil},
	{"dense device writes", false, Placement{Rows: 5, Row: 5000}, nil},
	{"dense device writes, a failed row and padding", false, Placement{Rows: 5, Row: 5000, Zero: []int{1}, Repeats: []Repeat{{3, 2}, {4, 2}}},
		[]devOp{{kind: zero, width: 5000}, {kind: onDevice, width: 5000}, {kind: onDevice, width: 5000}}},
	{"dense device writes at a lead, a failed row and padding", false, Placement{Rows: 5, Row: 5000, Lead: 300, Zero: []int{1}, Repeats: []Repeat{{3, 2}, {4, 2}}},
		[]devOp{{kind: zero, width: 5000}, {kind: onDevice, width: 5000}, {kind: onDevice, width: 5000}}},
}

// gpuUnderTest opens GPU memory of 2 slots of placementSlot bytes for a
// placement test and returns it, a writable view of its device memory
// (what the client maps) and the operations run so far (nil where they
// are not recorded).
type gpuUnderTest func(t *testing.T, deviceWrites bool) (m Memory, dev []byte, ops func() []fakeOp)

// TestGPUPublishPlacement: Publish lays each batch out on the device as
// its Placement says, with the operations the design names: a ragged
// batch copied as it lies; a dense one packed from its 4 KiB-aligned
// staging rooms in ONE 2D copy (slack left behind), its failed rows
// zeroed and its padding rows repeated; a dense batch a backend wrote on
// the device itself only zeroed and repeated there. Nothing outside the
// batch's bytes is touched. On the in-memory device double.
func TestGPUPublishPlacement(t *testing.T) {
	testPlacements(t, func(t *testing.T, deviceWrites bool) (Memory, []byte, func() []fakeOp) {
		dev := newFake(t)
		m, err := openFake(dev, 2, placementSlot, Options{DeviceWrites: deviceWrites})
		if err != nil {
			t.Fatal(err)
		}
		return m, dev.allocs[0].mem, func() []fakeOp { return dev.ops }
	})
}

// testPlacements runs the placements on the memory open makes.
func testPlacements(t *testing.T, open gpuUnderTest) {
	for _, tt := range placements {
		t.Run(tt.name, func(t *testing.T) {
			m, all, ops := open(t, !tt.staging)
			defer func() {
				if err := m.Close(); err != nil {
					t.Error(err)
				}
			}()
			onDev := all[placementSlot : 2*placementSlot] // slot 1
			for i := range all {
				all[i] = 0xA5 // an older batch's bytes
			}
			// The writers: row r's byte j is r+1 ^ j, slack 0xEE; a writer of
			// the device writes rows 0..2 back to back and leaves the rest.
			r := m.Slot(1)
			var want []byte
			if !tt.p.Dense() {
				want = make([]byte, tt.p.Used)
				for j := range want {
					want[j] = byte(j*7 + 1)
				}
				if tt.staging {
					copy(r.Host, want)
				} else {
					copy(onDev, want)
				}
			} else {
				want = bytes.Repeat([]byte{0xA5}, int(tt.p.Lead)) // before row 0: nobody's
				for row := range tt.p.Rows {
					b := make([]byte, tt.p.Row)
					for j := range b {
						b[j] = byte(row+1) ^ byte(j)
					}
					if tt.staging {
						h := r.Host[tt.p.HostOffset(row):tt.p.HostOffset(row+1)]
						for j := range h {
							h[j] = 0xEE
						}
						copy(h[tt.p.Lead:], b)
					} else if row < 3 {
						copy(onDev[tt.p.DevOffset(row):], b)
					}
				}
				for row := range tt.p.Rows {
					var b []byte
					switch {
					case slices.Contains(tt.p.Zero, row):
						b = make([]byte, tt.p.Row)
					case slices.ContainsFunc(tt.p.Repeats, func(rp Repeat) bool { return rp.Row == row }):
						b = want[tt.p.DevOffset(2):tt.p.DevOffset(3)]
					case !tt.staging && row >= 3:
						b = bytes.Repeat([]byte{0xA5}, int(tt.p.Row))
					default:
						b = make([]byte, tt.p.Row)
						for j := range b {
							b[j] = byte(row+1) ^ byte(j)
						}
					}
					want = append(want, b...)
				}
			}
			want = slices.Clone(want)
			if err := m.Publish(context.Background(), 1, tt.p); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(onDev[:len(want)], want) {
				t.Errorf("device slot 1 differs from the batch%s", firstDiff(onDev[:len(want)], want))
			}
			if i := indexNot(onDev[len(want):], 0xA5); i >= 0 {
				t.Errorf("device byte %d past the batch's %d was written", len(want)+i, len(want))
			}
			if i := indexNot(all[:placementSlot], 0xA5); i >= 0 {
				t.Errorf("slot 0 was written at %d", i)
			}
			if ops == nil {
				return
			}
			var got []devOp
			for _, op := range ops() {
				if op.slot != 1 {
					t.Errorf("an operation on slot %d", op.slot)
				}
				got = append(got, devOp{kind: op.op.kind, width: op.op.width, height: op.op.height, dpitch: op.op.dpitch, spitch: op.op.spitch})
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.ops) {
				t.Errorf("operations %+v, want %+v", got, tt.ops)
			}
		})
	}
}

// TestPlacementRefused: Publish refuses a placement that does not fit the
// memory, naming the slot, and runs nothing.
func TestPlacementRefused(t *testing.T) {
	dev := newFake(t)
	m, err := openFake(dev, 2, 3*8192, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	h, err := Open(Pinned, 2, 3*8192, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, tt := range []struct {
		name string
		mem  Memory
		slot int
		p    Placement
	}{
		{"rows over the slot at their staging pitch", m, 0, Placement{Rows: 4, Row: 5000}},
		{"empty rows", m, 0, Placement{Rows: 3, Row: 0}},
		{"a row over MaxRow", m, 0, Placement{Rows: 1, Row: MaxRow + 1}},
		{"zero past the rows", m, 0, Placement{Rows: 3, Row: 5000, Zero: []int{3}}},
		{"a row repeating itself", m, 0, Placement{Rows: 3, Row: 5000, Repeats: []Repeat{{1, 1}}}},
		{"a repeat of a row past the end", m, 0, Placement{Rows: 3, Row: 5000, Repeats: []Repeat{{1, 3}}}},
		{"no such slot", m, 2, Placement{Rows: 1, Row: 5000}},
		{"ragged past the slot", m, 1, Ragged(3*8192 + 1)},
		{"dense rows over a host slot", h, 0, Placement{Rows: 5, Row: 5000}},
		{"dense rows over a host slot at their lead", h, 0, Placement{Rows: 3, Row: 8192, Lead: 1}},
		{"a lead of a whole block", m, 0, Placement{Rows: 1, Row: 5000, Lead: 4096}},
		{"dense rows over a GPU slot at their lead", m, 0, Placement{Rows: 3, Row: 8192, Lead: 1}},
		{"ragged past a host slot", h, 0, Ragged(3*8192 + 1)},
	} {
		if err := tt.mem.Publish(context.Background(), tt.slot, tt.p); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("slot %d", tt.slot)) {
			t.Errorf("%s: %v, want an error naming slot %d", tt.name, err, tt.slot)
		}
	}
	if len(dev.ops) != 0 {
		t.Errorf("refused placements ran %+v", dev.ops)
	}
	for _, tt := range []struct {
		kind      Kind
		rows      int
		row, lead int64
		want      bool
	}{
		{GPU, 3, 8192, 0, true}, {GPU, 3, 5000, 0, true}, {GPU, 7, 4096, 0, false}, {GPU, 6, 1, 0, true}, {GPU, 7, 1, 0, false}, {GPU, 1, 0, 0, false}, {GPU, 0, 1, 0, false},
		{GPU, 6, 4096 - 128, 128, true}, {GPU, 6, 4096 - 127, 128, false}, {GPU, 1, 1, -1, false}, {GPU, 1, 1, 4096, false},
		{Pinned, 1, 1, 0, true}, {Pinned, 3, 8192, 0, true}, {Pinned, 3, 8192, 1, false}, {Pinned, 3, 8191, 3, true}, {Pinned, 4, 6144, 0, true},
		{Pinned, 4, 6144, 4095, false}, {Pinned, 2, 0, 0, false}, {Kind("other"), 1, 1, 0, false},
	} {
		d := Desc{Kind: tt.kind, SlotSize: 3 * 8192}
		if tt.kind == GPU {
			d.SlotSize = 6 * 4096
		}
		if got := d.PacksAt(tt.rows, tt.row, tt.lead); got != tt.want {
			t.Errorf("%s slots of %d: PacksAt(%d, %d, %d) = %v", tt.kind, d.SlotSize, tt.rows, tt.row, tt.lead, got)
		}
		if tt.lead == 0 && d.Packs(tt.rows, tt.row) != tt.want {
			t.Errorf("%s slots of %d: Packs(%d, %d) = %v", tt.kind, d.SlotSize, tt.rows, tt.row, !tt.want)
		}
	}
}

// firstDiff says where got first differs from want.
func firstDiff(got, want []byte) string {
	for j := range min(len(got), len(want)) {
		if got[j] != want[j] {
			return fmt.Sprintf(": byte %d is %#x, want %#x", j, got[j], want[j])
		}
	}
	return ""
}

// indexNot returns the index of the first byte of b that is not c, -1
// when there is none.
func indexNot(b []byte, c byte) int {
	for i, x := range b {
		if x != c {
			return i
		}
	}
	return -1
}

// openFake opens GPU memory on a fake device as openGPU does: sized by
// Sizing.
func openFake(dev gpuDevice, slots int, slotSize int64, o Options) (*gpu, error) {
	s, err := Sizing(GPU, slots, slotSize, o.DeviceWrites)
	if err != nil {
		return nil, err
	}
	return newGPU(dev, slots, s, o)
}
