// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// TestROIRegion: the region of an array DALI's NamedSliceAttr and
// ApplySliceBoundsPolicy give (fn.readers.numpy's roi_* arguments), and
// the errors naming the argument and the range.
func TestROIRegion(t *testing.T) {
	shape := []int64{10, 20, 30}
	for _, c := range []struct {
		name        string
		roi         ROI
		start, size []int64
		err         string
	}{
		{"start end all axes", ROI{Start: []int64{1, 2, 3}, End: []int64{4, 5, 6}}, []int64{1, 2, 3}, []int64{3, 3, 3}, ""},
		{"start only", ROI{Start: []int64{1, 2, 3}}, []int64{1, 2, 3}, []int64{9, 18, 27}, ""},
		{"one axis", ROI{Start: []int64{5}, End: []int64{7}, Axes: []int{1}}, []int64{0, 5, 0}, []int64{10, 2, 30}, ""},
		{"negative axis", ROI{Start: []int64{5}, Shape: []int64{4}, Axes: []int{-1}}, []int64{0, 0, 5}, []int64{10, 20, 4}, ""},
		{"relative", ROI{RelStart: []float64{0.25, 0.5}, RelEnd: []float64{0.75, 1}, Axes: []int{0, 2}}, []int64{3, 0, 15}, []int64{5, 20, 15}, ""},
		{"rel start and shape", ROI{RelStart: []float64{0.1}, RelShape: []float64{0.3}, Axes: []int{0}}, []int64{1, 0, 0}, []int64{3, 20, 30}, ""},
		{"rel shape", ROI{RelShape: []float64{0.55}, Axes: []int{0}}, []int64{0, 0, 0}, []int64{6, 20, 30}, ""},
		{"pad", ROI{Start: []int64{-2}, End: []int64{12}, Axes: []int{0}, Policy: PolicyPad}, []int64{-2, 0, 0}, []int64{14, 20, 30}, ""},
		{"trim", ROI{Start: []int64{-2}, End: []int64{12}, Axes: []int{0}, Policy: PolicyTrim}, []int64{0, 0, 0}, []int64{10, 20, 30}, ""},
		{"trim empty", ROI{Start: []int64{40}, End: []int64{50}, Axes: []int{2}, Policy: PolicyTrim}, []int64{0, 0, 30}, []int64{10, 20, 0}, ""},
		{"error outside", ROI{Start: []int64{-1}, Axes: []int{0}}, nil, nil, "region [-1, 10) along axis 0 is outside the array's [0, 10)"},
		{"error past end", ROI{End: []int64{31}, Axes: []int{2}}, nil, nil, "region [0, 31) along axis 2 is outside the array's [0, 30)"},
		{"too few values", ROI{Start: []int64{1, 2}}, nil, nil, "the region arguments have 2 values, the array [10 20 30] has 3 dimensions (give roi_axes)"},
		{"axis out of range", ROI{Start: []int64{1}, Axes: []int{3}}, nil, nil, "roi_axes: axis 3 not in [-3, 3)"},
		{"end before start", ROI{Start: []int64{5}, End: []int64{4}, Axes: []int{0}}, nil, nil, "ends before it starts"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.roi.Validate(); err != nil {
				t.Fatal(err)
			}
			start, size, err := c.roi.Region(shape)
			if c.err != "" {
				if err == nil || !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v, want an ErrOptions saying %q", err, c.err)
				}
				return
			}
			if err != nil || !slices.Equal(start, c.start) || !slices.Equal(size, c.size) {
				t.Fatalf("got %v %v %v, want %v %v", start, size, err, c.start, c.size)
			}
		})
	}
}

// TestROIValidate: what needs no dataset is refused naming the argument.
func TestROIValidate(t *testing.T) {
	for _, c := range []struct {
		roi ROI
		err string
	}{
		{ROI{}, "needs roi_start, roi_end, roi_shape"},
		{ROI{Start: []int64{1}, RelStart: []float64{0.5}}, "roi_start and rel_roi_start are mutually exclusive"},
		{ROI{End: []int64{1}, Shape: []int64{1}}, "[roi_end roi_shape] are mutually exclusive"},
		{ROI{Start: []int64{1, 2}, End: []int64{3}}, "roi_end has 1 values, the other region arguments 2"},
		{ROI{Start: []int64{1}, Axes: []int{0, 1}}, "roi_axes has 2 axes, the region arguments 1 values"},
		{ROI{Shape: []int64{-1}}, "roi_shape [-1]: a shape is not negative"},
		{ROI{Start: []int64{1}, Policy: "wrap"}, `out_of_bounds_policy "wrap"`},
	} {
		if err := c.roi.Validate(); err == nil || !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%+v: got %v, want %q", c.roi, err, c.err)
		}
	}
}

// cropRef is the region (start, size) of the C-order array data (shape,
// elements of item bytes) packed C-contiguous, cells outside the array
// fill: cell by cell.
func cropRef(data []byte, shape, start, size []int64, item int, fillCell []byte) []byte {
	n := int64(1)
	for _, d := range size {
		n *= d
	}
	out := make([]byte, 0, n*int64(item))
	idx := make([]int64, len(size))
	for k := int64(0); k < n; k++ {
		rem := k
		for d := len(size) - 1; d >= 0; d-- {
			idx[d] = rem % size[d]
			rem /= size[d]
		}
		var off int64
		inside := true
		for d := range size {
			x := idx[d] + start[d]
			if x < 0 || x >= shape[d] {
				inside = false
			}
			off = off*shape[d] + x
		}
		if inside {
			out = append(out, data[off*int64(item):(off+1)*int64(item)]...)
		} else {
			out = append(out, fillCell...)
		}
	}
	return out
}

// TestROIRuns: the runs of random regions of random arrays, packed,
// equal the region cell by cell, and coalescing covers every run.
func TestROIRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		nd := 1 + rng.IntN(4)
		shape, start, size := make([]int64, nd), make([]int64, nd), make([]int64, nd)
		for d := range shape {
			shape[d] = 1 + rng.Int64N(7)
			start[d] = rng.Int64N(shape[d]+4) - 2
			size[d] = rng.Int64N(shape[d] + 3)
		}
		const item = 2
		data := make([]byte, item)
		for _, d := range shape {
			data = make([]byte, int64(len(data))*d)
		}
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		fillCell := []byte{0xAB, 0xCD}
		want := cropRef(data, shape, start, size, item, fillCell)
		runs, inside := regionRuns(nil, shape, start, size, item)
		got := make([]byte, len(want))
		if !inside {
			for i := 0; i < len(got); i += item {
				copy(got[i:], fillCell)
			}
		}
		var covered int64
		for _, r := range runs {
			copy(got[r.dst:r.dst+r.n], data[r.src:r.src+r.n])
			covered += r.n
		}
		if !slices.Equal(got, want) {
			t.Fatalf("shape %v region %v+%v: runs %v give %v, want %v", shape, start, size, runs, got, want)
		}
		if inside && covered != int64(len(want)) {
			t.Fatalf("shape %v region %v+%v inside, but runs cover %d of %d bytes", shape, start, size, covered, len(want))
		}
		reads := coalesce(nil, runs)
		for _, r := range runs {
			if !slices.ContainsFunc(reads, func(x roiRead) bool { return x.a <= r.src && r.src+r.n <= x.z }) {
				t.Fatalf("run %v in no read of %v", r, reads)
			}
		}
	}
}

// TestROIFill: the fill value as each dtype holds it (DALI's ConvertSat,
// checked against fn.readers.numpy in python/tests/test_roi.py).
func TestROIFill(t *testing.T) {
	for _, c := range []struct {
		dt   npy.DType
		v    float32
		want []byte
	}{
		{npy.Uint8, 3.7, []byte{4}},
		{npy.Uint8, 300, []byte{255}},
		{npy.Uint8, -3, []byte{0}},
		{npy.Int16, -5.9, []byte{0xfa, 0xff}},
		{npy.Int16, -7.5, []byte{0xf8, 0xff}},
		{npy.Int8, 2.5, []byte{3}},
		{npy.Float32, 1, []byte{0, 0, 0x80, 0x3f}},
		{npy.Float16, 1.5, []byte{0, 0x3e}},
		{npy.Float16, 65520, []byte{0, 0x7c}},
		{npy.Bool, 2, []byte{1}},
	} {
		got := make([]byte, len(c.want))
		fill(got, c.dt, c.v)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %v: % x, want % x", c.dt, c.v, got, c.want)
		}
	}
}

// roiCases are regions read in the loader tests: several axes, absolute
// and relative, each out-of-bounds policy.
var roiCases = []struct {
	name string
	roi  ROI
}{
	{"middle", ROI{Start: []int64{1, 2, 3}, End: []int64{4, 6, 9}}},
	{"rows", ROI{Start: []int64{2}, Shape: []int64{3}, Axes: []int{0}}},
	{"last axis", ROI{RelStart: []float64{0.3}, RelEnd: []float64{0.8}, Axes: []int{-1}}},
	{"slice", ROI{Start: []int64{4}, Shape: []int64{1}, Axes: []int{0}}},
	{"pad", ROI{Start: []int64{-2, 5}, End: []int64{3, 40}, Axes: []int{0, 2}, Policy: PolicyPad, FillValue: 7}},
	{"trim", ROI{Start: []int64{-2, 5}, End: []int64{3, 40}, Axes: []int{0, 2}, Policy: PolicyTrim}},
}

// roiTensors writes float32 arrays of two shapes under dir (write) and
// returns their shapes in name order.
func roiTensors(t testing.TB, write func(rel string, b []byte)) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 6 {
		shape := []int64{8, 64, 33}
		if i%3 == 2 {
			shape = []int64{9, 60, 33}
		}
		write(fmt.Sprintf("t%02d.npy", i), npyFile(t, rng, tensorSpec{dt: npy.Float32, shape: shape}))
	}
}

// readROI reads every batch of two epochs of m through roi with o and
// checks each sample against cropRef of its file's data; it returns the
// backend's stats.
func readROI(t *testing.T, m *bmap.Map, roi ROI, o Options) backend.Stats {
	t.Helper()
	d := &tensorData{m: m}
	o.ROI = &roi
	o.BatchSize, o.PrefetchQueueDepth = 2, 2
	l, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	view := exported(t, l.Memory())
	for epoch := 0; epoch < 2; {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			epoch++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		shapes := make(map[string]bool)
		for i, si := range b.Indices {
			s := &m.Samples[si]
			start, size, err := roi.Region(s.Tensor.Shape)
			if err != nil {
				t.Fatal(err)
			}
			fillCell := make([]byte, 4)
			fill(fillCell, npy.Float32, float32(roi.FillValue))
			want := cropRef(d.of(t, si), s.Tensor.Shape, start, size, 4, fillCell)
			got := view[b.Offsets[i] : b.Offsets[i]+b.Lengths[i]]
			if !slices.Equal(got, want) || !slices.Equal(b.Shapes[i], size) {
				t.Fatalf("batch %d/%d sample %s: %d bytes shape %v, want %d bytes shape %v (equal: %v)", b.Epoch, b.Iteration, s.Path, len(got), b.Shapes[i], len(want), size, slices.Equal(got, want))
			}
			shapes[fmt.Sprint(size)] = true
		}
		if dense := b.Dense() > 0; dense != (len(shapes) == 1) {
			t.Errorf("batch %d/%d: dense %v with region shapes %v", b.Epoch, b.Iteration, dense, shapes)
		}
		b.Release()
	}
	if err := l.Close(); err != nil { // the reads ahead end before the counters are read
		t.Error(err)
	}
	return l.Backend().Stats()
}

// TestROIFile reads regions with the file backend (buffered and
// O_DIRECT) from a temporary directory: every sample is its region.
func TestROIFile(t *testing.T) {
	root := t.TempDir()
	roiTensors(t, func(rel string, b []byte) {
		if err := os.WriteFile(filepath.Join(root, rel), b, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	m := mapTensors(t, root)
	for _, c := range roiCases {
		for _, direct := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/direct=%v", c.name, direct), func(t *testing.T) {
				readROI(t, m, c.roi, Options{Backend: "file", BackendOptions: map[string]any{"direct": direct}})
			})
		}
	}
}

// TestROIRaw reads regions with the raw backends from a real filesystem:
// every sample is its region, and a small region reads fewer device
// bytes than the whole arrays.
func TestROIRaw(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	roiTensors(t, func(rel string, b []byte) { fs.WriteFile(t, "roi/"+rel, b) })
	fs.Sync(t)
	m := mapTensors(t, fs.Path("roi"))
	var whole int64
	for i := range m.Samples {
		whole += 2 * m.Samples[i].Size // two epochs
	}
	for _, be := range tensorBackends {
		if be.backend == "file" {
			continue
		}
		for _, c := range roiCases {
			t.Run(be.name+"/"+c.name, func(t *testing.T) {
				st := readROI(t, m, c.roi, Options{Backend: be.backend, BackendOptions: be.opts})
				if st.Counter("raw_samples") == 0 {
					t.Errorf("no sample read raw")
				}
				if c.name == "slice" && be.backend == "gds" {
					// At most half: the loader reads ahead into a third
					// epoch (prefetch), and each row is at least a block.
					if got := st.Counter("raw_bytes"); got == 0 || got*2 > whole {
						t.Errorf("a one-row region read %d device bytes, the whole arrays are %d", got, whole)
					}
				}
			})
		}
	}
}

// TestROIOpen: a region that does not fit a sample is refused at open,
// naming the sample, the axis and the range; memory gpu and file maps are
// refused.
func TestROIOpen(t *testing.T) {
	root := t.TempDir()
	roiTensors(t, func(rel string, b []byte) {
		if err := os.WriteFile(filepath.Join(root, rel), b, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	m := mapTensors(t, root)
	_, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 2}, ROI: &ROI{End: []int64{62}, Axes: []int{1}}})
	if err == nil || !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "t02.npy") || !strings.Contains(err.Error(), "region [0, 62) along axis 1 is outside the array's [0, 60)") {
		t.Errorf("open: %v", err)
	}
	_, err = New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 2}, Memory: "gpu", ROI: &ROI{End: []int64{2}, Axes: []int{1}}})
	if err == nil || !strings.Contains(err.Error(), "host memory only") {
		t.Errorf("open gpu: %v", err)
	}
}
