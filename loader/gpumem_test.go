// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
	"github.com/nvfeed/nvfeed/loader/internal/cufile"
)

// unwritten is what the double's device memory holds before anything is
// published to it: a byte no test file is made of alone.
const unwritten = 0xA5

// gpuMemory is the loader tests' double of GPU batch memory: "device
// memory" is an anonymous host mapping the test reads back (filled with
// unwritten), and for a backend that writes host memory there is a
// staging area of the same shape that Publish copies over, as batchmem's
// GPU memory does.
type gpuMemory struct {
	desc      batchmem.Desc
	dev       []byte
	staging   []byte // nil when the backend writes device memory
	publishes atomic.Int64
	dense     atomic.Int64 // of them dense
}

// gpuDouble returns an Options.openMemory that makes GPU memory the
// double (kept in *out for the test) and any other kind as batchmem does.
func gpuDouble(out **gpuMemory) func(batchmem.Kind, int, int64, batchmem.Options) (batchmem.Memory, error) {
	return func(kind batchmem.Kind, slots int, slotSize int64, o batchmem.Options) (batchmem.Memory, error) {
		if kind != batchmem.GPU {
			return batchmem.Open(kind, slots, slotSize, o)
		}
		slotSize = backend.AlignUp(slotSize)
		size := int(int64(slots) * slotSize)
		m := &gpuMemory{desc: batchmem.Desc{Kind: batchmem.GPU, Size: int64(size), SlotSize: slotSize, Slots: slots, Device: o.Device, NUMANode: -1}}
		var err error
		if m.dev, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
			return nil, err
		}
		for i := range m.dev {
			m.dev[i] = unwritten
		}
		if !o.DeviceWrites {
			if m.staging, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
				unix.Munmap(m.dev)
				return nil, err
			}
		}
		*out = m
		return m, nil
	}
}

func (m *gpuMemory) Desc() batchmem.Desc { return m.desc }

func (m *gpuMemory) Slot(i int) batchmem.Region {
	off := int64(i) * m.desc.SlotSize
	r := batchmem.Region{Dev: addrOf(m.dev) + uintptr(off)}
	if m.staging != nil {
		r.Host = m.staging[off : off+m.desc.SlotSize : off+m.desc.SlotSize]
	}
	return r
}

// Publish does what batchmem's GPU memory does for p on its device, with
// host copies: a ragged batch's staging bytes copied as they lie; a dense
// one's staging rows zeroed, repeated and packed to i·Row; on memory a
// backend wrote itself, the dense rows zeroed and repeated there.
func (m *gpuMemory) Publish(ctx context.Context, i int, p batchmem.Placement) error {
	m.publishes.Add(1)
	if err := ctx.Err(); err != nil {
		return err
	}
	if i < 0 || i >= m.desc.Slots || (p.Dense() && !m.desc.PacksAt(p.Rows, p.Row, p.Lead)) || p.Used > m.desc.SlotSize {
		return fmt.Errorf("slot %d: placement %+v does not fit", i, p)
	}
	if p.Dense() {
		m.dense.Add(1)
	}
	off := int64(i) * m.desc.SlotSize
	dev := m.dev[off : off+m.desc.SlotSize]
	switch {
	case !p.Dense() && m.staging != nil:
		copy(dev[:p.Used], m.staging[off:off+p.Used])
	case m.staging != nil:
		h := m.staging[off : off+m.desc.SlotSize]
		row := func(j int) []byte { return h[p.HostOffset(j)+p.Lead : p.HostOffset(j)+p.Lead+p.Row] }
		for _, z := range p.Zero {
			clear(row(z))
		}
		for _, r := range p.Repeats {
			copy(row(r.Row), row(r.Of))
		}
		for j := range p.Rows {
			copy(dev[p.DevOffset(j):], row(j))
		}
	case p.Dense():
		row := func(j int) []byte { return dev[p.DevOffset(j) : p.DevOffset(j)+p.Row] }
		for _, z := range p.Zero {
			clear(row(z))
		}
		for _, r := range p.Repeats {
			copy(row(r.Row), row(r.Of))
		}
	}
	return nil
}

func (m *gpuMemory) Export() (*os.File, error) {
	return nil, fmt.Errorf("the test double exports nothing")
}
func (m *gpuMemory) Pinned() error { return nil }
func (m *gpuMemory) Close() error {
	if m.staging != nil {
		unix.Munmap(m.staging)
	}
	return unix.Munmap(m.dev)
}

// addrOf is the address of b's first byte.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// checkDevice compares every sample of b that did not fail, as the
// device holds it (dev: the whole memory as the client maps it), with its
// file.
func checkDevice(t *testing.T, what string, m *bmap.Map, dev []byte, b *Batch) {
	t.Helper()
	failed := map[int]bool{}
	for _, i := range b.Failed {
		failed[i] = true
	}
	for i := 0; i < b.Len(); i++ {
		if failed[i] {
			continue
		}
		s := &m.Samples[b.Indices[i]]
		want, err := os.ReadFile(filepath.Join(m.Root, s.Path))
		if err != nil {
			t.Fatal(err)
		}
		if got := dev[b.Offsets[i] : b.Offsets[i]+b.Lengths[i]]; !bytes.Equal(got, want) {
			t.Fatalf("%s: epoch %d batch %d position %d: sample %s on the device (%d bytes at offset %d) differs from its file (%d bytes)%s",
				what, b.Epoch, b.Iteration, i, s.Path, len(got), b.Offsets[i], len(want), firstDiff(got, want))
		}
	}
}

// firstDiff says where got first differs from want.
func firstDiff(got, want []byte) string {
	for j := range min(len(got), len(want)) {
		if got[j] != want[j] {
			return fmt.Sprintf(": byte %d is %#x, want %#x", j, got[j], want[j])
		}
	}
	return ""
}

// uniformDataset writes n files of size bytes each (random bytes, one
// file's differing from another's) in DALI layout and maps them.
func uniformDataset(t testing.TB, n, classes int, size int) *bmap.Map {
	t.Helper()
	root := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(n), uint64(size)))
	for i := range n {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		dir := filepath.Join(root, fmt.Sprintf("c%03d", i%classes))
		os.MkdirAll(dir, 0o755)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.jpg", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return testfs.MapDir(t, root)
}

// devBackend stands in for the cufile backend on the GPU memory double
// (its Spec says DeviceWrites and it is named cufile): it writes each
// sample's file to Request.Dev, Request.DevBytes of it as cuFileRead
// does, and records each write's size; a read the installed faults fail
// has written its bytes first, as a failed cuFileRead may have.
type devBackend struct {
	m     *bmap.Map
	mem   *gpuMemory
	mu    sync.Mutex
	sizes map[int64]int
}

func (b *devBackend) Name() string { return cufile.Name }

func (b *devBackend) ReadBatch(ctx context.Context, reqs []backend.Request) error {
	var first error
	for i := range reqs {
		r := &reqs[i]
		data, err := os.ReadFile(filepath.Join(b.m.Root, r.Sample.Path))
		if err != nil {
			return err
		}
		n := r.DevBytes()
		off := int64(r.Dev) - int64(addrOf(b.mem.dev))
		if off < 0 || off+n > int64(len(b.mem.dev)) {
			return fmt.Errorf("a write of %d bytes at %#x: outside the device memory", n, r.Dev)
		}
		copy(b.mem.dev[off:off+n], data[min(r.Sample.Offset, int64(len(data))):])
		b.mu.Lock()
		b.sizes[n]++
		b.mu.Unlock()
		if ft, ok := faults.Inject(faults.FileRead, r.Sample.Path); ok && ft.Err != nil {
			r.Err = &backend.SampleError{Index: r.Index, Path: r.Sample.Path, Err: ft.Err}
			if first == nil {
				first = r.Err
			}
		}
	}
	if first != nil {
		return first
	}
	return ctx.Err()
}

func (b *devBackend) Stats() backend.Stats { return backend.Stats{} }
func (b *devBackend) Close() error         { return nil }

// devSpec describes devBackend, writing the double *mem, which the
// loader opens before the backend.
func devSpec(mem **gpuMemory, b *devBackend) *backend.Spec {
	return &backend.Spec{Name: cufile.Name, Doc: "the cufile backend's stand-in (a test)", DeviceWrites: true,
		Open: func(m *bmap.Map, _ backend.Params, _ backend.Env) (backend.Backend, error) {
			b.m, b.mem = m, *mem
			return b, nil
		}}
}

// TestGPUBatches reads two epochs into the GPU memory double on both GPU
// paths — bounce (the file backend, O_DIRECT, into 4 KiB-aligned staging
// rooms) and cufile (devBackend writing the device) — and checks every
// batch as the device holds it: a batch whose samples all have one size
// is dense (Batch.Dense, offsets i·S from the slot, device writes of
// exactly S bytes), any other ragged (aligned offsets, aligned writes); every sample that did not fail equals its file (padding rows
// included); a failed sample (SkipErrors, an injected EIO) is delivered
// with length 0, the batch's other samples published with it, and in a
// dense batch its row reads zeros, never an older batch's bytes. On the
// GPU memory double; TestGPUBatchesStandin runs it on real GPU memory.
func TestGPUBatches(t *testing.T) { testGPUBatches(t, false) }

// TestGPUBatchesStandin runs TestGPUBatches's cases on GPU memory as a
// real GPU makes it (batchmem's cudaDevice) and with the real cufile
// backend, over the strict CUDA stand-in, in a child process whose device
// memory is read back through its exported descriptor and whose report
// must show no broken rule and nothing left once the loaders closed.
func TestGPUBatchesStandin(t *testing.T) {
	if os.Getenv(standinChild) == "" {
		dir, reports := standin.Build(t), t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestGPUBatchesStandin$", "-test.v", "-test.count=1")
		cmd.Env = standin.Env(dir, reports, standinChild+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestGPUBatchesStandin") {
			t.Fatalf("the child on the stand-in: %v\n%s", err, out)
		}
		standin.CheckClean(t, reports)
		return
	}
	testGPUBatches(t, true)
}

// standinChild marks the child process TestGPUBatchesStandin runs itself
// in.
const standinChild = "NVFEED_LOADER_STANDIN_CHILD"

// testGPUBatches is TestGPUBatches on the double or, onStandin, on the
// memory batchmem makes and the backends the options name.
func testGPUBatches(t *testing.T, onStandin bool) {
	mixed := makeDataset(t, 40, 3, 6000)
	uniform := uniformDataset(t, 37, 3, 5000)
	blocks := uniformDataset(t, 21, 2, 8192)
	shuffled := ReaderArgs{BatchSize: 8, RandomShuffle: true, Seed: 3}
	padded := ReaderArgs{BatchSize: 8, NumShards: 2, ShardID: 1, PadLastBatch: true} // shard 1 of 37: 18..36, 36 five times more
	tests := []struct {
		name  string
		m     *bmap.Map
		path  string
		args  ReaderArgs
		fail  int   // the sample whose reads fail, -1 none
		dense int64 // every batch's Dense()
	}{
		{"ragged bounce", mixed, GPUPathBounce, shuffled, -1, 0},
		{"ragged bounce, a failed sample", mixed, GPUPathBounce, shuffled, 9, 0},
		{"ragged cufile, a failed sample", mixed, GPUPathCuFile, shuffled, 9, 0},
		{"dense bounce", uniform, GPUPathBounce, shuffled, -1, 5000},
		{"dense bounce, a failed sample", uniform, GPUPathBounce, shuffled, 5, 5000},
		{"dense bounce padded, the padding sample failed", uniform, GPUPathBounce, padded, 36, 5000},
		{"dense bounce padded", uniform, GPUPathBounce, padded, -1, 5000},
		{"dense cufile", uniform, GPUPathCuFile, shuffled, -1, 5000},
		{"dense cufile, a failed sample", uniform, GPUPathCuFile, shuffled, 5, 5000},
		{"dense cufile padded", uniform, GPUPathCuFile, padded, -1, 5000},
		{"dense cufile padded, the padding sample failed", uniform, GPUPathCuFile, padded, 36, 5000},
		{"dense bounce, whole blocks", blocks, GPUPathBounce, shuffled, 4, 8192},
		{"dense cufile, whole blocks", blocks, GPUPathCuFile, shuffled, 4, 8192},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.m
			if tt.fail >= 0 {
				inject(t, (&faults.Faults{}).Add(faults.Rule{Op: faults.FileRead, Path: m.Samples[tt.fail].Path, Err: unix.EIO}))
			}
			var mem *gpuMemory
			r := &devBackend{sizes: map[int64]int{}}
			o := Options{ReaderArgs: tt.args, Memory: batchmem.GPU, GPUPath: tt.path, SkipErrors: true}
			if tt.path == GPUPathBounce {
				o.Backend, o.BackendOptions = "file", map[string]any{"direct": true}
			} else {
				o.Spec = devSpec(&mem, r)
			}
			o.openMemory = gpuDouble(&mem)
			if onStandin {
				o.Spec, o.openMemory = nil, nil
				standin.ProvideCuFileHost(t, false, m.Root)
			}
			l, err := New(context.Background(), m, o)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := l.Close(); err != nil {
					t.Error(err)
				}
			}()
			if path, why := l.GPUPath(); path != tt.path {
				t.Fatalf("GPU path %s (%s), want %s", path, why, tt.path)
			}
			var dev []byte
			if onStandin {
				dev = exported(t, l.Memory())
			} else {
				dev = mem.dev
			}
			slotSize := l.Memory().Desc().SlotSize
			var failed, repeats int
			for e := range 2 {
				errs := eachBatch(l, func(b *Batch) {
					what := fmt.Sprintf("epoch %d batch %d", b.Epoch, b.Iteration)
					checkDevice(t, what, m, dev, b)
					if b.Dense() != tt.dense {
						t.Fatalf("%s: Dense() = %d, want %d", what, b.Dense(), tt.dense)
					}
					base := int64(b.Slot) * slotSize
					for i := range b.Len() {
						isFailed := slices.Contains(b.Failed, i)
						if isFailed != (int(b.Indices[i]) == tt.fail) || (isFailed && b.Lengths[i] != 0) {
							t.Fatalf("%s: position %d (sample %d): failed %v, length %d", what, i, b.Indices[i], isFailed, b.Lengths[i])
						}
						if i > 0 && b.Indices[i] == b.Indices[i-1] {
							repeats++
						}
						switch {
						case tt.dense > 0 && b.Offsets[i] != base+int64(i)*tt.dense:
							t.Fatalf("%s: dense offset %d of position %d, want %d", what, b.Offsets[i]-base, i, int64(i)*tt.dense)
						case tt.dense == 0 && (b.Offsets[i]%backend.Align != 0 || b.Offsets[i] < base || b.Offsets[i]+b.Lengths[i] > base+slotSize):
							t.Fatalf("%s: ragged offset %d of position %d", what, b.Offsets[i]-base, i)
						}
						if tt.dense > 0 && isFailed {
							failed++
							if row := dev[b.Offsets[i] : b.Offsets[i]+tt.dense]; indexNot(row, 0) >= 0 {
								t.Fatalf("%s: failed position %d's dense row holds %#x at %d, want zeros", what, i, row[indexNot(row, 0)], indexNot(row, 0))
							}
						} else if isFailed {
							failed++
						}
					}
				})
				if len(errs) != 0 {
					t.Fatalf("epoch %d: %v", e, errs)
				}
			}
			if (failed > 0) != (tt.fail >= 0) || (repeats > 0) != (tt.args.PadLastBatch) {
				t.Errorf("%d failed positions, %d repeated ones delivered", failed, repeats)
			}
			if onStandin {
				return
			}
			if tt.path == GPUPathCuFile {
				want := tt.dense // 0: aligned sizes, each its own
				r.mu.Lock()
				for size := range r.sizes {
					if (want > 0 && size != want) || (want == 0 && size%backend.Align != 0) {
						t.Errorf("a device write of %d bytes, want %d", size, want)
					}
				}
				r.mu.Unlock()
			}
			if tt.dense > 0 && mem.dense.Load() == 0 {
				t.Errorf("no dense publish")
			}
		})
	}
}

// indexNot returns the index of the first byte of b that is not c, -1
// when there is none.
func indexNot(b []byte, c byte) int {
	for i, x := range b {
		if x != c {
			return i
		}
	}
	return -1
}

// exported maps the whole of mem read-only through a descriptor it
// exports, as a client does (the stand-in's device memory is a memfd),
// until the test ends.
func exported(t *testing.T, mem batchmem.Memory) []byte {
	f, err := mem.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	view, err := unix.Mmap(int(f.Fd()), 0, int(mem.Desc().Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mapping the exported memory: %v", err)
	}
	t.Cleanup(func() { unix.Munmap(view) })
	return view
}

// TestDriverReachesBackends: a backend that writes the device gets the
// host's CUDA libraries as a typed backend.Driver (Env.GPU.Driver), as a
// third-party backend would, and may ask it which files to load.
func TestDriverReachesBackends(t *testing.T) {
	m := uniformDataset(t, 8, 2, 4096)
	libs := cuda.NewLibs(cuda.SearchFromEnv(), slog.New(slog.DiscardHandler))
	var mem *gpuMemory
	var got backend.Driver
	s := devSpec(&mem, &devBackend{sizes: map[int64]int{}})
	open := s.Open
	s.Open = func(m *bmap.Map, p backend.Params, env backend.Env) (backend.Backend, error) {
		got = env.GPU.Driver
		return open(m, p, env)
	}
	o := Options{ReaderArgs: ReaderArgs{BatchSize: 4}, Memory: batchmem.GPU, GPUPath: GPUPathCuFile, Spec: s, CUDA: libs, openMemory: gpuDouble(&mem)}
	l, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got != backend.Driver(libs) {
		t.Fatalf("Env.GPU.Driver = %v, want the options' CUDA libraries", got)
	}
	if path, err := got.Library("cudart"); err == nil && path == "" {
		t.Error(`Library("cudart") gave no file and no error`)
	}
	if _, err := got.Library("nvcuda"); err == nil {
		t.Error(`Library("nvcuda"): no error for a library CUDA does not have`)
	}
}
