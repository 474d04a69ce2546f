// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// Out-of-bounds policies of a region of interest (ROI.Policy), as
// fn.readers.numpy's out_of_bounds_policy names them.
const (
	PolicyError = "error"         // a region not inside the array fails (the default)
	PolicyPad   = "pad"           // the region's cells outside the array hold FillValue
	PolicyTrim  = "trim_to_shape" // the region is cut to the array
)

// MaxROIAxes bounds the values of each of a region's arguments: no array
// a map holds has more dimensions (bmap/npy's bound).
const MaxROIAxes = 32

// roiGap is the widest gap between two runs that one read spans.
// Measured with bench/roi.sh: 64 KiB beat 4 KiB and 1 MiB.
const roiGap = 64 << 10

// ROI is fn.readers.numpy's region of interest, read packed C-contiguous.
// Along each of Axes the start is Start or RelStart, default 0.
// The end is End or RelEnd, or start plus Shape or RelShape, default the dimension.
// Relative values are float32 products, rounded half away from zero as DALI does.
// Policy says what a region outside the array does; PolicyPad fills with FillValue.
// Only the byte ranges a region needs are read. The msgpack keys are DALI's names.
type ROI struct {
	Start     []int64   `json:"roi_start,omitempty" msgpack:"roi_start"`
	RelStart  []float64 `json:"rel_roi_start,omitempty" msgpack:"rel_roi_start"`
	End       []int64   `json:"roi_end,omitempty" msgpack:"roi_end"`
	RelEnd    []float64 `json:"rel_roi_end,omitempty" msgpack:"rel_roi_end"`
	Shape     []int64   `json:"roi_shape,omitempty" msgpack:"roi_shape"`
	RelShape  []float64 `json:"rel_roi_shape,omitempty" msgpack:"rel_roi_shape"`
	Axes      []int     `json:"roi_axes,omitempty" msgpack:"roi_axes"`
	Policy    string    `json:"out_of_bounds_policy,omitempty" msgpack:"out_of_bounds_policy"` // "" means PolicyError
	FillValue float64   `json:"fill_value,omitempty" msgpack:"fill_value"`
}

// roiArg is one of a region's value arguments, by its DALI name.
type roiArg struct {
	name string
	n    int // values given, -1 not given
}

func given[T any](v []T) int {
	if v == nil {
		return -1
	}
	return len(v)
}

// args lists the region's value arguments with how many values each has.
func (r *ROI) args() []roiArg {
	return []roiArg{{"roi_start", given(r.Start)}, {"rel_roi_start", given(r.RelStart)}, {"roi_end", given(r.End)},
		{"rel_roi_end", given(r.RelEnd)}, {"roi_shape", given(r.Shape)}, {"rel_roi_shape", given(r.RelShape)}}
}

// Validate checks what needs no dataset. Errors wrap ErrOptions and name the argument.
func (r *ROI) Validate() error {
	var starts, ends []string
	n := -1
	for i, a := range r.args() {
		if a.n < 0 {
			continue
		}
		if i < 2 {
			starts = append(starts, a.name)
		} else {
			ends = append(ends, a.name)
		}
		if a.n > MaxROIAxes {
			return fmt.Errorf("%w: %s has %d values, at most %d", ErrOptions, a.name, a.n, MaxROIAxes)
		}
		if n >= 0 && a.n != n {
			return fmt.Errorf("%w: %s has %d values, the other region arguments %d (one per axis)", ErrOptions, a.name, a.n, n)
		}
		n = a.n
	}
	if len(starts) > 1 {
		return fmt.Errorf("%w: %s and %s are mutually exclusive", ErrOptions, starts[0], starts[1])
	}
	if len(ends) > 1 {
		return fmt.Errorf("%w: %s are mutually exclusive (give one)", ErrOptions, ends)
	}
	if n < 0 {
		return fmt.Errorf("%w: a region of interest needs roi_start, roi_end, roi_shape or one of their rel_ forms", ErrOptions)
	}
	if r.Axes != nil && len(r.Axes) != n {
		return fmt.Errorf("%w: roi_axes has %d axes, the region arguments %d values (one per axis)", ErrOptions, len(r.Axes), n)
	}
	for _, a := range r.Axes {
		if a < -MaxROIAxes || a >= MaxROIAxes {
			return fmt.Errorf("%w: roi_axes: axis %d not in [%d, %d)", ErrOptions, a, -MaxROIAxes, MaxROIAxes)
		}
	}
	for _, v := range [][]float64{r.RelStart, r.RelEnd, r.RelShape} {
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("%w: a relative region coordinate is %v, not finite", ErrOptions, x)
			}
		}
	}
	for _, x := range r.Shape {
		if x < 0 {
			return fmt.Errorf("%w: roi_shape %v: a shape is not negative", ErrOptions, r.Shape)
		}
	}
	for _, x := range r.RelShape {
		if x < 0 {
			return fmt.Errorf("%w: rel_roi_shape %v: a shape is not negative", ErrOptions, r.RelShape)
		}
	}
	switch r.Policy {
	case "", PolicyError, PolicyPad, PolicyTrim:
	default:
		return fmt.Errorf("%w: out_of_bounds_policy %q (want %s, %s or %s)", ErrOptions, r.Policy, PolicyError, PolicyPad, PolicyTrim)
	}
	return nil
}

// Region returns where the region of an array of shape starts and its shape, the policy applied.
// An error wraps ErrOptions and names the argument and range that do not fit.
func (r *ROI) Region(shape []int64) (start, size []int64, err error) {
	nd := len(shape)
	start, size = make([]int64, nd), slices.Clone(shape)
	axes := r.Axes
	if axes == nil {
		n := 0
		for _, a := range r.args() {
			n = max(n, a.n)
		}
		if n != nd {
			return nil, nil, fmt.Errorf("%w: the region arguments have %d values, the array %v has %d dimensions (give roi_axes)", ErrOptions, n, shape, nd)
		}
		axes = make([]int, nd)
		for i := range axes {
			axes[i] = i
		}
	}
	seen := make([]bool, nd)
	for i, a := range axes {
		d := a
		if d < 0 {
			d += nd
		}
		if d < 0 || d >= nd {
			return nil, nil, fmt.Errorf("%w: roi_axes: axis %d not in [%d, %d) for the array %v", ErrOptions, a, -nd, nd, shape)
		}
		if seen[d] {
			return nil, nil, fmt.Errorf("%w: roi_axes: axis %d given twice", ErrOptions, a)
		}
		seen[d] = true
		dim := shape[d]
		rel := func(x float64) float64 { return float64(float32(x) * float32(dim)) } // DALI: float × int64 is a float product
		lo := 0.0
		switch {
		case r.Start != nil:
			lo = float64(r.Start[i])
		case r.RelStart != nil:
			lo = rel(r.RelStart[i])
		}
		hi := float64(dim)
		switch {
		case r.End != nil:
			hi = float64(r.End[i])
		case r.RelEnd != nil:
			hi = rel(r.RelEnd[i])
		case r.Shape != nil:
			hi = lo + float64(r.Shape[i])
		case r.RelShape != nil && r.RelStart != nil:
			hi = float64((float32(r.RelStart[i]) + float32(r.RelShape[i])) * float32(dim))
		case r.RelShape != nil:
			hi = lo + rel(r.RelShape[i])
		}
		if lo < math.MinInt64/2 || lo > math.MaxInt64/2 || hi < math.MinInt64/2 || hi > math.MaxInt64/2 {
			return nil, nil, fmt.Errorf("%w: region along axis %d: [%v, %v) out of range", ErrOptions, d, lo, hi)
		}
		if hi < lo {
			return nil, nil, fmt.Errorf("%w: region along axis %d ends before it starts: [%v, %v)", ErrOptions, d, lo, hi)
		}
		start[d] = int64(math.Round(lo))
		size[d] = int64(math.Round(hi)) - start[d]
	}
	for d, dim := range shape {
		a, z := start[d], start[d]+size[d]
		switch r.Policy {
		case PolicyPad:
		case PolicyTrim:
			a, z = min(max(a, 0), dim), min(max(z, 0), dim)
			start[d], size[d] = a, z-a
		default:
			if a < 0 || a > dim || z < 0 || z > dim {
				return nil, nil, fmt.Errorf("%w: region [%d, %d) along axis %d is outside the array's [0, %d) (shape %v; out_of_bounds_policy %q: use %q or %q to read it)",
					ErrOptions, a, z, d, dim, shape, PolicyError, PolicyPad, PolicyTrim)
			}
		}
	}
	return start, size, nil
}

// roiRun is one contiguous run of a region's bytes: n bytes at file
// offset src (from the data's first byte) go to dst in the packed region.
type roiRun struct{ src, dst, n int64 }

// regionRuns appends the runs of a region of a C-order array to runs, in file order.
// inside reports whether the region lies wholly inside the array.
func regionRuns(runs []roiRun, shape, start, size []int64, item int64) (_ []roiRun, inside bool) {
	nd := len(shape)
	lo, hi := make([]int64, nd), make([]int64, nd)
	inside = true
	for d := range shape {
		lo[d], hi[d] = max(start[d], 0), min(start[d]+size[d], shape[d])
		if lo[d] != start[d] || hi[d] != start[d]+size[d] {
			inside = false
		}
		if hi[d] <= lo[d] {
			return runs, inside && size[d] == 0
		}
	}
	// Strides in bytes of the array (in) and the packed region (out).
	in, out := make([]int64, nd+1), make([]int64, nd+1)
	in[nd], out[nd] = item, item
	for d := nd - 1; d >= 0; d-- {
		in[d], out[d] = in[d+1]*shape[d], out[d+1]*size[d]
	}
	// Axes j+1.. are whole in both: a run spans axis j's range and all
	// after it.
	j := nd - 1
	for j > 0 && lo[j] == 0 && hi[j] == shape[j] && start[j] == 0 && size[j] == shape[j] {
		j--
	}
	n := item
	if nd > 0 {
		n = (hi[j] - lo[j]) * in[j+1]
	}
	idx := slices.Clone(lo[:max(j, 0)])
	for {
		var src, dst int64
		for d := range idx {
			src += idx[d] * in[d+1]
			dst += (idx[d] - start[d]) * out[d+1]
		}
		if nd > 0 {
			src += lo[j] * in[j+1]
			dst += (lo[j] - start[j]) * out[j+1]
		}
		runs = append(runs, roiRun{src, dst, n})
		d := len(idx) - 1
		for ; d >= 0; d-- {
			if idx[d]++; idx[d] < hi[d] {
				break
			}
			idx[d] = lo[d]
		}
		if d < 0 {
			return runs, inside
		}
	}
}

// roiRead is one read of a region: the data's bytes [a, z), spanning runs
// [first, last) of its sample.
type roiRead struct{ a, z int64 }

// coalesce returns the reads that cover runs (in file order): a run
// joins the read before it where the gap between them is under roiGap.
func coalesce(reads []roiRead, runs []roiRun) []roiRead {
	for _, r := range runs {
		if k := len(reads) - 1; k >= 0 && r.src-reads[k].z < roiGap {
			reads[k].z = max(reads[k].z, r.src+r.n)
			continue
		}
		reads = append(reads, roiRead{r.src, r.src + r.n})
	}
	return reads
}

// ROISlotBytes returns the slot size for any batch of m read as roi.
// A sample whose region does not fit fails, naming it.
func ROISlotBytes(m *bmap.Map, batchSize int, roi *ROI) (int64, error) {
	if m.Reader != bmap.ReaderNumpy {
		return 0, fmt.Errorf("%w: a region of interest (roi_*) reads tensor datasets (fn.readers.numpy); this one is a file dataset", ErrOptions)
	}
	top := make(minHeap, 0, min(batchSize, len(m.Samples)))
	for i := range m.Samples {
		s := &m.Samples[i]
		_, size, err := roi.Region(s.Tensor.Shape)
		if err != nil {
			return 0, fmt.Errorf("sample %d (%s): %w", i, s.Path, err)
		}
		n := regionBytes(s.Tensor, size)
		if n > MaxRegionBytes {
			return 0, fmt.Errorf("%w: sample %d (%s): the region %v of %d-byte items is more than %d bytes", ErrOptions, i, s.Path, size, s.Tensor.DType.ItemSize(), int64(MaxRegionBytes))
		}
		top.keep(backend.AlignUp(n))
	}
	return max(top.sum(), backend.Align), nil
}

// MaxRegionBytes bounds one sample's packed region, so no sum or offset wraps int64.
const MaxRegionBytes = 1 << 40

// regionBytes is a region's packed size, or MaxRegionBytes+1 where larger.
func regionBytes(t *bmap.Tensor, size []int64) int64 {
	n := int64(t.DType.ItemSize())
	for _, d := range size {
		if d != 0 && n > MaxRegionBytes/d {
			n = MaxRegionBytes + 1
		} else {
			n *= d
		}
	}
	return n
}

// roiSample is what a batch reads of one sample: its runs, reads, room and size.
type roiSample struct {
	pos      int // first position of the sample in the batch
	runs     []roiRun
	reads    []roiRead
	req      int   // its first request in Batch.reqs
	room     int64 // where the packed region starts in the slot (host view)
	n        int64 // its bytes
	pad      bool
	dtype    npy.DType
	repeatOf int  // -1, or the position whose packed region this one copies
	denied   bool // Options.Access refused it: no reads, its room zeroed (empty when ragged)
}

// roiBatch is a batch's region state, reused from batch to batch.
type roiBatch struct {
	samples []roiSample
	scratch []byte // the reads' rooms, Align-aligned
	raw     []byte // scratch's allocation
	shapes  [][]int64
}

// planROI lays out a batch read through the region of interest.
// Each region is packed C-contiguous in its row or room; its runs coalesce into scratch reads.
func (l *Loader) planROI(b *Batch, idx []int32) {
	rb := &b.roi
	rb.samples, rb.shapes = rb.samples[:0], rb.shapes[:0]
	roi := l.opts.ROI
	dense := true
	var scratch int64
	row, first := int64(0), -1 // the first position let through: its region's size and shape
	for i, si := range idx {
		s := &l.m.Samples[si]
		start, size, err := roi.Region(s.Tensor.Shape)
		if err != nil { // checked at open for every sample
			panic(fmt.Sprintf("sample %d: region checked at open: %v", si, err))
		}
		rb.shapes = append(rb.shapes, size)
		rs := roiSample{pos: i, n: regionBytes(s.Tensor, size), dtype: s.Tensor.DType, repeatOf: -1, denied: b.deniedAt(i) != nil}
		switch {
		case rs.denied: // nothing of its region counts: not its shape, not its size
			rs.n = 0
		case first < 0:
			first, row = i, rs.n
		case !slices.Equal(size, rb.shapes[first]) || s.Tensor.DType != l.m.Samples[idx[first]].Tensor.DType:
			dense = false
		}
		if i > 0 && si == idx[i-1] {
			rs.repeatOf = rb.samples[i-1].pos
			if rb.samples[i-1].repeatOf >= 0 {
				rs.repeatOf = rb.samples[i-1].repeatOf
			}
		} else if !rs.denied {
			var inside bool
			rs.runs, inside = regionRuns(nil, s.Tensor.Shape, start, size, int64(s.Tensor.DType.ItemSize()))
			rs.pad = !inside
			rs.reads = coalesce(nil, rs.runs)
			for _, r := range rs.reads {
				phase := (s.Offset + r.a) % backend.Align
				scratch += backend.AlignUp(phase + r.z - r.a)
			}
		}
		rb.samples = append(rb.samples, rs)
	}
	dense = dense && row > 0 && l.desc.PacksAt(len(idx), row, 0)
	if int64(len(rb.scratch)) < scratch {
		rb.raw = make([]byte, scratch+backend.Align)
		a := int64(uintptr(unsafe.Pointer(unsafe.SliceData(rb.raw))))
		off := int(backend.AlignUp(a) - a)
		rb.scratch = rb.raw[off : off+int(scratch)]
	}
	var off, so int64
	p := batchmem.Placement{Rows: len(idx), Row: row}
	b.repeats = b.repeats[:0]
	for i, si := range idx {
		s := &l.m.Samples[si]
		rs := &rb.samples[i]
		if rs.denied && dense {
			rs.n = row // its row, zeroed
		}
		b.Labels = append(b.Labels, s.Label)
		b.Lengths = append(b.Lengths, rs.n)
		if dense {
			rs.room = p.DevOffset(i)
			b.Offsets = append(b.Offsets, b.base+rs.room)
			if rs.repeatOf >= 0 {
				b.repeats = append(b.repeats, batchmem.Repeat{Row: i, Of: rs.repeatOf})
				continue
			}
		} else {
			if rs.repeatOf >= 0 {
				rs.room = rb.samples[rs.repeatOf].room
				b.Offsets = append(b.Offsets, b.base+rs.room)
				continue
			}
			rs.room = off
			b.Offsets = append(b.Offsets, b.base+off)
			off += backend.AlignUp(rs.n)
		}
		rs.req = len(b.reqs)
		if rs.denied { // one request, not read, that fails the sample
			b.reqs = append(b.reqs, backend.Request{Index: int(si), Sample: s, Err: b.deniedAt(i)})
			continue
		}
		for _, r := range rs.reads {
			part := *s
			part.Offset, part.Size = s.Offset+r.a, r.z-r.a
			phase := part.Offset % backend.Align
			n := backend.AlignUp(phase + part.Size)
			b.reqs = append(b.reqs, backend.Request{Index: int(si), Sample: &part, Whole: s, At: phase, Buf: rb.scratch[so : so+n : so+n]})
			so += n
		}
	}
	if dense {
		p.Repeats = b.repeats
		b.place = p
	} else {
		b.place = batchmem.Ragged(off)
	}
}

// packROI copies each region's runs from the reads' rooms to the packed region.
// Cells outside the array get the fill value; a failed sample gets zeros.
func (l *Loader) packROI(b *Batch) {
	rb := &b.roi
	for i := range rb.samples {
		rs := &rb.samples[i]
		if rs.repeatOf >= 0 {
			continue
		}
		dst := b.mem[rs.room : rs.room+rs.n]
		failed := rs.denied
		for k := range rs.reads {
			if b.reqs[rs.req+k].Err != nil {
				failed = true
			}
		}
		if failed {
			clear(dst)
			continue
		}
		if rs.pad {
			fill(dst, rs.dtype, float32(l.opts.ROI.FillValue))
		}
		k := 0
		for _, run := range rs.runs {
			for rs.reads[k].z < run.src+run.n {
				k++
			}
			r := &b.reqs[rs.req+k]
			from := r.At + run.src - rs.reads[k].a
			copy(dst[run.dst:run.dst+run.n], r.Buf[from:from+run.n])
		}
	}
}

// fill fills dst with v converted to dtype as DALI's ConvertSat does.
// Integers round half away from zero and saturate; half floats round to even.
func fill(dst []byte, dt npy.DType, v float32) {
	item := dt.ItemSize()
	cell := make([]byte, item)
	f := float64(v)
	le := binary.LittleEndian
	switch dt {
	case npy.Float16:
		le.PutUint16(cell, toFloat16(v))
	case npy.Float32, npy.Complex64:
		le.PutUint32(cell, math.Float32bits(v))
	case npy.Float64, npy.Complex128:
		le.PutUint64(cell, math.Float64bits(f))
	case npy.Bool:
		if v != 0 {
			cell[0] = 1
		}
	default: // integers: rounded half away from zero, saturated (DALI's ConvertSat), little-endian
		r := math.Round(f)
		var u uint64
		if signed := dt == npy.Int8 || dt == npy.Int16 || dt == npy.Int32 || dt == npy.Int64; signed {
			hi := math.Ldexp(1, 8*item-1)
			u = uint64(int64(max(min(r, hi-1), -hi)))
			if item == 8 && r >= hi {
				u = math.MaxInt64
			}
		} else {
			hi := math.Ldexp(1, 8*item)
			u = uint64(max(min(r, hi-1), 0))
			if item == 8 && r >= hi {
				u = math.MaxUint64
			}
		}
		for j := range cell {
			cell[j] = byte(u >> (8 * j))
		}
	}
	for off := 0; off+item <= len(dst); off += item {
		copy(dst[off:off+item], cell)
	}
}

// toFloat16 returns f as an IEEE half's bits, rounded to nearest even.
func toFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	e8 := int(b >> 23 & 0xff)
	man := b & 0x7fffff
	exp := e8 - 127 + 15
	switch {
	case b&0x7fffffff == 0:
		return sign
	case e8 == 0xff:
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp >= 0x1f:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint(14 - exp)
		h := man >> shift
		rem, half := man&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || rem == half && h&1 == 1 {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(exp)<<10 | man>>13
	if rem := man & 0x1fff; rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++
	}
	return sign | uint16(h)
}
