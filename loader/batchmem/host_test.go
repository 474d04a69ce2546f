// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader/backend"
)

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		name     string
		kind     Kind
		slots    int
		slotSize int64
		want     error
	}{
		{"unknown kind", "hbm", 2, 4096, ErrKind},
		{"more than the machine has", Pinned, 4, 1 << 50, ErrNoSpace},
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); err != nil {
		tests = append(tests, struct {
			name     string
			kind     Kind
			slots    int
			slotSize int64
			want     error
		}{"gpu without a driver", GPU, 2, 4096, ErrNoCUDA})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Open(tt.kind, tt.slots, tt.slotSize, Options{})
			if !errors.Is(err, tt.want) {
				if m != nil {
					m.Close()
				}
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	for _, bad := range []struct {
		slots int
		size  int64
	}{{0, 4096}, {2, 0}, {-1, 4096}} {
		if _, err := Open(Pinned, bad.slots, bad.size, Options{}); err == nil {
			t.Errorf("%d slots of %d bytes: no error", bad.slots, bad.size)
		}
	}
}

// TestHostSlots: slots are backend.Align-sized and aligned, adjacent at
// i·SlotSize, and the description says so.
func TestHostSlots(t *testing.T) {
	m, err := Open("", 3, 5000, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d := m.Desc()
	want := Desc{Kind: Pinned, Size: 3 * 8192, SlotSize: 8192, Slots: 3, Device: -1, NUMANode: -1}
	if d != want {
		t.Fatalf("Desc() = %+v, want %+v", d, want)
	}
	base := uintptr(unsafeAddr(m.Slot(0).Host))
	for i := range d.Slots {
		r := m.Slot(i)
		if r.Dev != 0 || int64(len(r.Host)) != d.SlotSize || int64(cap(r.Host)) != d.SlotSize {
			t.Fatalf("slot %d: %d bytes (cap %d), dev %#x", i, len(r.Host), cap(r.Host), r.Dev)
		}
		if a := uintptr(unsafeAddr(r.Host)); a%backend.Align != 0 || a-base != uintptr(int64(i)*d.SlotSize) {
			t.Fatalf("slot %d at %#x: not aligned or not at i*SlotSize from slot 0 (%#x)", i, a, base)
		}
	}
}

// TestHostExport: the client's descriptor maps the memory read-only and
// sees what was written into the slots; it can neither write, map
// writable, nor resize the memory; no page is allocated before it is
// used; the client's mapping outlives Close.
func TestHostExport(t *testing.T) {
	m, err := Open(Pinned, 4, 1<<20, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m.(*host).pageSize != 0 {
		t.Skip("this machine has free huge pages: TestHostHugePages covers them")
	}
	testExport(t, m, false)
}

// TestHostHugePages reserves huge pages (vm.nr_hugepages, restored after)
// and checks that batch memory goes on them, its size rounded up to whole
// pages, with every promise of TestHostExport, each page allocated on its
// first use (reserved when mapped); and that without enough free ones
// it goes on small pages and says why.
func TestHostHugePages(t *testing.T) {
	const sysctl = "/proc/sys/vm/nr_hugepages"
	old, err := os.ReadFile(sysctl)
	if err != nil {
		t.Skipf("no huge pages in this kernel: %v", err)
	}
	defer os.WriteFile(sysctl, old, 0o644)
	info, err := meminfo("HugePages_Free:", "Hugepagesize:")
	if err != nil {
		t.Fatal(err)
	}
	page := info["Hugepagesize:"] << 10
	want := info["HugePages_Free:"] + 3
	n, _ := strconv.Atoi(strings.TrimSpace(string(old)))
	if err := os.WriteFile(sysctl, []byte(strconv.Itoa(n+3)), 0o644); err != nil {
		testenv.SkipPrivileged(t, "cannot reserve huge pages: %v", err)
	}
	if info, _ := meminfo("HugePages_Free:"); info["HugePages_Free:"] < want {
		t.Skipf("the kernel found only %d free huge pages (fragmented memory)", info["HugePages_Free:"])
	}
	// Three slots of a page and a bit need four pages; three are free.
	s, err := Sizing(Pinned, 3, page+4096, false)
	if err != nil {
		t.Fatal(err)
	}
	h, why := openHuge(3, s.SlotSize, s.Host)
	if h != nil || !strings.Contains(why, "4 huge pages") {
		t.Errorf("3 slots of a page and a bit: %v, %q; want refused, naming the 4 pages needed", h, why)
		if h != nil {
			h.Close()
		}
	}
	free := func() int64 {
		t.Helper()
		info, err := meminfo("HugePages_Free:")
		if err != nil {
			t.Fatal(err)
		}
		return info["HugePages_Free:"]
	}
	before := free()
	m, err := Open(Pinned, 5, page/2+4096, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := free(); got != before {
		t.Errorf("free huge pages %d after open, %d before: want none allocated before use", got, before)
	}
	m.Slot(4).Host[0] = 1 // the last page
	if got := free(); got != before-1 {
		t.Errorf("free huge pages %d after writing one page, %d before open: want one allocated", got, before)
	}
	if h := m.(*host); h.pageSize != page || m.Desc().SlotSize != page/2+4096 || m.Desc().Size != 3*page {
		t.Fatalf("page %d, desc %+v: want slots as asked in 3 huge pages of %d", h.pageSize, m.Desc(), page)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(m.(*host).fd, &fs); err != nil || fs.Type != unix.HUGETLBFS_MAGIC {
		t.Fatalf("memory on filesystem %#x (err %v), want hugetlbfs", fs.Type, err)
	}
	testExport(t, m, true)
}

// testExport checks m's export as TestHostExport says, and closes m.
// reserved says its pages are all allocated when mapped (huge pages).
func testExport(t *testing.T, m Memory, reserved bool) {
	closed := false
	defer func() {
		if !closed {
			m.Close()
		}
	}()
	f, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != m.Desc().Size {
		t.Fatalf("exported size %d, want %d", st.Size, m.Desc().Size)
	}
	if st.Blocks != 0 && !reserved {
		t.Errorf("a new memory already has %d blocks: pages allocated before use", st.Blocks)
	}
	if _, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); !errors.Is(err, unix.EACCES) {
		t.Errorf("writable shared mapping of the exported descriptor: err = %v, want EACCES", err)
	}
	if _, err := f.Write([]byte("x")); err == nil {
		t.Errorf("write through the exported descriptor succeeded")
	}
	if err := unix.Ftruncate(fd, 0); err == nil {
		t.Errorf("the exported descriptor could shrink the memory")
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL; err != nil || seals&want != want {
		t.Errorf("seals %#x (err %v), want shrink, grow and seal sealed", seals, err)
	}
	if perm := st.Mode & 0o7777; perm != 0o400 {
		t.Errorf("the memfd's mode is %04o, want 0400: another uid could reopen it through /proc", perm)
	}
	// Reopened writable through /proc (root may: the mode does not stop
	// it), the memory still takes no write: F_SEAL_FUTURE_WRITE.
	if seals&unix.F_SEAL_FUTURE_WRITE == 0 {
		t.Logf("no F_SEAL_FUTURE_WRITE (kernel before 5.1?): seals %#x", seals)
	} else if rw, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDWR, 0); err == nil {
		if _, err := rw.WriteAt([]byte("x"), 0); err == nil {
			t.Errorf("write through the memfd reopened read-write succeeded")
		}
		if _, err := unix.Mmap(int(rw.Fd()), 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); !errors.Is(err, unix.EPERM) {
			t.Errorf("writable shared mapping of the memfd reopened read-write: err = %v, want EPERM", err)
		}
		rw.Close()
	}
	view, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(view)
	slot := m.Slot(2).Host
	copy(slot, "batch bytes")
	off := 2 * m.Desc().SlotSize
	if !bytes.Equal(view[off:off+11], []byte("batch bytes")) {
		t.Fatalf("the client's view at slot 2 reads %q", view[off:off+11])
	}
	unix.Fstat(fd, &st)
	if st.Blocks == 0 {
		t.Errorf("a written slot allocated no blocks: the export is not the same memory")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if !bytes.Equal(view[off:off+11], []byte("batch bytes")) {
		t.Fatalf("after Close the client's view reads %q", view[off:off+11])
	}
}
func unsafeAddr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

// TestHostPublishDense: in host memory a dense batch's rows lie where
// their writers put them (Lead + i·Row); Publish zeroes the bytes before
// row 0 and the failed rows, copies the padding rows from the row they
// repeat, and writes nothing past the last row nor in another slot. A
// ragged batch is left as it lies.
func TestHostPublishDense(t *testing.T) {
	m, err := Open(Pinned, 2, 6*8192, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	slot0, slot1 := m.Slot(0).Host, m.Slot(1).Host
	for i := range slot0 {
		slot0[i], slot1[i] = 0xA5, 0xA5 // an older batch's bytes
	}
	p := Placement{Rows: 5, Row: 5000, Lead: 200, Zero: []int{1}, Repeats: []Repeat{{3, 2}, {4, 2}}}
	rowOf := func(r int) []byte {
		b := make([]byte, p.Row)
		for j := range b {
			b[j] = byte(r+1) ^ byte(j)
		}
		return b
	}
	for r := range 3 { // rows 3 and 4 repeat row 2; row 1 failed half way
		copy(slot1[p.DevOffset(r):], rowOf(r))
	}
	if err := m.Publish(context.Background(), 1, p); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, p.Lead)
	for r, src := range []int{0, -1, 2, 2, 2} {
		if src < 0 {
			want = append(want, make([]byte, p.Row)...)
		} else {
			want = append(want, rowOf(src)...)
		}
		if got := slot1[p.DevOffset(r) : p.DevOffset(r)+p.Row]; !bytes.Equal(got, want[p.DevOffset(r):]) {
			t.Errorf("row %d differs%s", r, firstDiff(got, want[p.DevOffset(r):]))
		}
	}
	if !bytes.Equal(slot1[:len(want)], want) {
		t.Errorf("the slot differs from the batch%s", firstDiff(slot1[:len(want)], want))
	}
	if i := indexNot(slot1[len(want):], 0xA5); i >= 0 {
		t.Errorf("byte %d past the rows was written", len(want)+i)
	}
	if i := indexNot(slot0, 0xA5); i >= 0 {
		t.Errorf("slot 0 was written at %d", i)
	}
	if err := m.Publish(context.Background(), 0, Ragged(8192)); err != nil || indexNot(slot0, 0xA5) >= 0 {
		t.Errorf("a ragged publish: %v, or it wrote the slot", err)
	}
}
