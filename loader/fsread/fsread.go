// Package fsread is the file backend: it reads samples through the
// filesystem with parallel pread, optionally with O_DIRECT. Its Reader is
// also how raw backends read the samples the map marks filesystem-only,
// and OpenSample how every backend opens a sample's file.
//
// Every open is bound to the file that was mapped: the descriptor's
// device and inode must be the map's, or the sample fails (a path that
// now names another file never yields that file's bytes). With a caller's
// credentials (backend.Env.Cred) every open is made as the caller, by
// absolute path, so the kernel checks the caller's access to the file and
// to every directory on its resolved path, symlinks included, at each
// read.
package fsread

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/internal/cred"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// Name is the file backend's registered name.
const Name = "file"

// ErrReplaced is wrapped by a sample's error when its path now names
// another file than the one mapped.
var ErrReplaced = errors.New("the path names another file than the one mapped")

// Spec describes the file backend.
func Spec() backend.Spec {
	return backend.Spec{
		Name: Name,
		Doc:  "reads each sample through the filesystem with parallel pread (optionally O_DIRECT)",
		Options: []backend.Option{
			{Name: "workers", Kind: backend.Int, Default: int64(16), Min: 1, Max: 1024, Doc: "reads in flight (pread goroutines)"},
			{Name: "direct", Kind: backend.Bool, Default: false, Doc: "open files with O_DIRECT, bypassing the page cache"},
		},
		Open: func(m *bmap.Map, p backend.Params, env backend.Env) (backend.Backend, error) {
			return New(m, int(p.Int("workers")), p.Bool("direct"), env)
		},
	}
}

// Backend reads samples through the filesystem with a pool of workers.
type Backend struct {
	r      *Reader
	pool   *backend.Pool
	caller *cred.Opener // opens as the caller (Env.Cred); nil: the workers open as the process
	guard  *fresh.Guard // with caller: which samples' paths are unchanged since the caller's check
	rootFd int          // with guard: the dataset root, for opens beneath it
}

// callerThreads is how many threads open a batch's files as the caller.
const callerThreads = 4

// New starts workers goroutines reading m's samples. With env.Cred a
// sample is read as that user would read it: opened as that user (shared
// among a few threads switched to its credentials, one hand-off each per
// batch: a switched thread is locked to its goroutine), or, where the
// freshness guard env.Guard says nothing on the sample's path below the
// root changed since the watch began (the user's access was checked
// after that, at session open), opened by the workers beneath the root
// without following any symlink and bound to the mapped file with its
// change time (a chmod changes it). The second way costs what a read as
// the process costs; the first cost 22 % of a warm epoch, measured.
func New(m *bmap.Map, workers int, direct bool, env backend.Env) (*Backend, error) {
	r, err := NewReader(m, direct, env.Faults)
	if err != nil {
		return nil, err
	}
	b := &Backend{r: r, rootFd: -1}
	if c := env.Cred; c != nil {
		if b.caller, err = cred.NewOpener(*c, min(callerThreads, workers)); err != nil {
			return nil, fmt.Errorf("fsread: reading as %v: %w", *c, err)
		}
		if g := env.Guard; g != nil && g.Method() == fresh.Watch {
			if b.rootFd, err = unix.Open(m.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
				b.caller.Close()
				return nil, fmt.Errorf("fsread: dataset root: %w", err)
			}
			b.guard = g
		}
	}
	b.pool = backend.NewPool(workers, func(_ int, req *backend.Request) error { return r.Read(req, nil) })
	return b, nil
}

// Name returns "file".
func (b *Backend) Name() string { return Name }

// Stats returns the samples read and failed.
func (b *Backend) Stats() backend.Stats {
	n, errs := b.pool.Counts()
	return backend.Stats{Samples: n, FSOnlySamples: n, Errors: errs}
}

// ReadBatch reads the requests with the worker pool; see backend.Backend.
func (b *Backend) ReadBatch(ctx context.Context, reqs []backend.Request) error {
	if b.caller == nil {
		return b.pool.ReadBatch(ctx, reqs)
	}
	// Beneath the root where the path is unchanged, as the caller elsewhere.
	beneath := make([]bool, len(reqs))
	if b.guard != nil {
		b.guard.Poll()
		for i := range reqs {
			beneath[i] = b.guard.PathUnchanged(reqs[i].Index)
		}
	}
	err := b.readAsCaller(ctx, reqs, beneath)
	if b.guard == nil {
		return err
	}
	// A change seen only now (after the opens) may have come before one of
	// them: those samples are read again, as the caller.
	b.guard.Poll()
	var again []int
	for i := range reqs {
		if beneath[i] && (errors.Is(reqs[i].Err, errNotBeneath) || !b.guard.PathUnchanged(reqs[i].Index)) {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return err
	}
	sub := make([]backend.Request, len(again))
	for j, i := range again {
		sub[j] = reqs[i]
	}
	b.readAsCaller(ctx, sub, make([]bool, len(sub)))
	err = nil
	for j, i := range again {
		reqs[i].Err = sub[j].Err
	}
	for i := range reqs {
		if err == nil && reqs[i].Err != nil {
			err = reqs[i].Err
		}
	}
	if err == nil {
		err = ctx.Err()
	}
	return err
}

// errNotBeneath marks a sample that could not be opened beneath the root
// as the mapped, unchanged file: it is read as the caller instead.
var errNotBeneath = errors.New("fsread: not opened beneath the root")

// readAsCaller reads reqs: those marked beneath opened by the workers
// beneath the root (errNotBeneath where that fails), the others opened as
// the caller first, a few threads' hand-off for the whole batch.
func (b *Backend) readAsCaller(ctx context.Context, reqs []backend.Request, beneath []bool) error {
	var paths []string
	var at []int // paths[k] is reqs[at[k]]'s
	for i := range reqs {
		if !beneath[i] {
			paths = append(paths, b.r.path(reqs[i].Sample))
			at = append(at, i)
		}
	}
	fds, errs := make([]int, len(reqs)), make([]error, len(reqs))
	for i := range fds {
		fds[i] = -1
	}
	if len(paths) > 0 {
		f, e := b.caller.OpenatAll(unix.AT_FDCWD, paths, b.r.flags())
		for k, i := range at {
			fds[i], errs[i] = f[k], e[k]
		}
	}
	err := b.pool.ReadBatchFunc(ctx, reqs, func(pos int, req *backend.Request) error {
		if beneath[pos] {
			fd, err := b.openBeneath(req.Index, req.Sample)
			if err != nil {
				return errNotBeneath
			}
			return b.r.read(req, fd)
		}
		fd := fds[pos]
		fds[pos] = -1 // this worker's to close
		if errs[pos] != nil {
			return &backend.SampleError{Index: req.Index, Path: req.Sample.Path, Err: fmt.Errorf("open: %w", errs[pos])}
		}
		return b.r.ReadFd(req, fd)
	})
	for _, fd := range fds { // requests a cancelled batch never read
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	return err
}

// openBeneath opens sample i beneath the dataset root as the process,
// following no symlink (one could lead through a directory the watch does
// not cover), and checks it is the mapped file, unchanged (SameFile).
func (b *Backend) openBeneath(i int, s *bmap.Sample) (int, error) {
	how := unix.OpenHow{Flags: uint64(b.r.flags()), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	var fd int
	var err error
	for {
		if fd, err = unix.Openat2(b.rootFd, s.Path, &how); err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return -1, err
	}
	if err := b.guard.SameFile(i, fd); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Close stops the workers. No ReadBatch may be running.
func (b *Backend) Close() error {
	b.pool.Close()
	if b.caller != nil {
		b.caller.Close()
	}
	if b.rootFd >= 0 {
		unix.Close(b.rootFd)
	}
	return nil
}

// Opener opens a path with flags (O_CLOEXEC included) and returns the
// descriptor: cred.Opener.Openat as a caller, or nil for the calling
// thread's own credentials.
type Opener func(path string, flags int) (int, error)

// AsCaller returns the Opener of o, or nil (the calling thread's own
// credentials) for a nil o.
func AsCaller(o *cred.Opener) Opener {
	if o == nil {
		return nil
	}
	return func(path string, flags int) (int, error) { return o.Openat(unix.AT_FDCWD, path, flags) }
}

// Reader reads samples of one map through the filesystem.
type Reader struct {
	root   string
	dev    uint64 // the root's filesystem
	direct bool
	faults *backend.Faults
}

// NewReader makes a Reader of m's samples, with O_DIRECT when direct.
func NewReader(m *bmap.Map, direct bool, faults *backend.Faults) (*Reader, error) {
	var st unix.Stat_t
	if err := unix.Stat(m.Root, &st); err != nil {
		return nil, fmt.Errorf("fsread: dataset root: %w", err)
	}
	return &Reader{root: m.Root, dev: st.Dev, direct: direct, faults: faults}, nil
}

// path returns s's absolute path.
func (r *Reader) path(s *bmap.Sample) string { return filepath.Join(r.root, s.Path) }

// flags returns the flags every sample is opened with.
func (r *Reader) flags() int {
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
	path := r.path(s)
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

// Read reads req's sample into req.Buf[:Size], with O_DIRECT when the
// Reader's direct is set (reading whole aligned blocks into req.Buf,
// which has room for them). The file is opened with OpenSample through
// open. It fails with a *backend.SampleError: wrapping ErrReplaced when
// the path names another file, backend.ErrShortRead when the file's
// length differs from the map's.
func (r *Reader) Read(req *backend.Request, open Opener) error {
	fd, err := r.OpenSample(req.Sample, r.flags(), open)
	if err != nil {
		return &backend.SampleError{Index: req.Index, Path: req.Sample.Path, Err: err}
	}
	return r.read(req, fd)
}

// ReadFd is Read of a file already opened (with the Reader's flags) by
// whoever had to open it: it checks that fd is the mapped file, reads,
// and closes fd.
func (r *Reader) ReadFd(req *backend.Request, fd int) error {
	if err := r.bind(fd, req.Sample); err != nil {
		unix.Close(fd)
		return &backend.SampleError{Index: req.Index, Path: req.Sample.Path, Err: err}
	}
	return r.read(req, fd)
}

// read reads req's sample from fd, the mapped file, and closes it.
func (r *Reader) read(req *backend.Request, fd int) error {
	s := req.Sample
	defer unix.Close(fd)
	// Ask for the whole aligned length: O_DIRECT needs it, and a file that
	// grew shows up as a longer read at no extra cost.
	want := int(s.Size)
	n, err := backend.PreadUpTo(fd, req.Buf[:backend.AlignUp(s.Size)], 0)
	if ft, ok := r.faults.Inject(backend.FileRead, s.Path); ok {
		n, err = ft.Apply(n, err, 1)
	}
	if err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("read: %w", err)}
	}
	if n != want {
		// The read asks for the aligned length: say the file's own size.
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil {
			return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("%w: the file is %d bytes now, the map says %d (map the dataset again)", backend.ErrShortRead, st.Size, want)}
		}
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("%w: read %d bytes, map says %d", backend.ErrShortRead, n, want)}
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

var _ backend.Backend = (*Backend)(nil)
