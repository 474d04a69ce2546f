// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/nvfeed/nvfeed/bmap/npy"
)

// ErrMixedTensors is returned (wrapped) by Map.CheckTensors for a numpy
// map whose arrays differ in element type or in number of dimensions. DALI's fn.readers.numpy
// fails on any batch holding two of them ("Inconsistent data: All samples
// in the batch must have the same data type", "... number of
// dimensions"), and a dataset's batches have one dtype. Shapes of one
// rank may differ (ragged batches). The message names two such files.
var ErrMixedTensors = errors.New("arrays of different dtypes or numbers of dimensions in one numpy dataset")

// ErrDALIHeader is returned (wrapped) by Build for an .npy file that
// numpy reads but fn.readers.numpy refuses: a header whose data does not
// start at a multiple of 16 bytes ("Error extracting header length"), or
// whose dict is not written as np.save writes it, keys 'descr',
// 'fortran_order', 'shape' in this order, single-quoted ("Expected ...").
// np.save never writes such a header; re-saving the array with it fixes
// the file.
var ErrDALIHeader = errors.New(".npy header fn.readers.numpy cannot parse")

// checkDALIHeader reports whether fn.readers.numpy parses the header of
// r (which npy.Read parsed as h) as numpy does: DALI 2.4's parser reads
// the 2-byte header length, requires 10 + that length to be a multiple of
// 16, then reads the dict in a fixed order: '{', 'descr' with a
// single-quoted value, ',', 'fortran_order', ',', 'shape' and its tuple
// (spaces allowed between tokens). The values themselves npy has checked
// more strictly than DALI does.
func checkDALIHeader(r io.ReaderAt, h npy.Header) error {
	if h.DataOffset%16 != 0 {
		return fmt.Errorf("%w: the data starts at byte %d, not a multiple of 16 (fn.readers.numpy: \"Error extracting header length\"); re-save it with np.save",
			ErrDALIHeader, h.DataOffset)
	}
	const prefix = 10 // magic, version, 2-byte length: version 1.0, as npy.Read checked
	b := make([]byte, h.DataOffset-prefix)
	if _, err := r.ReadAt(b, prefix); err != nil {
		return fmt.Errorf("npy: read: %w", err)
	}
	p := daliHeader{s: string(b)}
	p.spaces()
	if !p.skip("{") || !p.field("descr") || !p.skip("'") {
		return p.fail()
	}
	if p.i < len(p.s) && p.s[p.i] == '>' { // npy takes it for a one-byte type, DALI for none
		return fmt.Errorf("%w: descr %q: fn.readers.numpy refuses the '>' byte order even for one-byte types; save it with np.save",
			npy.ErrBigEndian, h.DType.Descr()[1:])
	}
	end := strings.IndexByte(p.s[p.i:], '\'') // npy allows no escapes in the descr
	if end < 0 {
		return p.fail()
	}
	p.i += end + 1
	p.spaces()
	if !p.skip(",") || !p.field("fortran_order") || !(p.skip("True") || p.skip("False")) {
		return p.fail()
	}
	p.spaces()
	if !p.skip(",") || !p.field("shape") || !p.skip("(") {
		return p.fail()
	}
	return nil // npy parsed the tuple; DALI's reading of it is looser
}

// daliHeader follows DALI's header grammar through a header's text.
type daliHeader struct {
	s string
	i int
}

// spaces skips C isspace characters, as DALI does between tokens.
func (p *daliHeader) spaces() {
	for p.i < len(p.s) && isSpace(p.s[p.i]) {
		p.i++
	}
}

func (p *daliHeader) skip(tok string) bool {
	if strings.HasPrefix(p.s[p.i:], tok) {
		p.i += len(tok)
		return true
	}
	return false
}

// field skips a key, single-quoted, and its colon.
func (p *daliHeader) field(name string) bool {
	p.spaces()
	if !p.skip("'" + name + "'") {
		return false
	}
	p.spaces()
	if !p.skip(":") {
		return false
	}
	p.spaces()
	return true
}

func (p *daliHeader) fail() error {
	got := p.s[p.i:min(len(p.s), p.i+24)]
	return fmt.Errorf("%w: at %q: fn.readers.numpy reads only the dict np.save writes, {'descr': '...', 'fortran_order': ..., 'shape': (...)} "+
		"in this order with single quotes; re-save it with np.save", ErrDALIHeader, got)
}

// CheckTensors returns an error wrapping ErrMixedTensors, naming the
// first sample and the first whose element type or number of dimensions
// differs from it (with theirs), when a numpy map's arrays do not share
// both: fn.readers.numpy fails on any batch holding two such arrays, and
// a dataset's batches carry one dtype. Shapes of one rank may differ. A
// file map, or a numpy map of one kind, gives nil. mkbmap refuses a map
// that fails it; Build and Validate do not check it.
func (m *Map) CheckTensors() error {
	if m.Reader != ReaderNumpy || len(m.Samples) == 0 || m.Samples[0].Tensor == nil {
		return nil
	}
	a := m.Samples[0].Tensor
	for i := 1; i < len(m.Samples); i++ {
		b := m.Samples[i].Tensor
		if b == nil || b.DType == a.DType && len(b.Shape) == len(a.Shape) {
			continue
		}
		what := "dtypes"
		if b.DType == a.DType {
			what = "numbers of dimensions"
		}
		return fmt.Errorf("bmap: %s: %w: %s is %s, %s is %s (%s differ); fn.readers.numpy fails on a batch holding both "+
			"(\"Inconsistent data\"): save the arrays with one dtype and one number of dimensions, or map them as separate datasets",
			m.Root, ErrMixedTensors, m.Samples[0].Path, describeTensor(a), m.Samples[i].Path, describeTensor(b), what)
	}
	return nil
}

// describeTensor says "float32 of shape (2, 3), 2-d".
func describeTensor(t *Tensor) string {
	return fmt.Sprintf("%s of shape %s, %d-d", t.DType, npy.FormatShape(t.Shape), len(t.Shape))
}

// CheckHeaderFd checks that the .npy header of the file open at fd still
// says what tensor sample s was mapped with: its element type, shape, C
// order and data offset. A header rewritten in place keeps the file's
// size: its data must not be served with the map's old layout. The error
// wraps ErrStale (and npy's sentinel when the header no longer parses).
// A sample without a tensor passes.
func (s *Sample) CheckHeaderFd(fd int) error {
	if s.Tensor == nil {
		return nil
	}
	h, err := npy.Read(fdReader(fd))
	if err != nil {
		return fmt.Errorf("bmap: %s: %w: the .npy header changed since mapping: %w", s.Path, ErrStale, err)
	}
	var what string
	switch {
	case h.DataOffset != s.Offset:
		what = fmt.Sprintf("data at offset %d, mapped %d", h.DataOffset, s.Offset)
	case h.DType != s.Tensor.DType:
		what = fmt.Sprintf("dtype %s, mapped %s", h.DType, s.Tensor.DType)
	case !slices.Equal(h.Shape, s.Tensor.Shape) && (len(h.Shape) > 0 || len(s.Tensor.Shape) > 0):
		what = fmt.Sprintf("shape %s, mapped %s", npy.FormatShape(h.Shape), npy.FormatShape(s.Tensor.Shape))
	case !h.COrder():
		what = "Fortran order, mapped C order"
	default:
		return nil
	}
	return fmt.Errorf("bmap: %s: %w: the .npy header changed since mapping: %s", s.Path, ErrStale, what)
}
