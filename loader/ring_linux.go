package loader

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Align is the alignment of slots and of every sample inside a slot: 4 KiB,
// what O_DIRECT and GPUDirect Storage (torch.cuda.gds) require.
const Align = 4096

// alignUp rounds n up to a multiple of Align.
func alignUp(n int64) int64 { return (n + Align - 1) &^ (Align - 1) }

// Ring is a fixed set of equal batch slots in one shared-memory mapping,
// allocated once, outside the Go heap, page-locked when the system allows.
// It is backed by a memfd, or by a file in a directory such as /dev/shm so
// another process can map it by name.
type Ring struct {
	mem      []byte
	slotSize int64
	slots    int
	fd       int
	path     string // the backing file's name, "" for a memfd
	pinErr   error  // why mlock failed, nil when pinned
}

// NewRing maps slots×slotSize bytes (slotSize rounded up to Align). With
// shmDir "" the memory is an anonymous memfd; otherwise it is a new file
// in shmDir readable only by its owner. Pages are populated up front and
// locked with mlock; when locking fails (RLIMIT_MEMLOCK), the ring still
// works and Pinned reports why it is not locked.
func NewRing(slots int, slotSize int64, shmDir string) (*Ring, error) {
	if slots <= 0 || slotSize <= 0 {
		return nil, fmt.Errorf("loader: ring of %d slots of %d bytes", slots, slotSize)
	}
	slotSize = alignUp(slotSize)
	size := int64(slots) * slotSize
	r := &Ring{slotSize: slotSize, slots: slots, fd: -1}
	var err error
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
	r.mem, err = unix.Mmap(r.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("loader: map %d bytes of batch memory: %w", size, err)
	}
	if err := unix.Mlock(r.mem); err != nil {
		r.pinErr = fmt.Errorf("mlock %d bytes: %w (raise RLIMIT_MEMLOCK, e.g. ulimit -l unlimited)", size, err)
	}
	return r, nil
}

// Slot returns slot i's memory.
func (r *Ring) Slot(i int) []byte {
	off := int64(i) * r.slotSize
	return r.mem[off : off+r.slotSize : off+r.slotSize]
}

// SlotOffset returns the byte offset of slot i in the shared memory.
func (r *Ring) SlotOffset(i int) int64 { return int64(i) * r.slotSize }

// SlotSize returns the size of each slot in bytes.
func (r *Ring) SlotSize() int64 { return r.slotSize }

// Slots returns the number of slots.
func (r *Ring) Slots() int { return r.slots }

// Size returns the size of the whole mapping.
func (r *Ring) Size() int64 { return int64(r.slots) * r.slotSize }

// Fd returns the descriptor of the backing memfd or file.
func (r *Ring) Fd() int { return r.fd }

// Path returns the backing file's path, or "" for a memfd.
func (r *Ring) Path() string { return r.path }

// Pinned returns nil when the memory is page-locked, else why not.
func (r *Ring) Pinned() error { return r.pinErr }

// Close unmaps and frees the memory and removes the backing file.
func (r *Ring) Close() error {
	var errs []error
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
