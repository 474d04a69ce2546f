package loader

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// FileBackend reads samples through the filesystem with parallel pread,
// optionally with O_DIRECT (bypassing the page cache).
type FileBackend struct {
	root    string
	direct  bool
	workers int
	jobs    chan fileJob
	wg      sync.WaitGroup
}

type fileJob struct {
	ctx  context.Context
	req  *Request
	wait *batchWait
}

// NewFileBackend starts workers goroutines reading files under root.
func NewFileBackend(root string, workers int, direct bool) *FileBackend {
	if workers <= 0 {
		workers = 16
	}
	b := &FileBackend{root: root, direct: direct, workers: workers, jobs: make(chan fileJob, 4*workers)}
	for i := 0; i < workers; i++ {
		b.wg.Add(1)
		go b.worker()
	}
	return b
}

// Name returns "file".
func (b *FileBackend) Name() string { return "file" }

// Info reports the worker count and whether O_DIRECT is used.
func (b *FileBackend) Info() map[string]any {
	return map[string]any{"workers": b.workers, "direct": b.direct}
}

// ReadBatch reads the requests with the worker pool.
func (b *FileBackend) ReadBatch(ctx context.Context, reqs []Request) error {
	w := &batchWait{}
	w.wg.Add(len(reqs))
	for i := range reqs {
		b.jobs <- fileJob{ctx: ctx, req: &reqs[i], wait: w}
	}
	w.wg.Wait()
	return w.err
}

func (b *FileBackend) worker() {
	defer b.wg.Done()
	for j := range b.jobs {
		err := j.ctx.Err()
		if err == nil {
			err = ReadFile(b.root, j.req, b.direct)
		}
		if j.req.Err = err; err != nil {
			j.wait.fail(err)
		}
		j.wait.wg.Done()
	}
}

// Close stops the workers. No ReadBatch may be running.
func (b *FileBackend) Close() error {
	close(b.jobs)
	b.wg.Wait()
	return nil
}

// ReadFile reads req's sample through the filesystem under root into
// req.Buf[:Size], with O_DIRECT when direct is set (reading whole aligned
// blocks into req.Buf, which has room for them). It fails with a
// *SampleError wrapping ErrShortRead when the file's length differs from
// the map's.
func ReadFile(root string, req *Request, direct bool) error {
	s := req.Sample
	flags := unix.O_RDONLY | unix.O_CLOEXEC
	if direct {
		flags |= unix.O_DIRECT
	}
	fd, err := openRetry(filepath.Join(root, s.Path), flags)
	if err != nil {
		return &SampleError{req.Index, s.Path, fmt.Errorf("open: %w", err)}
	}
	defer unix.Close(fd)
	// Ask for the whole aligned length: O_DIRECT needs it, and a file that
	// grew shows up as a longer read at no extra cost.
	want := int(s.Size)
	n, err := preadFull(fd, req.Buf[:alignUp(s.Size)], 0)
	if err != nil {
		return &SampleError{req.Index, s.Path, fmt.Errorf("read: %w", err)}
	}
	if n != want {
		return &SampleError{req.Index, s.Path, fmt.Errorf("%w: read %d bytes, map says %d", ErrShortRead, n, want)}
	}
	return nil
}

// preadFull reads into b from off until b is full or EOF.
func preadFull(fd int, b []byte, off int64) (int, error) {
	done := 0
	for done < len(b) {
		n, err := unix.Pread(fd, b[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			break
		}
		done += n
	}
	return done, nil
}

func openRetry(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

var _ Backend = (*FileBackend)(nil)
