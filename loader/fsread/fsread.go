// Package fsread is the file backend: it reads samples through the
// filesystem with parallel pread, optionally with O_DIRECT. Its ReadFile
// is also how raw backends read the samples the map marks
// filesystem-only.
package fsread

import (
	"context"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// Name is the file backend's registered name.
const Name = "file"

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
			return New(m.Root, int(p.Int("workers")), p.Bool("direct"), env.Faults), nil
		},
	}
}

// Backend reads samples through the filesystem with a pool of workers.
type Backend struct {
	pool *backend.Pool
}

// New starts workers goroutines reading files under root.
func New(root string, workers int, direct bool, faults *backend.Faults) *Backend {
	return &Backend{pool: backend.NewPool(workers, func(_ int, r *backend.Request) error {
		return ReadFile(root, r, direct, faults)
	})}
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

// ReadFile reads req's sample through the filesystem under root into
// req.Buf[:Size], with O_DIRECT when direct is set (reading whole aligned
// blocks into req.Buf, which has room for them). It fails with a
// *backend.SampleError: wrapping backend.ErrShortRead when the file's
// length differs from the map's.
func ReadFile(root string, req *backend.Request, direct bool, faults *backend.Faults) error {
	s := req.Sample
	flags := unix.O_RDONLY | unix.O_CLOEXEC
	if direct {
		flags |= unix.O_DIRECT
	}
	fd, err := openRetry(filepath.Join(root, s.Path), flags)
	if err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("open: %w", err)}
	}
	defer unix.Close(fd)
	// Ask for the whole aligned length: O_DIRECT needs it, and a file that
	// grew shows up as a longer read at no extra cost.
	want := int(s.Size)
	n, err := backend.PreadUpTo(fd, req.Buf[:backend.AlignUp(s.Size)], 0)
	if ft, ok := faults.Inject(backend.FileRead, s.Path); ok {
		n, err = ft.Apply(n, err, 1)
	}
	if err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("read: %w", err)}
	}
	if n != want {
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
