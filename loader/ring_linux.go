package loader

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// Ring is the host batch memory (a Memory): a fixed set of equal slots in
// one shared-memory mapping,
// allocated once, outside the Go heap, page-locked when the system allows.
// It is backed by a memfd, or by a file in a directory such as /dev/shm so
// another process can map it by name.
type Ring struct {
	mem      []byte
	slotSize int64
	slots    int
	fd       int
	path     string        // the backing file's name, "" for a memfd
	pinErr   error         // why mlock failed, nil when pinned
	cuda     *cuda.Runtime // set once registered with CUDA
}

// NewRing maps slots×slotSize bytes (slotSize rounded up to backend.Align). With
// shmDir "" the memory is an anonymous memfd; otherwise it is a new file
// in shmDir readable only by its owner. The memory is locked with
// mlock2(MLOCK_ONFAULT): each page is page-locked from its first use and
// never swapped, but none is allocated before it is used. A slot is sized
// for the worst batch (SlotBytes: the batch of the largest samples) while
// a typical batch uses a fraction of it, so the ring's resident memory
// follows the batches actually read, not slots×slotSize (and opening a
// session zeroes nothing). On a kernel without MLOCK_ONFAULT (before 4.4)
// every page is populated and locked at once. When locking fails
// (RLIMIT_MEMLOCK), the ring still works and Pinned reports why it is not
// locked.
func NewRing(slots int, slotSize int64, shmDir string) (*Ring, error) {
	if slots <= 0 || slotSize <= 0 {
		return nil, fmt.Errorf("loader: ring of %d slots of %d bytes", slots, slotSize)
	}
	slotSize = backend.AlignUp(slotSize)
	size := int64(slots) * slotSize
	r := &Ring{slotSize: slotSize, slots: slots, fd: -1}
	var err error
	if shmDir != "" {
		var st unix.Statfs_t
		if err := unix.Statfs(shmDir, &st); err != nil {
			return nil, fmt.Errorf("loader: batch memory in %s: %w", shmDir, err)
		}
		if free := int64(st.Bavail) * st.Bsize; free < size {
			return nil, fmt.Errorf("loader: %w: %s has %d MiB free, a ring of %d slots of %d KiB needs up to %d MiB (free space there, or a smaller batch_size or prefetch)",
				ErrNoSpace, shmDir, free>>20, slots, slotSize>>10, size>>20)
		}
	}
	if shmDir == "" {
		r.fd, err = unix.MemfdCreate("nvfeed-ring", unix.MFD_CLOEXEC)
	} else {
		var b [8]byte
		rand.Read(b[:])
		r.path = filepath.Join(shmDir, fmt.Sprintf("nvfeed-%d-%s", os.Getpid(), hex.EncodeToString(b[:])))
		r.fd, err = unix.Open(r.path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("loader: create batch memory: %w", err)
	}
	if err := unix.Ftruncate(r.fd, size); err != nil {
		r.Close()
		return nil, fmt.Errorf("loader: size batch memory to %d bytes: %w", size, err)
	}
	r.mem, err = unix.Mmap(r.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("loader: map %d bytes of batch memory: %w", size, err)
	}
	err = mlockOnFault(r.mem)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) { // no MLOCK_ONFAULT: lock (and populate) it all
		err = unix.Mlock(r.mem)
	}
	if err != nil {
		r.pinErr = fmt.Errorf("mlock %d bytes: %w (raise RLIMIT_MEMLOCK, e.g. ulimit -l unlimited)", size, err)
	}
	return r, nil
}

// Slot returns slot i's memory.
func (r *Ring) Slot(i int) []byte {
	off := int64(i) * r.slotSize
	return r.mem[off : off+r.slotSize : off+r.slotSize]
}

// Slots returns the number of slots.
func (r *Ring) Slots() int { return r.slots }

// Publish does nothing: the host ring is what the consumer reads.
func (r *Ring) Publish(context.Context, int, int64) error { return nil }

// Handle returns the backing file's path and the mapping's size.
func (r *Ring) Handle() MemoryHandle {
	return MemoryHandle{Kind: MemoryPinned, Path: r.path, Size: int64(r.slots) * r.slotSize, SlotSize: r.slotSize}
}

// Share gives the memory to uid, mode 0400: only that user (and root) can
// map it.
func (r *Ring) Share(uid int) error {
	if err := unix.Fchown(r.fd, uid, -1); err != nil {
		return fmt.Errorf("loader: batch memory %s: chown to uid %d: %w", r.path, uid, err)
	}
	if err := unix.Fchmod(r.fd, 0o400); err != nil {
		return fmt.Errorf("loader: batch memory %s: chmod 0400: %w", r.path, err)
	}
	return nil
}

// RegisterCUDA registers the memory with CUDA (cudaHostRegister,
// portable), so host-to-device copies from it are DMA, not staged; Close
// unregisters it.
func (r *Ring) RegisterCUDA(rt *cuda.Runtime) error {
	if err := rt.HostRegister(r.mem); err != nil {
		return fmt.Errorf("loader: batch memory: %w", err)
	}
	r.cuda = rt
	return nil
}

// Pinned returns nil when the memory is page-locked, else why not.
func (r *Ring) Pinned() error { return r.pinErr }

// Close unmaps and frees the memory and removes the backing file.
func (r *Ring) Close() error {
	var errs []error
	if r.cuda != nil {
		errs = append(errs, r.cuda.HostUnregister(r.mem))
		r.cuda = nil
	}
	if r.mem != nil {
		errs = append(errs, unix.Munmap(r.mem))
		r.mem = nil
	}
	if r.fd >= 0 {
		errs = append(errs, unix.Close(r.fd))
		r.fd = -1
	}
	if r.path != "" {
		if err := os.Remove(r.path); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
		r.path = ""
	}
	return errors.Join(errs...)
}

var _ Memory = (*Ring)(nil)

// mlockOnFault is mlock2(b, MLOCK_ONFAULT).
func mlockOnFault(b []byte) error {
	_, _, errno := unix.Syscall(unix.SYS_MLOCK2, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), unix.MLOCK_ONFAULT)
	if errno != 0 {
		return errno
	}
	return nil
}
