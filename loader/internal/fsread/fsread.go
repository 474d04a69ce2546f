// SPDX-License-Identifier: Apache-2.0

// Package fsread is the file backend: parallel pread, optionally O_DIRECT.
// Each open is bound to the mapped file and made as the caller where one is given.
package fsread

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/counts"
	"github.com/nvfeed/nvfeed/loader/internal/readpool"
	"github.com/nvfeed/nvfeed/loader/internal/samplefile"
)

// Name is the file backend's registered name.
const Name = "file"

// ErrReplaced is wrapped by a sample's error when its path now names
// another file than the one mapped (samplefile.ErrReplaced).
var ErrReplaced = samplefile.ErrReplaced

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
	r      *samplefile.Reader
	pool   *readpool.Pool
	caller *backend.Caller // opens as the caller (Env.Cred); nil: the workers open as the process
	guard  backend.Guard   // with caller: which samples' paths are unchanged since the caller's check
	rootFd int             // with guard: the dataset root, for opens beneath it
}

// callerThreads is how many threads open a batch's files as the caller.
const callerThreads = 4

// New starts workers goroutines reading m's samples.
// With env.Cred a sample is opened as that user on a few switched threads.
// Where the guard says nothing on its path changed, workers open it beneath the root instead.
// That costs what a read as the process costs (docs/decisions.md#access-is-the-kernels-to-judge).
func New(m *bmap.Map, workers int, direct bool, env backend.Env) (*Backend, error) {
	r, err := samplefile.NewReader(m, direct)
	if err != nil {
		return nil, err
	}
	b := &Backend{r: r, rootFd: -1}
	if c := env.Cred; c != nil {
		if b.caller, err = backend.NewCaller(*c, min(callerThreads, workers)); err != nil {
			return nil, fmt.Errorf("fsread: reading as %v: %w", *c, err)
		}
		if g := env.Guard; g != nil && g.Method() == backend.GuardWatch {
			if b.rootFd, err = unix.Open(m.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
				b.caller.Close()
				return nil, fmt.Errorf("fsread: dataset root: %w", err)
			}
			b.guard = g
		}
	}
	b.pool = readpool.NewPool(workers, func(_ int, req *backend.Request) error { return r.Read(req, nil) })
	return b, nil
}

// Name returns "file".
func (b *Backend) Name() string { return Name }

// Stats returns the samples read and failed.
func (b *Backend) Stats() backend.Stats {
	n, errs := b.pool.Counts()
	return backend.Stats{Counters: counts.Counts{Samples: n, FSOnlySamples: n, Errors: errs}.Counters()}
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

// readAsCaller reads reqs: beneath ones opened by the workers, the rest as the caller.
func (b *Backend) readAsCaller(ctx context.Context, reqs []backend.Request, beneath []bool) error {
	var paths []string
	var at []int // paths[k] is reqs[at[k]]'s
	for i := range reqs {
		if !beneath[i] {
			paths = append(paths, b.r.Path(reqs[i].Sample))
			at = append(at, i)
		}
	}
	fds, errs := make([]int, len(reqs)), make([]error, len(reqs))
	for i := range fds {
		fds[i] = -1
	}
	if len(paths) > 0 {
		f, e := b.caller.OpenAll(paths, b.r.Flags())
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
			return b.r.ReadOpened(req, fd)
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

// openBeneath opens sample i beneath the root as the process, following no symlink.
// It checks the file is the mapped one, unchanged.
func (b *Backend) openBeneath(i int, s *bmap.Sample) (int, error) {
	how := unix.OpenHow{Flags: uint64(b.r.Flags()), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
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

var _ backend.Backend = (*Backend)(nil)
