// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
	"github.com/nvfeed/nvfeed/loader/internal/raw"
)

// tensorSpec is one .npy file of a test dataset.
type tensorSpec struct {
	name  string
	dt    npy.DType
	shape []int64
	at    int64 // where the data starts: 0 for np.save's own header, else a header padded to end there
}

// npyFile returns the file's bytes: np.save's (npy.Encode's header, byte
// for byte), or with a header padded so that the data starts at sp.at;
// random data.
func npyFile(t testing.TB, rng *rand.Rand, sp tensorSpec) []byte {
	t.Helper()
	h := npy.Header{DType: sp.dt, Shape: sp.shape}
	var b []byte
	if sp.at == 0 {
		var err error
		if b, err = npy.Encode(h); err != nil {
			t.Fatal(err)
		}
	} else {
		dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", sp.dt.Descr(), npy.FormatShape(sp.shape))
		if sp.at < int64(11+len(dict)) || sp.at-10 > 0xffff {
			t.Fatalf("%s: no header of %d bytes holds %s", sp.name, sp.at, dict)
		}
		b = make([]byte, sp.at)
		copy(b, npy.Magic+"\x01\x00")
		binary.LittleEndian.PutUint16(b[8:], uint16(sp.at-10))
		copy(b[10:], dict)
		for i := 10 + len(dict); i < len(b)-1; i++ {
			b[i] = ' '
		}
		b[len(b)-1] = '\n'
	}
	data := make([]byte, h.NBytes())
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if sp.dt == npy.Bool {
		for i := range data {
			data[i] &= 1
		}
	}
	return append(b, data...)
}

// tensorSet is a test dataset: one dtype and one number of dimensions
// (as fn.readers.numpy wants of a batch), files in name order.
type tensorSet struct {
	name  string
	files []tensorSpec
}

// tensorSets are the datasets every backend and memory reads: dense
// ones (one shape: sizes not a multiple of 4 KiB, whole blocks, 0-d
// arrays), ragged ones (shapes of every size, empty arrays, 16 KiB), and
// one of a single shape whose headers differ in length (so its samples'
// data start at different phases in their files: a batch of them is
// ragged unless they share the phase).
func tensorSets() []tensorSet {
	var sets []tensorSet
	add := func(name string, files ...tensorSpec) { sets = append(sets, tensorSet{name, files}) }
	var f []tensorSpec
	for i := range 24 {
		f = append(f, tensorSpec{fmt.Sprintf("d%02d.npy", i), npy.Float32, []int64{3, 700}, 0}) // 8400 bytes at 128
	}
	add("f32 dense", f...)
	f = nil
	for i := range 12 {
		f = append(f, tensorSpec{fmt.Sprintf("b%02d.npy", i), npy.Int16, []int64{2, 4096}, 0}) // 16 KiB at 128
	}
	add("i16 whole blocks", f...)
	f = nil
	for i := range 11 {
		f = append(f, tensorSpec{fmt.Sprintf("s%02d.npy", i), npy.Float64, nil, 0}) // 0-d: 8 bytes
	}
	f[7].at = 4096 // a block-aligned data start: phase 0
	add("f64 0-d", f...)
	shapes := [][]int64{{1, 1}, {0, 5}, {64, 64}, {100, 33}, {3, 0}, {5, 7}, {5, 7}, {5, 7}, {5, 7}, {1024, 1}, {17, 3}, {2, 2048}, {9, 9}, {0, 0}, {31, 1}}
	f = nil
	for i, sh := range shapes {
		f = append(f, tensorSpec{fmt.Sprintf("r%02d.npy", i), npy.Float32, sh, 0})
	}
	f[4].at, f[9].at, f[12].at = 4096, 5008, 1008
	add("f32 ragged", f...)
	f = nil
	for i, at := range []int64{0, 192, 4096, 4224, 8000, 0, 0, 128, 4224, 4224, 65536 - 64} {
		f = append(f, tensorSpec{fmt.Sprintf("h%02d.npy", i), npy.Uint8, []int64{5000}, at})
	}
	add("u8 header lengths", f...)
	f = nil
	for i, n := range []int64{0, 1, 4095, 4096, 4097, 12288, 3, 3, 3, 3, 70000} {
		f = append(f, tensorSpec{fmt.Sprintf("q%02d.npy", i), npy.Bool, []int64{n}, 0})
	}
	add("bool ragged", f...)
	return sets
}

// writeTensorSet writes set's files under dir with write (relative
// paths), seeded by its name.
func writeTensorSet(t testing.TB, set tensorSet, dir string, write func(rel string, b []byte)) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(len(set.name)), uint64(len(set.files))))
	for _, sp := range set.files {
		write(filepath.Join(dir, sp.name), npyFile(t, rng, sp))
	}
}

// mapTensors maps root's .npy files as fn.readers.numpy finds them.
func mapTensors(t testing.TB, root string) *bmap.Map {
	t.Helper()
	m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{Reader: bmap.ReaderNumpy})
	if err != nil {
		t.Fatal(err)
	}
	if m.Reader != bmap.ReaderNumpy {
		t.Fatalf("map of %s: reader %v", root, m.Reader)
	}
	return m
}

// tempTensors writes set in a temporary directory and maps it.
func tempTensors(t testing.TB, set tensorSet) *bmap.Map {
	root := t.TempDir()
	writeTensorSet(t, set, "", func(rel string, b []byte) {
		if err := os.WriteFile(filepath.Join(root, rel), b, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	return mapTensors(t, root)
}

// tensorData reads each sample's data bytes from its file (the bytes
// after the header, [Offset, Offset+Size)), once.
type tensorData struct {
	m    *bmap.Map
	mu   sync.Mutex
	data map[int32][]byte
}

func (d *tensorData) of(t testing.TB, i int32) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b, ok := d.data[i]; ok {
		return b
	}
	s := &d.m.Samples[i]
	b, err := os.ReadFile(filepath.Join(d.m.Root, s.Path))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != s.Offset+s.Size {
		t.Fatalf("%s: %d bytes, the map says %d + %d", s.Path, len(b), s.Offset, s.Size)
	}
	if d.data == nil {
		d.data = map[int32][]byte{}
	}
	d.data[i] = b[s.Offset:]
	return d.data[i]
}

// wantDense is the size of every sample of b when it must be dense: all
// of one size > 0, dtype, shape and phase, and their rows fit the slot (in
// GPU memory at their staging pitch; padding may repeat a sample more
// often than a slot sized for the largest samples holds); else 0.
func wantDense(m *bmap.Map, b *Batch, d batchmem.Desc) int64 {
	s0 := &m.Samples[b.Indices[0]]
	for _, i := range b.Indices {
		s := &m.Samples[i]
		if s.Size == 0 || s.Size != s0.Size || s.Offset%backend.Align != s0.Offset%backend.Align ||
			s.Tensor.DType != s0.Tensor.DType || !slices.Equal(s.Tensor.Shape, s0.Tensor.Shape) {
			return 0
		}
	}
	lead, rows := s0.Offset%backend.Align, int64(b.Len())
	if (d.Kind == batchmem.GPU && rows*backend.AlignUp(lead+s0.Size) > d.SlotSize) || (d.Kind != batchmem.GPU && lead+rows*s0.Size > d.SlotSize) {
		return 0
	}
	return s0.Size
}

// tensorCheck is what checkTensorBatch checks beyond the bytes.
type tensorCheck struct {
	slack bool  // the memory as the client maps it holds zeros in every ragged sample's slack
	lead  bool  // and before a dense batch's first row
	fail  int32 // the sample whose reads fail, -1 none
}

// checkTensorBatch checks batch b of tensor map m as the client sees it
// in view (the whole memory desc describes): every sample that did
// not fail holds its file's data bytes at Offsets[i] (a padding row too);
// the batch is dense exactly when wantDense says (rows back to back from
// the slot's start plus their phase), else each sample starts at its
// phase in an aligned room; a failed sample (c.fail) has length 0 and,
// dense, a row of zeros; with c.slack the rooms' slack reads zeros. It
// returns whether the batch was dense and how many positions failed.
func checkTensorBatch(t testing.TB, what string, d *tensorData, view []byte, desc batchmem.Desc, b *Batch, c tensorCheck) (dense bool, failed int) {
	t.Helper()
	m, slotSize := d.m, desc.SlotSize
	what = fmt.Sprintf("%s: epoch %d batch %d", what, b.Epoch, b.Iteration)
	base := int64(b.Slot) * slotSize
	row := wantDense(m, b, desc)
	if b.Dense() != row {
		t.Fatalf("%s: Dense() = %d, want %d (sizes %v)", what, b.Dense(), row, b.Lengths)
	}
	for i := range b.Len() {
		si := b.Indices[i]
		s := &m.Samples[si]
		phase := s.Offset % backend.Align
		isFailed := slices.Contains(b.Failed, i)
		if isFailed != (si == c.fail) {
			t.Fatalf("%s: position %d (%s): failed %v", what, i, s.Path, isFailed)
		}
		if b.Labels[i] != 0 {
			t.Fatalf("%s: position %d: label %d", what, i, b.Labels[i])
		}
		switch {
		case row > 0 && b.Offsets[i] != base+phase+int64(i)*row:
			t.Fatalf("%s: dense position %d at %d of its slot, want %d", what, i, b.Offsets[i]-base, phase+int64(i)*row)
		case row == 0 && s.Size > 0 && (b.Offsets[i]-phase)%backend.Align != 0:
			t.Fatalf("%s: ragged position %d (%s, data at %d of its file) at %d of its slot: not its phase", what, i, s.Path, s.Offset, b.Offsets[i]-base)
		case b.Offsets[i] < base || b.Offsets[i]+s.Size > base+slotSize:
			t.Fatalf("%s: position %d at %d: outside its slot", what, i, b.Offsets[i]-base)
		}
		got := view[b.Offsets[i] : b.Offsets[i]+s.Size]
		if isFailed {
			failed++
			if b.Lengths[i] != 0 {
				t.Fatalf("%s: failed position %d has length %d", what, i, b.Lengths[i])
			}
			if row > 0 && indexNot(got, 0) >= 0 {
				t.Fatalf("%s: failed dense row %d holds %#x at %d, want zeros", what, i, got[indexNot(got, 0)], indexNot(got, 0))
			}
			continue
		}
		if b.Lengths[i] != s.Size {
			t.Fatalf("%s: position %d: length %d, want %d", what, i, b.Lengths[i], s.Size)
		}
		if want := d.of(t, si); !bytes.Equal(got, want) {
			t.Fatalf("%s: position %d: sample %s (%d data bytes at %d of its file, %s%s) at %d differs from its file's data%s",
				what, i, s.Path, s.Size, s.Offset, s.Tensor.DType, npy.FormatShape(s.Tensor.Shape), b.Offsets[i]-base, firstDiff(got, want))
		}
		if c.slack && row == 0 && s.Size > 0 {
			start := b.Offsets[i] - phase
			end := start + backend.AlignUp(phase+s.Size)
			if j := indexNot(view[start:b.Offsets[i]], 0); j >= 0 {
				t.Fatalf("%s: position %d (%s): slack byte %d before its data is %#x", what, i, s.Path, j, view[start+int64(j)])
			}
			if j := indexNot(view[b.Offsets[i]+s.Size:end], 0); j >= 0 {
				t.Fatalf("%s: position %d (%s): slack byte %d after its data is %#x", what, i, s.Path, j, view[b.Offsets[i]+s.Size+int64(j)])
			}
		}
	}
	if c.lead && row > 0 {
		if j := indexNot(view[base:b.Offsets[0]], 0); j >= 0 {
			t.Fatalf("%s: byte %d before the first dense row is %#x", what, j, view[base+int64(j)])
		}
	}
	return row > 0, failed
}

// tensorArgs are the sequences every tensor test reads: in order, shuffled,
// and the last shard padded (its last batch repeats its last sample).
var tensorArgs = []struct {
	name string
	args ReaderArgs
}{
	{"in order", ReaderArgs{BatchSize: 4}},
	{"shuffled", ReaderArgs{BatchSize: 3, RandomShuffle: true, Seed: 11}},
	{"shard 1 of 2 padded", ReaderArgs{BatchSize: 5, NumShards: 2, ShardID: 1, PadLastBatch: true}},
}

// readTensors reads two epochs of m with o, checking every batch as the
// client sees it (view(l): the memory it maps), and returns how many
// batches were dense and how many positions failed; with fail >= 0,
// sample fail's reads fail (EIO) and o has SkipErrors.
func readTensors(t *testing.T, d *tensorData, o Options, view func(l *Loader) []byte, c tensorCheck) (dense, failed int) {
	t.Helper()
	dense, failed, _ = readTensorsAll(t, d, o, view, c)
	return dense, failed
}

// readTensorsStats is readTensors returning the backend's counters.
func readTensorsStats(t *testing.T, d *tensorData, o Options, view func(l *Loader) []byte, c tensorCheck) backend.Stats {
	t.Helper()
	_, _, st := readTensorsAll(t, d, o, view, c)
	return st
}

// readTensorsAll is readTensors returning the backend's counters too.
func readTensorsAll(t *testing.T, d *tensorData, o Options, view func(l *Loader) []byte, c tensorCheck) (dense, failed int, st backend.Stats) {
	t.Helper()
	if c.fail >= 0 {
		inject(t, (&faults.Faults{}).Add(faults.Rule{Op: faults.FileRead | faults.DeviceRead, Path: d.m.Samples[c.fail].Path, Err: unix.EIO}))
		o.SkipErrors = true
	}
	l, err := New(context.Background(), d.m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	}()
	v := view(l)
	desc := l.Memory().Desc()
	for e := range 2 {
		var order []int32
		errs := eachBatch(l, func(b *Batch) {
			isDense, nf := checkTensorBatch(t, fmt.Sprintf("epoch %d", e), d, v, desc, b, c)
			if isDense {
				dense++
			}
			failed += nf
			order = append(order, b.Indices...)
		})
		if len(errs) > 0 {
			t.Fatalf("epoch %d: %v", e, errs)
		}
		want, _ := l.Sampling().EpochOrder(e, nil, nil)
		if fmt.Sprint(order) != fmt.Sprint(want) {
			t.Fatalf("epoch %d: order %v, the sampler's %v", e, order, want)
		}
	}
	if (failed > 0) != (c.fail >= 0) {
		t.Errorf("%d failed positions delivered, sample %d failing", failed, c.fail)
	}
	// The counters are read once the reads ahead have ended: a batch read
	// ahead counts its samples before its bytes, so a snapshot taken
	// while it runs (on a busy machine) pairs counts that disagree.
	if err := l.Close(); err != nil {
		t.Error(err)
	}
	return dense, failed, l.Backend().Stats()
}

// hostView is the memory a client maps: the exported descriptor.
func hostView(t *testing.T) func(l *Loader) []byte {
	return func(l *Loader) []byte { return exported(t, l.Memory()) }
}

// TestTensorsHost serves every tensor dataset in host memory with the
// file backend, buffered and O_DIRECT (a temporary directory: no root
// needed), in order, shuffled and padded, with and without a failing
// sample (the padding sample too): every sample's bytes are its file's
// data bytes, padding rows included, dense batches are dense (back to
// back, at their phase), ragged ones at their phase in aligned rooms, a
// failed dense row reads zeros, and every slack byte reads zero.
func TestTensorsHost(t *testing.T) {
	for _, set := range tensorSets() {
		t.Run(set.name, func(t *testing.T) {
			d := &tensorData{m: tempTensors(t, set)}
			var dense int
			last := int32(len(d.m.Samples) - 1) // the padding sample of the last shard
			for _, direct := range []bool{false, true} {
				for _, a := range tensorArgs {
					for _, fail := range []int32{-1, 2, last} {
						t.Run(fmt.Sprintf("direct %v/%s/fail %d", direct, a.name, fail), func(t *testing.T) {
							o := Options{ReaderArgs: a.args, PrefetchQueueDepth: 2, BackendOptions: map[string]any{"direct": direct}}
							n, _ := readTensors(t, d, o, hostView(t), tensorCheck{slack: true, lead: true, fail: fail})
							dense += n
						})
					}
				}
			}
			if set.name == "f32 dense" || set.name == "i16 whole blocks" || set.name == "f64 0-d" {
				if dense == 0 {
					t.Errorf("no dense batch")
				}
			}
		})
	}
}

// TestTensorsGPUDouble serves the tensor datasets into the GPU memory
// double on both GPU paths: bounce (the file backend with O_DIRECT into
// staging rooms that keep each sample's phase) and a cufile stand-in
// writing the device (devBackend: Request.DevBytes from the data's
// offset).
func TestTensorsGPUDouble(t *testing.T) {
	for _, set := range tensorSets() {
		t.Run(set.name, func(t *testing.T) {
			d := &tensorData{m: tempTensors(t, set)}
			for _, path := range []string{GPUPathBounce, GPUPathCuFile} {
				for _, a := range tensorArgs {
					for _, fail := range []int32{-1, 3} {
						t.Run(fmt.Sprintf("%s/%s/fail %d", path, a.name, fail), func(t *testing.T) {
							var mem *gpuMemory
							o := Options{ReaderArgs: a.args, Memory: batchmem.GPU, GPUPath: path, openMemory: gpuDouble(&mem)}
							if path == GPUPathBounce {
								o.Backend, o.BackendOptions = "file", map[string]any{"direct": true}
							} else {
								o.Spec = devSpec(&mem, &devBackend{sizes: map[int64]int{}})
							}
							readTensors(t, d, o, func(*Loader) []byte { return mem.dev }, tensorCheck{slack: path == GPUPathBounce, fail: fail})
						})
					}
				}
			}
		})
	}
}

// tensorBackends are the backend configurations the filesystem tests
// read with: gds on both engines and with every raw sample read guarded
// (freshness read: into bounce rooms at the slot's phase, copied once
// checked), bam with its cache and without, file buffered and O_DIRECT.
var tensorBackends = []struct {
	name    string
	backend string
	opts    map[string]any
}{
	{"gds uring", "gds", map[string]any{"engine": raw.EngineUring, "queue_depth": 8}},
	{"gds pread, 8 KiB requests", "gds", map[string]any{"engine": raw.EnginePread, "max_request": 8192}},
	{"gds guarded", "gds", map[string]any{"freshness": raw.FreshRead}},
	{"bam", "bam", map[string]any{"queues": 2}},
	{"bam 8 KiB blocks, no cache", "bam", map[string]any{"block_size": 8192, "cache_mb": 0}},
	{"file", "file", nil},
	{"file direct", "file", map[string]any{"direct": true}},
}

// fsTensors writes every tensor set on fs, one directory each, and maps
// them.
func fsTensors(t *testing.T, fs *testfs.FS) map[string]*bmap.Map {
	sets := map[string]*bmap.Map{}
	for k, set := range tensorSets() {
		writeTensorSet(t, set, fmt.Sprintf("set%d", k), func(rel string, b []byte) { fs.WriteFile(t, rel, b) })
	}
	fs.Sync(t)
	for k, set := range tensorSets() {
		sets[set.name] = mapTensors(t, fs.Path(fmt.Sprintf("set%d", k)))
	}
	return sets
}

// TestTensorsFilesystems serves every tensor dataset from real
// filesystems (ext4 with 4 KiB and 1 KiB blocks, xfs) with every raw and
// file backend configuration, into host memory and into the GPU memory
// double (bounce: the backend reads the staging area): in order, shuffled,
// padded with a failing sample. Every sample's bytes are its file's data
// bytes, dense batches back to back at their phase, every slack byte
// zero; the raw backends read raw samples (not all through the
// filesystem).
func TestTensorsFilesystems(t *testing.T) {
	for _, fo := range rawFilesystems {
		t.Run(fmt.Sprintf("%s%v", fo.Type, fo.MkfsArgs), func(t *testing.T) {
			fs := testfs.New(t, fo)
			sets := fsTensors(t, fs)
			for _, set := range tensorSets() {
				d := &tensorData{m: sets[set.name]}
				for _, be := range tensorBackends {
					for _, memory := range []batchmem.Kind{batchmem.Pinned, batchmem.GPU} {
						t.Run(fmt.Sprintf("%s/%s/%s", set.name, be.name, memory), func(t *testing.T) {
							var rawSamples int64
							for k, a := range tensorArgs {
								fail := int32(-1)
								if k == len(tensorArgs)-1 {
									fail = 2 // not an empty array: those have no read to fail
								}
								var mem *gpuMemory
								o := Options{ReaderArgs: a.args, Backend: be.backend, BackendOptions: be.opts, PrefetchQueueDepth: 2}
								view := hostView(t)
								if memory == batchmem.GPU {
									o.Memory, o.GPUPath, o.openMemory = batchmem.GPU, GPUPathBounce, gpuDouble(&mem)
									view = func(*Loader) []byte { return mem.dev }
								}
								st := readTensorsStats(t, d, o, view, tensorCheck{slack: true, lead: memory == batchmem.Pinned, fail: fail})
								rawSamples += st.Counter("raw_samples")
								if st.Counter("stale_samples") != 0 {
									t.Errorf("%s: %d stale samples", a.name, st.Counter("stale_samples"))
								}
							}
							if be.backend != "file" && rawSamples == 0 {
								t.Errorf("no sample read raw")
							}
						})
					}
				}
			}
		})
	}
}

// bigTensors writes n float32 arrays of elems elements each (np.save's
// header: the data at 128) under dir on fs and maps them.
func bigTensors(t testing.TB, fs *testfs.FS, dir string, n int, elems int64) *bmap.Map {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(elems)))
	for i := range n {
		fs.WriteFile(t, fmt.Sprintf("%s/t%02d.npy", dir, i), npyFile(t, rng, tensorSpec{dt: npy.Float32, shape: []int64{elems}}))
	}
	fs.Sync(t)
	return mapTensors(t, fs.Path(dir))
}

// TestTensorsInPlace: dense batches of 16 MiB tensors (rows a multiple
// of 4 KiB, at the data's phase 128) are read from the device in place
// by gds and bam: in host memory only each row's partial first and last
// blocks go through bounce memory (the bytes around them are other rows'),
// in the GPU memory's staging area, whose rooms keep the phase, none at
// all. Rows 4 bytes longer than a multiple of 4 KiB sit at other phases
// than their files' (but the first): those are bounced, which the same
// counter shows.
func TestTensorsInPlace(t *testing.T) {
	fs := testfs.New(t, testfs.Options{Type: "ext4", SizeMB: 1024, MkfsArgs: []string{"-b", "4096"}})
	const n, mib16 = 6, 4 << 20 // float32 elements
	aligned := bigTensors(t, fs, "aligned", n, mib16)
	unaligned := bigTensors(t, fs, "unaligned", n, mib16+1)
	for _, tc := range []struct {
		name    string
		m       *bmap.Map
		backend string
		memory  batchmem.Kind
		max     int64 // bounced bytes per sample read, at most
		min     int64 // and at least
	}{
		{"gds host", aligned, "gds", batchmem.Pinned, 2 * backend.Align, 2 * backend.Align},
		{"bam host", aligned, "bam", batchmem.Pinned, 2 * backend.Align, 2 * backend.Align},
		{"gds gpu staging", aligned, "gds", batchmem.GPU, 0, 0},
		{"bam gpu staging", aligned, "bam", batchmem.GPU, 0, 0},
		{"gds host, rows off their phase", unaligned, "gds", batchmem.Pinned, mib16*4 + 2*backend.Align, mib16 * 4 / 2}, // rows 1 and 2 of 3
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mem *gpuMemory
			o := Options{ReaderArgs: ReaderArgs{BatchSize: 3}, Backend: tc.backend}
			if tc.backend == "bam" {
				o.BackendOptions = map[string]any{"cache_mb": 0} // every block read from the device
			}
			view := hostView(t)
			if tc.memory == batchmem.GPU {
				o.Memory, o.GPUPath, o.openMemory = batchmem.GPU, GPUPathBounce, gpuDouble(&mem)
				view = func(*Loader) []byte { return mem.dev }
			}
			d := &tensorData{m: tc.m}
			dense, _, st := readTensorsAll(t, d, o, view, tensorCheck{slack: true, lead: tc.memory == batchmem.Pinned, fail: -1})
			if dense != 4 { // 2 epochs of 2 batches
				t.Errorf("%d dense batches, want 4", dense)
			}
			// The counts include the batches read ahead, their reads
			// issued, when the loader closed.
			samples, rawBytes, bounced := st.Counter("samples"), st.Counter("raw_bytes"), st.Counter("bounced_bytes")
			if samples < 2*n || st.Counter("raw_samples") < 2*n || rawBytes < samples*tc.m.Samples[0].Size || rawBytes > samples*(tc.m.Samples[0].Size+2*backend.Align) {
				t.Errorf("%d samples (%d raw), %d bytes read raw, want all, whole blocks", samples, st.Counter("raw_samples"), rawBytes)
			}
			if bounced < samples*tc.min || bounced > samples*tc.max {
				t.Errorf("%d of %d bytes of %d samples read into bounce memory, want %d to %d per sample", bounced, rawBytes, samples, tc.min, tc.max)
			}
			t.Logf("%s: %d bytes read raw, %d bounced (%.4f%%)", tc.name, rawBytes, bounced, 100*float64(bounced)/float64(rawBytes))
		})
	}
}

// BenchmarkDenseTensors reads dense batches of 16 MiB float32 tensors
// with gds into host memory: rows a multiple of 4 KiB long read in place
// (two blocks per row bounced), and rows 4 bytes longer, which sit at other
// phases than their files' and are bounced whole (copied after). Bytes/s
// are the tensors' data bytes.
func BenchmarkDenseTensors(b *testing.B) {
	fs := testfs.New(b, testfs.Options{Type: "ext4", SizeMB: 1024, MkfsArgs: []string{"-b", "4096"}})
	const n, mib16 = 8, 4 << 20
	for _, bc := range []struct {
		name  string
		elems int64
	}{{"in place", mib16}, {"bounced", mib16 + 1}} {
		m := bigTensors(b, fs, bc.name, n, bc.elems)
		b.Run(bc.name, func(b *testing.B) {
			l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 4}, Backend: "gds", PrefetchQueueDepth: 2})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.SetBytes(n * bc.elems * 4)
			b.ResetTimer()
			for range b.N {
				if errs := eachBatch(l, func(bt *Batch) {
					if bt.Dense() == 0 {
						b.Fatalf("a ragged batch")
					}
				}); len(errs) > 0 {
					b.Fatal(errs)
				}
			}
			b.StopTimer()
			st := l.Backend().Stats()
			b.ReportMetric(float64(st.Counter("bounced_bytes"))/float64(st.Counter("raw_bytes")), "bounced/raw")
		})
	}
}

// TestTensorsStandin serves the tensor datasets into GPU memory as a real
// GPU makes it (batchmem's VMM memory, its staging area registered) over
// the strict CUDA stand-in, on both GPU paths: the real cufile backend
// (cuFileRead of each sample's data from its offset, unaligned offsets,
// sizes and addresses included, as cuFile takes them) and bounce with the
// file backend (O_DIRECT) and, on ext4, gds. The device memory, read back
// through its exported descriptor, holds every sample's data bytes; the
// stand-in's report shows no broken rule and nothing left.
func TestTensorsStandin(t *testing.T) {
	if !standin.InChild(t) {
		return
	}
	var onExt4 map[string]*bmap.Map
	if os.Geteuid() == 0 {
		onExt4 = fsTensors(t, testfs.New(t, testfs.Ext4()))
	}
	for _, set := range tensorSets() {
		t.Run(set.name, func(t *testing.T) {
			d := &tensorData{m: tempTensors(t, set)}
			for _, path := range []string{GPUPathCuFile, GPUPathBounce, "bounce gds"} {
				for k, a := range tensorArgs {
					fail := int32(-1)
					if k == len(tensorArgs)-1 {
						fail = 2
					}
					t.Run(fmt.Sprintf("%s/%s", path, a.name), func(t *testing.T) {
						o := Options{ReaderArgs: a.args, Memory: batchmem.GPU, GPUPath: path}
						d := d
						switch path {
						case GPUPathBounce:
							o.Backend, o.BackendOptions = "file", map[string]any{"direct": true}
						case "bounce gds":
							if onExt4 == nil {
								t.Skip("gds needs root (a loop device)")
							}
							d = &tensorData{m: onExt4[set.name]}
							o.GPUPath, o.Backend = GPUPathBounce, "gds"
						}
						standin.ProvideCuFileHost(t, false, d.m.Root)
						readTensors(t, d, o, func(l *Loader) []byte { return exported(t, l.Memory()) }, tensorCheck{slack: path != GPUPathCuFile, fail: fail})
					})
				}
			}
		})
	}
}

// TestTensorsStale: a tensor file rewritten since mapping is never read
// from its old blocks: gds reads it through the filesystem (on_stale
// fallback: its new data bytes, from their offset, into its dense row or
// ragged room) or fails it (on_stale fail: a zero row, with SkipErrors).
func TestTensorsStale(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	sets := fsTensors(t, fs)
	for _, name := range []string{"f32 dense", "f32 ragged"} {
		m := sets[name]
		const victim = 2
		path := filepath.Join(m.Root, m.Samples[victim].Path)
		old, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		fresh := slices.Clone(old)
		for i := m.Samples[victim].Offset; i < int64(len(fresh)); i++ {
			fresh[i] ^= 0x5A
		}
		if err := os.WriteFile(path, fresh, 0o644); err != nil {
			t.Fatal(err)
		}
		fs.Sync(t)
		for _, policy := range []string{raw.StaleFallback, raw.StaleFail} {
			t.Run(name+"/"+policy, func(t *testing.T) {
				d := &tensorData{m: m}
				c := tensorCheck{slack: true, lead: true, fail: -1}
				o := Options{ReaderArgs: ReaderArgs{BatchSize: 4}, Backend: "gds", BackendOptions: map[string]any{"on_stale": policy}}
				if policy == raw.StaleFail {
					c.fail = victim
				}
				st := readTensorsStats(t, d, o, hostView(t), c)
				if st.Counter("stale_samples") == 0 {
					t.Errorf("the rewritten sample was not found stale: %+v", st)
				}
				if got := d.of(t, victim); bytes.Equal(got, old[m.Samples[victim].Offset:]) {
					t.Fatalf("the test compared the old data")
				}
			})
		}
	}
}
