// SPDX-License-Identifier: Apache-2.0

// Package samplefile opens and reads a sample's file for every built-in
// backend: the file backend's reads, the raw backends' reads of
// filesystem-only and changed samples, cufile's opens.
//
// Every open is bound to the file that was mapped: the descriptor's
// device and inode must be the map's, or the sample fails (a path that
// now names another file never yields that file's bytes). With a
// caller's Opener (AsCaller) every open is made as the caller, by
// absolute path, so the kernel checks the caller's access to the file and
// to every directory on its resolved path, symlinks included, at each
// read.
package samplefile

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// ErrReplaced is wrapped by a sample's error when its path now names
// another file than the one mapped.
var ErrReplaced = errors.New("the path names another file than the one mapped")

// Opener opens a path with flags (O_CLOEXEC included) and returns the
// descriptor: backend.Caller.Open as a caller, or nil for the calling
// thread's own credentials.
type Opener func(path string, flags int) (int, error)

// AsCaller returns the Opener of o, or nil (the calling thread's own
// credentials) for a nil o.
func AsCaller(o *backend.Caller) Opener {
	if o == nil {
		return nil
	}
	return o.Open
}

// Reader reads samples of one map through the filesystem.
type Reader struct {
	root   string
	dev    uint64 // the root's filesystem
	direct bool
}

// NewReader makes a Reader of m's samples, with O_DIRECT when direct.
func NewReader(m *bmap.Map, direct bool) (*Reader, error) {
	var st unix.Stat_t
	if err := unix.Stat(m.Root, &st); err != nil {
		return nil, fmt.Errorf("fsread: dataset root: %w", err)
	}
	return &Reader{root: m.Root, dev: st.Dev, direct: direct}, nil
}

// Path returns s's absolute path.
func (r *Reader) Path(s *bmap.Sample) string { return filepath.Join(r.root, s.Path) }

// Flags returns the flags every sample is opened with.
func (r *Reader) Flags() int {
	f := unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY
	if r.direct {
		f |= unix.O_DIRECT
	}
	return f
}

// OpenSample opens s's file by its absolute path with flags, through open
// (nil: this thread's credentials), and checks that it is the file that
// was mapped: a regular file with the map's inode, on the root's
// filesystem unless the map says it lives on another. The error names
// the path; a file that is not the mapped one wraps ErrReplaced.
func (r *Reader) OpenSample(s *bmap.Sample, flags int, open Opener) (int, error) {
	path := r.Path(s)
	flags |= unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY
	var fd int
	var err error
	if open != nil {
		fd, err = open(path, flags)
	} else {
		fd, err = openRetry(path, flags)
	}
	if err != nil {
		return -1, fmt.Errorf("open: %w", err)
	}
	if err := r.bind(fd, s); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// OpenBlocking is OpenSample for a descriptor handed to a library that
// refuses O_NONBLOCK (cuFile's cuFileHandleRegister: "fd opened with
// unsupported flags", CU_FILE_INVALID_FILE_OPEN_FLAG): the open is made
// with O_NONBLOCK, so that a FIFO or device swapped in at the path never
// blocks it, and only once the descriptor is checked to be the mapped
// regular file (where O_NONBLOCK changes no read) is O_NONBLOCK cleared.
func (r *Reader) OpenBlocking(s *bmap.Sample, flags int, open Opener) (int, error) {
	fd, err := r.OpenSample(s, flags, open)
	if err != nil {
		return -1, err
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("clear O_NONBLOCK: %w", err)
	}
	return fd, nil
}

// bind checks that fd is s's mapped file (see OpenSample).
func (r *Reader) bind(fd int, s *bmap.Sample) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Ino != s.Inode || (s.Reason != bmap.OtherFS && st.Dev != r.dev) {
		return fmt.Errorf("%w (device %d inode %d, mapped inode %d)", ErrReplaced, st.Dev, st.Ino, s.Inode)
	}
	return nil
}

// Read reads req's sample, the file's bytes [Offset, Offset+Size), into
// req.Buf[At:At+Size] (ReadOpened). The file is opened with OpenSample
// through open. It fails with a *backend.SampleError: wrapping
// ErrReplaced when the path names another file, backend.ErrShortRead
// when the file's length differs from the map's.
func (r *Reader) Read(req *backend.Request, open Opener) error {
	fd, err := r.OpenSample(req.Sample, r.Flags(), open)
	if err != nil {
		return &backend.SampleError{Index: req.Index, Path: req.Sample.Path, Err: err}
	}
	return r.ReadOpened(req, fd)
}

// ReadFd is Read of a file already opened (with the Reader's flags) by
// whoever had to open it: it checks that fd is the mapped file, reads,
// and closes fd.
func (r *Reader) ReadFd(req *backend.Request, fd int) error {
	if err := r.bind(fd, req.Sample); err != nil {
		unix.Close(fd)
		return &backend.SampleError{Index: req.Index, Path: req.Sample.Path, Err: err}
	}
	return r.ReadOpened(req, fd)
}

// ReadOpened reads req's sample from fd, an open of the mapped file
// (with the Reader's flags) already checked to be it, into
// req.Buf[At:At+Size], and closes fd.
//
// With the Reader's direct, the read is O_DIRECT where it can be: Buf's
// address and the file offset Offset-At are Align-aligned and Buf holds
// AlignUp(At+Size) bytes; then whole blocks are read from Offset-At into
// Buf (the bytes before the data, a tensor's header, into the slack
// Buf[:At]). Elsewhere, a dense row at an unaligned address or a room
// whose phase is not the file's, O_DIRECT is cleared on fd and the bytes
// are read with a plain pread at Offset. Where the room has space after
// the data, the read asks for it too (a file that grew shows up as a
// longer read); else the file's size is compared with the map's
// (Offset+Size).
//
// A tensor sample whose file is not exactly as mapped after the read (its
// modification or change time moved) has its .npy header parsed again: a
// header that no longer says the map's dtype, shape, order and data
// offset fails the sample (bmap.ErrStale), never served with the map's
// old layout.
func (r *Reader) ReadOpened(req *backend.Request, fd int) error {
	defer unix.Close(fd)
	if err := r.read(req, fd); err != nil {
		return err
	}
	return CheckTensor(req, fd)
}

// CheckTensor checks, after its read, that tensor sample req's file at fd
// is unchanged since mapping (modification and change time), or else
// that its header still says what the map does
// (bmap.Sample.CheckHeaderFd): a *backend.SampleError wrapping
// bmap.ErrStale otherwise. A sample without a tensor passes at no cost.
func CheckTensor(req *backend.Request, fd int) error {
	s := req.Mapped()
	if s.Tensor == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("fstat: %w", err)}
	}
	if st.Mtim.Nano() == s.MtimeNs && st.Ctim.Nano() == s.CtimeNs {
		return nil
	}
	// The header is read with a plain pread: O_DIRECT off (fd is the
	// read's own, closed after it).
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || fl&unix.O_DIRECT != 0 {
		if err == nil {
			_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_DIRECT)
		}
		if err != nil {
			return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("clear O_DIRECT: %w", err)}
		}
	}
	if err := s.CheckHeaderFd(fd); err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: err}
	}
	return nil
}

// read is ReadOpened's read, without closing fd.
func (r *Reader) read(req *backend.Request, fd int) error {
	s := req.Sample
	at := req.At
	fail := func(err error) error { return &backend.SampleError{Index: req.Index, Path: s.Path, Err: err} }
	if at < 0 || at+s.Size > int64(len(req.Buf)) {
		return fail(fmt.Errorf("samplefile: a room of %d bytes cannot hold %d bytes at %d", len(req.Buf), s.Size, at))
	}
	var buf []byte // what the read asks for
	var off int64  // from this file offset
	var lead int64 // bytes of buf before the data
	room := backend.AlignUp(at + s.Size)
	if r.direct && req.Addr()%backend.Align == 0 && s.Offset >= at && (s.Offset-at)%backend.Align == 0 && int64(len(req.Buf)) >= room {
		buf, off, lead = req.Buf[:room], s.Offset-at, at
	} else {
		if r.direct {
			fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
			if err == nil {
				_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_DIRECT)
			}
			if err != nil {
				return fail(fmt.Errorf("clear O_DIRECT: %w", err))
			}
		}
		buf, off = req.Buf[at:], s.Offset
	}
	n, err := PreadUpTo(fd, buf, off)
	if ft, ok := faults.Inject(faults.FileRead, s.Path); ok {
		n, err = ft.Apply(n, err, 1)
	}
	if err != nil {
		return fail(fmt.Errorf("read: %w", err))
	}
	got := int64(n) - lead
	if got == s.Size && int64(len(buf)) > lead+s.Size {
		return nil // the file ended where the map says
	}
	if req.Whole != nil && got >= s.Size {
		return nil // a part, all read (whether its file changed: CheckTensor)
	}
	// The read was cut to the room, or did not give the map's size:
	// the file's own size says.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("fstat: %w", err))
	}
	if want := req.Mapped().FileSize(); st.Size != want || got != s.Size {
		if st.Size == want { // the file is as mapped and the read came short
			return fail(fmt.Errorf("%w: read %d of the %d data bytes at offset %d", backend.ErrShortRead, max(got, 0), s.Size, s.Offset))
		}
		return fail(fmt.Errorf("%w: the file is %d bytes now, the map says %d (map the dataset again)", backend.ErrShortRead, st.Size, want))
	}
	return nil
}

func openRetry(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}
