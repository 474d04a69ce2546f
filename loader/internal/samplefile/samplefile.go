// SPDX-License-Identifier: Apache-2.0

// Package samplefile opens and reads a sample's file for every built-in backend.
//
// Every open is bound to the mapped file: another device or inode fails the sample.
// With a caller's Opener every open is made as the caller, by absolute path.
// So the kernel checks the caller's access at each read.
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

// Opener opens a path with flags as a caller; nil means this thread's own credentials.
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

// OpenSample opens s's file by absolute path through open and checks it is the mapped file.
// The error names the path; another file wraps ErrReplaced.
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

// OpenBlocking is OpenSample for a library that refuses O_NONBLOCK, such as cuFile.
// It opens with O_NONBLOCK and clears it only once the descriptor is the mapped regular file.
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

// Read reads req's sample into req.Buf[At:At+Size], opening the file with OpenSample.
// It fails with a *backend.SampleError wrapping ErrReplaced or backend.ErrShortRead.
func (r *Reader) Read(req *backend.Request, open Opener) error {
	fd, err := r.OpenSample(req.Sample, r.Flags(), open)
	if err != nil {
		return &backend.SampleError{Index: req.Index, Path: req.Sample.Path, Err: err}
	}
	return r.ReadOpened(req, fd)
}

// ReadFd is Read of a file already opened: it checks fd, reads, and closes fd.
func (r *Reader) ReadFd(req *backend.Request, fd int) error {
	if err := r.bind(fd, req.Sample); err != nil {
		unix.Close(fd)
		return &backend.SampleError{Index: req.Index, Path: req.Sample.Path, Err: err}
	}
	return r.ReadOpened(req, fd)
}

// ReadOpened reads req's sample from fd, already checked to be the mapped file, and closes fd.
//
// With direct, whole blocks are read O_DIRECT where Buf and Offset-At are aligned.
// Elsewhere O_DIRECT is cleared and the bytes are read with a plain pread.
// Spare room after the data is read too, so a file that grew shows up as a longer read.
//
// A tensor file whose times moved has its header parsed again.
// A header no longer the map's fails the sample with bmap.ErrStale.
func (r *Reader) ReadOpened(req *backend.Request, fd int) error {
	defer unix.Close(fd)
	if err := r.read(req, fd); err != nil {
		return err
	}
	return CheckTensor(req, fd)
}

// CheckTensor checks after its read that tensor sample req's file is unchanged since mapping.
// A changed file passes only if its header still says what the map does; else bmap.ErrStale.
// A sample without a tensor passes at no cost.
//
// A tar member is checked by its tar's modification time alone: a modified tar fails its members.
// A chmod or chown moves only the ctime and leaves them served.
func CheckTensor(req *backend.Request, fd int) error {
	s := req.Mapped()
	if s.Tensor == nil && req.Whole == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("fstat: %w", err)}
	}
	if st.Mtim.Nano() == s.MtimeNs && (st.Ctim.Nano() == s.CtimeNs || s.Tensor == nil) {
		return nil
	}
	if s.Tensor == nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("%w: the file was modified since mapping (the bytes [%d,+%d) of it may be others'): map the dataset again",
			bmap.ErrStale, req.Sample.Offset, req.Sample.Size)}
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
