// SPDX-License-Identifier: Apache-2.0

// Package cufile is the cufile backend: cuFileRead from each file into GPU batch memory.
// Files open O_DIRECT on ext4 or xfs; raw block devices are not supported.
// Whether cuFile runs peer to peer or in compatibility mode is measured, not guessed.
package cufile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/counts"
	"github.com/nvfeed/nvfeed/loader/internal/readpool"
	"github.com/nvfeed/nvfeed/loader/internal/samplefile"
)

// Name is the backend's registered name.
const Name = "cufile"

// ErrUnavailable is returned by Open when cuFile cannot run here.
// It is backend.ErrUnavailable too, which GPU path auto falls back on.
var ErrUnavailable error = unavailable{}

// unavailable is ErrUnavailable's type: "cuFile unavailable", matching
// backend.ErrUnavailable.
type unavailable struct{}

func (unavailable) Error() string { return "cuFile unavailable" }

// Is reports whether target is backend.ErrUnavailable.
func (unavailable) Is(target error) bool { return target == backend.ErrUnavailable }

// Spec describes the cufile backend; libs nil discovers the CUDA libraries again.
func Spec(libs *cuda.Libs) backend.Spec {
	return backend.Spec{
		Name: Name,
		Doc:  "reads each sample through its file with cuFileRead straight into GPU batch memory (memory gpu only; GPUDirect Storage where the platform has it, else cuFile's compatibility mode)",
		Options: []backend.Option{
			{Name: "workers", Kind: backend.Int, Default: int64(8), Min: 1, Max: 64, Doc: "reads in flight (each on its own thread with the GPU's context)"},
		},
		DeviceWrites: true,
		MeasuresMode: true,
		Open: func(m *bmap.Map, p backend.Params, env backend.Env) (backend.Backend, error) {
			if env.GPU == nil {
				return nil, fmt.Errorf("%w: backend %s reads into GPU memory: open the session with memory gpu", backend.ErrOptions, Name)
			}
			workers := int(p.Int("workers"))
			log := env.Logger
			if log == nil {
				log = slog.Default()
			}
			libs := libs
			if libs == nil {
				libs = cuda.NewLibs(cuda.SearchFromEnv(), log)
			}
			if err := checkDevice(libs.CuFileHost(), m); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			r, err := openCuFile(*env.GPU, workers, log, libs)
			if err != nil {
				return nil, fmt.Errorf("%w on GPU %d: %w", ErrUnavailable, env.GPU.Device, err)
			}
			b, err := New(m, workers, r, env)
			if err != nil {
				r.Close()
				return nil, err
			}
			b.probe(m, env.GPU)
			return b, nil
		},
	}
}

// checkDevice checks that m's block device has the udev record cuFile needs.
func checkDevice(h cuda.CuFileHost, m *bmap.Map) error {
	var st unix.Stat_t
	if err := unix.Stat(m.Root, &st); err != nil {
		return fmt.Errorf("cufile: dataset root: %w", err)
	}
	return h.CheckDevice(st.Dev, "the dataset's filesystem")
}

// reader is the cuFile surface the backend uses: real cuFile on the GPU's
// threads (openCuFile), a pread double in tests.
type reader interface {
	// Read reads up to size bytes at off of fd into device memory at dst, on worker's thread.
	// cuFile reads what is not aligned through its own bounce buffers.
	Read(worker, fd int, dst uintptr, size, off int64) (int64, error)
	// Stats returns what cuFile says ran for the GPU: its mode, why, and
	// the read counts. It may be called at any time, after Close too.
	Stats() modeStats
	Close() error
}

// Backend reads samples with a pool of workers, each on its own thread.
type Backend struct {
	fs     *samplefile.Reader // opens each sample's file, bound to the mapped one
	caller *backend.Caller    // opens as the caller (Env.Cred); nil: as the process
	r      reader
	pool   *readpool.Pool
}

// New starts workers reading m's samples through r. With env.Cred every
// file is opened as that user (the kernel checks it).
func New(m *bmap.Map, workers int, r reader, env backend.Env) (*Backend, error) {
	fs, err := samplefile.NewReader(m, false)
	if err != nil {
		return nil, err
	}
	b := &Backend{fs: fs, r: r}
	if env.Cred != nil {
		if b.caller, err = backend.NewCaller(*env.Cred, 2); err != nil {
			return nil, fmt.Errorf("cufile: reading as %v: %w", *env.Cred, err)
		}
	}
	b.pool = readpool.NewPool(workers, b.read)
	return b, nil
}

// Name returns "cufile".
func (b *Backend) Name() string { return Name }

// Stats returns the samples read and failed, and what cuFile says ran.
func (b *Backend) Stats() backend.Stats {
	st := b.r.Stats()
	n, errs := b.pool.Counts()
	return backend.Stats{Labels: []backend.Label{{Name: "cufile_mode", Value: st.Mode}},
		Counters: counts.Counts{Samples: n, FSOnlySamples: n, Errors: errs, CuFileP2PReads: st.P2P, CuFilePOSIXReads: st.POSIX}.Counters()}
}

// Mode says how cuFile runs for the GPU: "gds", "compat", "mixed", "none" or "unknown", and why.
func (b *Backend) Mode() (mode, why string) {
	st := b.r.Stats()
	return st.Mode, st.Why
}

// probeAttempts bounds the samples probe tries to read.
const probeAttempts = 4

// probe measures the mode at opening where the driver's properties do not settle it.
// It reads the first sample into slot 0, not yet in use, so the statistics tell.
func (b *Backend) probe(m *bmap.Map, mem *backend.GPUMemory) {
	if mode, _ := b.Mode(); mode != "none" {
		return
	}
	open := samplefile.AsCaller(b.caller)
	tried := 0
	for i := range m.Samples {
		s := &m.Samples[i]
		if tried == probeAttempts {
			return
		}
		if s.Size == 0 || backend.AlignUp(s.Size) > mem.Size {
			continue
		}
		tried++
		fd, err := b.openSample(s, open)
		if err != nil {
			continue
		}
		_, err = b.r.Read(0, fd, mem.Base, backend.AlignUp(s.Size), s.Offset)
		unix.Close(fd)
		if err == nil {
			return
		}
	}
}

// openSample opens s's file for cuFileHandleRegister: O_DIRECT where the filesystem allows.
// O_NONBLOCK, which cuFile refuses, is cleared once the descriptor is checked.
func (b *Backend) openSample(s *bmap.Sample, open samplefile.Opener) (int, error) {
	fd, err := b.fs.OpenBlocking(s, unix.O_DIRECT, open)
	if errors.Is(err, unix.EINVAL) {
		fd, err = b.fs.OpenBlocking(s, 0, open)
	}
	return fd, err
}

// ReadBatch reads the requests; see backend.Backend. Every request's
// destination is Request.Dev.
func (b *Backend) ReadBatch(ctx context.Context, reqs []backend.Request) error {
	return b.pool.ReadBatch(ctx, reqs)
}

// read reads one sample into its device destination, failing with a
// *backend.SampleError that names it (and cuFile's error).
func (b *Backend) read(worker int, req *backend.Request) error {
	s := req.Sample
	if req.Dev == 0 {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: errors.New("cufile: no device destination (batch memory is not GPU memory)")}
	}
	fd, err := b.openSample(s, samplefile.AsCaller(b.caller))
	if err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: err}
	}
	defer unix.Close(fd)
	// The sample's bytes from s.Offset to req.Dev, as backend.Request.DevBytes says.
	// A file that grew shows up as a longer read, or is found by its size.
	size := req.DevBytes()
	n, err := b.r.Read(worker, fd, req.Dev, size, s.Offset)
	if ft, ok := faults.Inject(faults.FileRead, s.Path); ok {
		var in int
		in, err = ft.Apply(int(n), err, 1)
		n = int64(in)
	}
	if err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: err}
	}
	if n == s.Size && size > s.Size {
		return samplefile.CheckTensor(req, fd) // the file ended where the map says
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("fstat: %w", err)}
	}
	if want := req.Mapped().FileSize(); st.Size != want {
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("%w: the file is %d bytes now, the map says %d (map the dataset again)", backend.ErrShortRead, st.Size, want)}
	}
	if n < s.Size || (n != s.Size && req.Whole == nil) { // a part's aligned read runs on into its file
		return &backend.SampleError{Index: req.Index, Path: s.Path, Err: fmt.Errorf("%w: read %d of the %d data bytes at offset %d, the map says %d", backend.ErrShortRead, n, s.Size, s.Offset, s.Size)}
	}
	return samplefile.CheckTensor(req, fd)
}

// Close stops the workers and releases cuFile's registrations. No
// ReadBatch may be running.
func (b *Backend) Close() error {
	b.pool.Close()
	if b.caller != nil {
		b.caller.Close()
	}
	return b.r.Close()
}

var _ backend.Backend = (*Backend)(nil)
