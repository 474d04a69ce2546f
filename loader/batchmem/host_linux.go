package batchmem

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/numa"
)

// host is Pinned memory: one memfd mapping, outside the Go heap, sealed
// against resizing (a client holding its descriptor cannot shrink it under
// the daemon's writes), page-locked on first use and registered with CUDA
// where a driver is present.
type host struct {
	mem    []byte
	desc   Desc
	fd     int
	pinErr error         // why mlock failed, nil when pinned
	cuda   *cuda.Runtime // set once registered with CUDA
}

// openHost maps the memory. It is locked with mlock2(MLOCK_ONFAULT): each
// page is page-locked from its first use and never swapped, but none is
// allocated before it is used. A slot is sized for the worst batch while a
// typical batch uses a fraction of it, so resident memory follows the
// batches actually read (and opening zeroes nothing). On a kernel without
// MLOCK_ONFAULT every page is populated and locked at once. When locking
// fails (RLIMIT_MEMLOCK) the memory still works and Pinned says why it is
// not locked.
func openHost(slots int, slotSize int64, o Options, node int) (*host, error) {
	size := int64(slots) * slotSize
	if avail, err := memAvailable(); err == nil && size > avail {
		return nil, fmt.Errorf("batchmem: %w: %d slots of %d KiB need up to %d MiB, the machine has %d MiB available (a smaller batch_size or prefetch)",
			ErrNoSpace, slots, slotSize>>10, size>>20, avail>>20)
	}
	h := &host{desc: Desc{Kind: Pinned, Size: size, SlotSize: slotSize, Slots: slots, Device: -1, NUMANode: -1}, fd: -1}
	var err error
	if h.fd, err = unix.MemfdCreate("nvfeed-batches", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING); err != nil {
		return nil, fmt.Errorf("batchmem: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(h.fd, size); err != nil {
		h.Close()
		return nil, fmt.Errorf("batchmem: size batch memory to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(h.fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		h.Close()
		return nil, fmt.Errorf("batchmem: seal batch memory: %w", err)
	}
	if h.mem, err = unix.Mmap(h.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		h.Close()
		return nil, fmt.Errorf("batchmem: map %d bytes of batch memory: %w", size, err)
	}
	if node >= 0 { // before any page is allocated
		if err := numa.Prefer(h.mem, node); err != nil {
			o.Logger.Warn("batchmem: batch memory not placed on the GPU's NUMA node", "node", node, "err", err)
		} else {
			h.desc.NUMANode = node
		}
	}
	err = mlockOnFault(h.mem)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) { // no MLOCK_ONFAULT: lock (and populate) it all
		err = unix.Mlock(h.mem)
	}
	if err != nil {
		h.pinErr = fmt.Errorf("mlock %d bytes: %w (raise RLIMIT_MEMLOCK, e.g. ulimit -l unlimited)", size, err)
		o.Logger.Warn("batchmem: batch memory is not page-locked", "err", h.pinErr)
	}
	if rt, err := cuda.Load(); err == nil { // with a driver: CUDA-pinned, so copies to a GPU are DMA
		if err := rt.HostRegister(h.mem); err != nil {
			o.Logger.Warn("batchmem: batch memory is not registered with CUDA", "err", err)
		} else {
			h.cuda = rt
		}
	} else if !errors.Is(err, cuda.ErrNoDriver) { // a driver without a usable runtime: say so
		o.Logger.Warn("batchmem: batch memory is not registered with CUDA", "err", err)
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

// Publish does nothing: the memory is what the client maps.
func (h *host) Publish(context.Context, int, int64) error { return nil }

// Export opens the memfd anew, read-only: the client can map the memory
// but neither write nor resize it.
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
	if h.cuda != nil {
		errs = append(errs, h.cuda.HostUnregister(h.mem))
		h.cuda = nil
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
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}

var _ Memory = (*host)(nil)
