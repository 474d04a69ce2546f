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
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
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
	pool *backend.Pool
}

// New starts workers goroutines reading m's samples. With env.Cred, each
// worker runs on its own OS thread switched to the caller's credentials
// (the thread ends with the backend).
func New(m *bmap.Map, workers int, direct bool, env backend.Env) (*Backend, error) {
	r, err := NewReader(m, direct, env.Faults)
	if err != nil {
		return nil, err
	}
	var init func() error
	if c := env.Cred; c != nil {
		if err := c.Do(func() error { return nil }); err != nil {
			return nil, fmt.Errorf("fsread: reading as %v: %w", *c, err)
		}
		init = func() error {
			runtime.LockOSThread() // never unlocked: the thread ends with the worker
			return c.Become()
		}
	}
	return &Backend{pool: backend.NewPoolInit(workers, init, func(_ int, req *backend.Request) error {
		return r.Read(req, nil)
	})}, nil
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
	return b.pool.ReadBatch(ctx, reqs)
}

// Close stops the workers. No ReadBatch may be running.
func (b *Backend) Close() error {
	b.pool.Close()
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

// OpenSample opens s's file by its absolute path with flags, through open
// (nil: this thread's credentials), and checks that it is the file that
// was mapped: a regular file with the map's inode, on the root's
// filesystem unless the map says it lives on another. The error names
// the path; a file that is not the mapped one wraps ErrReplaced.
func (r *Reader) OpenSample(s *bmap.Sample, flags int, open Opener) (int, error) {
	path := filepath.Join(r.root, s.Path)
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
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Ino != s.Inode || (s.Reason != bmap.OtherFS && st.Dev != r.dev) {
		unix.Close(fd)
		return -1, fmt.Errorf("%w (device %d inode %d, mapped inode %d)", ErrReplaced, st.Dev, st.Ino, s.Inode)
	}
	return fd, nil
}

// Read reads req's sample into req.Buf[:Size], with O_DIRECT when the
// Reader's direct is set (reading whole aligned blocks into req.Buf,
// which has room for them). The file is opened with OpenSample through
// open. It fails with a *backend.SampleError: wrapping ErrReplaced when
// the path names another file, backend.ErrShortRead when the file's
// length differs from the map's.
func (r *Reader) Read(req *backend.Request, open Opener) error {
	s := req.Sample
	flags := 0
	if r.direct {
		flags |= unix.O_DIRECT
	}
	fd, err := r.OpenSample(s, flags, open)
	if err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: err}
	}
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
