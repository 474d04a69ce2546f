// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/numa"
)

// host is Pinned memory: one memfd mapping outside the Go heap, page-locked on first use.
// Seals keep a client from resizing it or writing it.
type host struct {
	mem    []byte
	desc   Desc
	fd     int
	pinErr error // why mlock failed, nil when pinned
	// unregister undoes the CUDA registration of staging memory; nil when
	// not registered.
	unregister func() error
	// pageSize is the huge page size the memory is on, 0 for ordinary
	// pages.
	pageSize int64
}

// openHost maps size bytes, locked with mlock2(MLOCK_ONFAULT).
// Each page is locked from its first use, so resident memory follows the batches read.
// Huge pages are not locked: they are never swapped, and locking would allocate them all.
// Without MLOCK_ONFAULT every page is locked at once.
// When locking fails the memory still works and Pinned says why.
//
// With enough free huge pages the memory is a hugetlb memfd, taken whole at mapping.
// Else it logs so and uses ordinary pages, advised huge where the kernel allows.
//
// Host memory is not registered with CUDA here; GPU memory's staging area is, by openGPU.
// A registration would serve only the daemon, which copies nothing from pinned memory.
func openHost(slots int, slotSize, size int64, o Options, node int) (*host, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if avail, err := memAvailable(); err == nil && size > avail {
		return nil, fmt.Errorf("batchmem: %w: %d slots of %d KiB need up to %d MiB, the machine has %d MiB available (a smaller batch_size or prefetch)",
			ErrNoSpace, slots, slotSize>>10, size>>20, avail>>20)
	}
	h, why := openHuge(slots, slotSize, size)
	if h == nil {
		o.Logger.Info("batchmem: batch memory on small pages", "why", why)
		var err error
		if h, err = openMemfd(slots, slotSize, size, 0); err != nil {
			return nil, err
		}
		unix.Madvise(h.mem, unix.MADV_HUGEPAGE) // effective only where shmem_enabled allows it
	} else {
		o.Logger.Info("batchmem: batch memory on huge pages", "page_kib", h.pageSize>>10, "size_mib", h.desc.Size>>20)
	}
	if node >= 0 { // before any page is allocated
		if err := numa.Prefer(h.mem, node); err != nil {
			o.Logger.Warn("batchmem: batch memory not placed on the GPU's NUMA node", "node", node, "err", err)
		} else {
			h.desc.NUMANode = node
		}
	}
	if h.pageSize > 0 {
		// Huge pages are never swapped. mlock would only allocate and zero
		// every page now: the kernel populates hugetlb memory whole even
		// with MLOCK_ONFAULT (seconds for 8 sessions' slots).
		return h, nil
	}
	err := mlockOnFault(h.mem)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) { // no MLOCK_ONFAULT: lock (and populate) it all
		err = unix.Mlock(h.mem)
	}
	if err != nil {
		h.pinErr = fmt.Errorf("mlock %d bytes: %w (raise RLIMIT_MEMLOCK, e.g. ulimit -l unlimited)", size, err)
		o.Logger.Warn("batchmem: batch memory is not page-locked", "err", h.pinErr)
	}
	return h, nil
}

// openHuge opens size bytes on huge pages when enough are free and one divides size.
// Else it returns nil and why not.
func openHuge(slots int, slotSize, size int64) (*host, string) {
	info, err := meminfo("Hugepagesize:", "HugePages_Free:")
	if err != nil {
		return nil, err.Error() // e.g. "no Hugepagesize: in /proc/meminfo": a kernel without huge pages
	}
	page, free := info["Hugepagesize:"]<<10, info["HugePages_Free:"]
	if page == 0 {
		return nil, "the kernel has no huge pages"
	}
	if size%page != 0 {
		return nil, fmt.Sprintf("%d bytes are not whole huge pages of %d KiB", size, page>>10)
	}
	if need := size / page; free < need {
		return nil, fmt.Sprintf("%d huge pages of %d KiB needed, %d free (vm.nr_hugepages)", need, page>>10, free)
	}
	h, err := openMemfd(slots, slotSize, size, page)
	if err != nil { // reserved by another process meanwhile, or no hugetlb memfd
		return nil, err.Error()
	}
	return h, ""
}

// openMemfd makes, seals and maps a memfd for slots slots of slotSize bytes.
// pageSize 0 means ordinary pages, else hugetlb pages of that size.
//
// Only the daemon's mapping may write the memory.
// The memfd is mode 0400, so reopening a client's descriptor through /proc gives nothing more.
// Where the kernel has it, F_SEAL_FUTURE_WRITE then stops every new writer, root included.
// Size seals hold on every kernel; F_SEAL_SEAL comes last.
func openMemfd(slots int, slotSize, size, pageSize int64) (*host, error) {
	h := &host{desc: Desc{Kind: Pinned, Size: size, SlotSize: slotSize, Slots: slots, Device: -1, NUMANode: -1}, fd: -1, pageSize: pageSize}
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	if pageSize > 0 {
		flags |= unix.MFD_HUGETLB
	}
	var err error
	if h.fd, err = unix.MemfdCreate("nvfeed-batches", flags); err != nil {
		return nil, fmt.Errorf("batchmem: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(h.fd, size); err != nil {
		h.Close()
		return nil, fmt.Errorf("batchmem: size batch memory to %d bytes: %w", size, err)
	}
	if err := unix.Fchmod(h.fd, 0o400); err != nil {
		h.Close()
		return nil, fmt.Errorf("batchmem: make batch memory read-only to others: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(h.fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		h.Close()
		return nil, fmt.Errorf("batchmem: seal batch memory's size: %w", err)
	}
	if h.mem, err = unix.Mmap(h.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		h.Close()
		return nil, fmt.Errorf("batchmem: map %d bytes of batch memory: %w", size, err)
	}
	// EINVAL: a kernel before F_SEAL_FUTURE_WRITE; the mode still keeps
	// other uids from reopening the memfd writable.
	if _, err := unix.FcntlInt(uintptr(h.fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); err != nil && !errors.Is(err, unix.EINVAL) {
		h.Close()
		return nil, fmt.Errorf("batchmem: seal batch memory against writes: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(h.fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL); err != nil {
		h.Close()
		return nil, fmt.Errorf("batchmem: seal batch memory's seals: %w", err)
	}
	return h, nil
}

// Desc describes the memory.
func (h *host) Desc() Desc { return h.desc }

// Slot returns slot i's memory as Host.
func (h *host) Slot(i int) Region {
	off := int64(i) * h.desc.SlotSize
	return Region{Host: h.mem[off : off+h.desc.SlotSize : off+h.desc.SlotSize]}
}

// Publish checks p. A ragged batch already lies where the client maps it.
// Of a dense batch it zeroes the bytes before row 0 and the Zero rows, then copies Repeats.
func (h *host) Publish(_ context.Context, i int, p Placement) error {
	if err := p.check(h.desc, i); err != nil {
		return err
	}
	if !p.Dense() {
		return nil
	}
	slot := h.Slot(i).Host
	clear(slot[:p.Lead])
	p.fill(func(j int) []byte { return slot[p.DevOffset(j) : p.DevOffset(j)+p.Row] })
	return nil
}

// Export opens the memfd anew, read-only: the client can map the memory
// but neither write nor resize it, nor reopen it writable (openMemfd).
func (h *host) Export() (*os.File, error) {
	f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", h.fd), os.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("batchmem: export batch memory read-only: %w", err)
	}
	return f, nil
}

// Pinned returns nil when the memory is page-locked, else why not.
func (h *host) Pinned() error { return h.pinErr }

// Close unregisters, unmaps and closes the memory; its pages are freed
// once no client maps them either.
func (h *host) Close() error {
	var errs []error
	if h.unregister != nil { // before the mapping goes
		errs = append(errs, h.unregister())
		h.unregister = nil
	}
	if h.mem != nil {
		errs = append(errs, unix.Munmap(h.mem))
		h.mem = nil
	}
	if h.fd >= 0 {
		errs = append(errs, unix.Close(h.fd))
		h.fd = -1
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("batchmem: close: %w", err)
	}
	return nil
}

// mlockOnFault is mlock2(b, MLOCK_ONFAULT).
func mlockOnFault(b []byte) error {
	_, _, errno := unix.Syscall(unix.SYS_MLOCK2, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), unix.MLOCK_ONFAULT)
	if errno != 0 {
		return errno
	}
	return nil
}

// memAvailable returns /proc/meminfo's MemAvailable in bytes.
func memAvailable() (int64, error) {
	info, err := meminfo("MemAvailable:")
	return info["MemAvailable:"] << 10, err
}

// meminfo returns the numbers /proc/meminfo gives for keys (kB for sizes,
// counts for page counts); a key it lacks is an error.
func meminfo(keys ...string) (map[string]int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && slices.Contains(keys, string(f[0])) {
			if out[string(f[0])], err = strconv.ParseInt(string(f[1]), 10, 64); err != nil {
				return nil, fmt.Errorf("/proc/meminfo: %s: %w", f[0], err)
			}
		}
	}
	for _, k := range keys {
		if _, ok := out[k]; !ok {
			return out, fmt.Errorf("no %s in /proc/meminfo", k)
		}
	}
	return out, nil
}

var _ Memory = (*host)(nil)
