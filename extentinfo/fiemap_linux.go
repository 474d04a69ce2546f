// SPDX-License-Identifier: Apache-2.0

package extentinfo

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fsIocFiemap is _IOWR('f', 11, struct fiemap): struct fiemap is 32 bytes.
const fsIocFiemap = 0xC020660B

// fiemapFlagSync asks the kernel to flush dirty data first, so delayed
// allocations get real addresses.
const fiemapFlagSync = 0x0001

// fiemapBatch is how many extents one ioctl returns at most; most files
// need one call.
const fiemapBatch = 64

type fiemapHeader struct {
	Start    uint64
	Length   uint64
	Flags    uint32
	Mapped   uint32
	Count    uint32
	Reserved uint32
}

type fiemapExtent struct {
	Logical    uint64
	Physical   uint64
	Length     uint64
	Reserved64 [2]uint64
	Flags      uint32
	Reserved   [3]uint32
}

type fiemapRequest struct {
	hdr fiemapHeader
	ext [fiemapBatch]fiemapExtent
}

// Mapper issues FIEMAP ioctls with a reusable request buffer. A Mapper is
// not safe for concurrent use; give each goroutine its own.
type Mapper struct {
	req fiemapRequest
}

// Extents returns every extent of the open file f, looping over as many
// ioctls as the file needs until the kernel marks the last extent. Dirty
// data is synced first (FIEMAP_FLAG_SYNC). An empty file has no extents.
func (m *Mapper) Extents(f *os.File) ([]Extent, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("fiemap: %s: %w", f.Name(), err)
	}
	var out []Extent
	var ierr error
	cerr := rc.Control(func(fd uintptr) { out, ierr = m.ExtentsFd(int(fd), nil) })
	if cerr != nil {
		return nil, fmt.Errorf("fiemap: %s: %w", f.Name(), cerr)
	}
	if ierr != nil {
		return nil, fmt.Errorf("fiemap: %s: %w", f.Name(), ierr)
	}
	return out, nil
}

// ExtentsFd is Extents for a raw file descriptor; extents are appended to
// out. Errors are not wrapped with a file name.
func (m *Mapper) ExtentsFd(fd int, out []Extent) ([]Extent, error) {
	var start uint64
	for {
		m.req.hdr = fiemapHeader{Start: start, Length: ^uint64(0) - start, Flags: fiemapFlagSync, Count: fiemapBatch}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFiemap, uintptr(unsafe.Pointer(&m.req)))
		if errno != 0 {
			if errno == unix.EOPNOTSUPP || errno == unix.ENOTTY {
				return nil, fmt.Errorf("%w: %w", ErrNoFiemap, errno)
			}
			return nil, errno
		}
		n := int(m.req.hdr.Mapped)
		if n > fiemapBatch {
			return nil, errors.New("kernel returned more extents than asked for")
		}
		if n == 0 {
			return out, nil
		}
		for i := 0; i < n; i++ {
			e := &m.req.ext[i]
			out = append(out, Extent{Logical: e.Logical, Physical: e.Physical, Length: e.Length, Flags: e.Flags})
		}
		last := &m.req.ext[n-1]
		if last.Flags&FlagLast != 0 {
			return out, nil
		}
		next := last.Logical + last.Length
		if next <= start || last.Length == 0 {
			return nil, fmt.Errorf("FIEMAP made no progress at offset %d", start)
		}
		start = next
	}
}
