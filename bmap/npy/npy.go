// SPDX-License-Identifier: Apache-2.0

// Package npy decodes the header of NumPy's .npy files, format version 1.0.
// It gives the element type, shape, order and data offset, so data is read in place.
//
// The decoder is strict: it accepts the dict as numpy writes it and nothing else.
// Other input is an error wrapping a sentinel; types outside DType are refused.
// It never panics and allocates at most MaxRank dimensions beyond the header.
package npy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Magic starts every .npy file.
const Magic = "\x93NUMPY"

// prefixLen is the magic, the two version bytes and version 1.0's
// two-byte header length.
const prefixLen = len(Magic) + 2 + 2

// MaxRank is the most dimensions a shape may have (numpy 1.x's
// NPY_MAXDIMS).
const MaxRank = 32

// MaxDataOffset is where the data of a version 1.0 file starts at the
// latest: the prefix and the longest header a two-byte length can give.
const MaxDataOffset = int64(prefixLen + math.MaxUint16)

// Errors wrapped by Parse, Read and Header.CheckFile.
var (
	// ErrNotNpy: the file does not start with the .npy magic.
	ErrNotNpy = errors.New("not a .npy file")
	// ErrVersion: a format version other than 1.0 (2.0 and 3.0 hold
	// headers over 64 KiB or UTF-8 field names).
	ErrVersion = errors.New("unsupported .npy format version")
	// ErrHeader: the header is truncated or not a dict of exactly descr,
	// fortran_order and shape with values of their types.
	ErrHeader = errors.New("malformed .npy header")
	// ErrObject: an array of Python objects (pickled, not plain data).
	ErrObject = errors.New("object dtype")
	// ErrStructured: a structured (record) or void element type.
	ErrStructured = errors.New("structured dtype")
	// ErrBigEndian: multi-byte elements stored big-endian.
	ErrBigEndian = errors.New("big-endian data")
	// ErrDType: any other element type outside the supported set
	// (strings, dates, long double, ...).
	ErrDType = errors.New("unsupported dtype")
	// ErrFortran: a Fortran-order (column-major) array whose bytes are
	// not also its C-order bytes.
	ErrFortran = errors.New("array in Fortran order")
	// ErrSize: the file is not exactly its header and its data.
	ErrSize = errors.New("file size does not match the header")
)

// Header is what a .npy header says of its array.
type Header struct {
	DType        DType   // element type
	Shape        []int64 // dimensions, outermost first; empty for a 0-d array (one element)
	FortranOrder bool    // the data is stored in Fortran (column-major) order
	DataOffset   int64   // offset of the data in the file: the prefix plus the header length
}

// Elems returns the number of elements: the product of the shape (1 for a
// 0-d array). Parse guarantees it, times the item size, fits an int64.
func (h *Header) Elems() int64 {
	n := int64(1)
	for _, d := range h.Shape {
		n *= d
	}
	return n
}

// NBytes returns the size of the array's data in bytes.
func (h *Header) NBytes() int64 { return h.Elems() * int64(h.DType.ItemSize()) }

// COrder reports whether the data is in C order: not Fortran, or at most one dimension over 1.
func (h *Header) COrder() bool {
	if !h.FortranOrder {
		return true
	}
	long := 0
	for _, d := range h.Shape {
		if d > 1 {
			long++
		}
	}
	return long <= 1
}

// CheckFile checks that a file of size bytes holds exactly the header and C-order data.
// It returns ErrSize for missing or extra bytes, ErrFortran for a layout unlike C order.
func (h *Header) CheckFile(size int64) error {
	want := h.DataOffset + h.NBytes()
	if size != want {
		return fmt.Errorf("npy: %w: the file is %d bytes, its %d-byte header and %s data of shape %s make %d",
			ErrSize, size, h.DataOffset, h.DType, FormatShape(h.Shape), want)
	}
	if !h.COrder() {
		return fmt.Errorf("npy: %w: shape %s stored column-major; save it in C order (np.save(f, np.ascontiguousarray(a)))",
			ErrFortran, FormatShape(h.Shape))
	}
	return nil
}

// FormatShape writes a shape as Python writes the tuple: "()", "(3,)",
// "(2, 3)".
func FormatShape(shape []int64) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, d := range shape {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatInt(d, 10))
	}
	if len(shape) == 1 {
		b.WriteByte(',')
	}
	b.WriteByte(')')
	return b.String()
}

// Read reads and parses the header at the start of r.
func Read(r io.ReaderAt) (Header, error) {
	var pre [prefixLen]byte
	n, err := r.ReadAt(pre[:], 0)
	if n < len(pre) {
		if err != nil && err != io.EOF {
			return Header{}, fmt.Errorf("npy: read: %w", err)
		}
		return Header{}, fmt.Errorf("npy: %w: %d bytes, shorter than the %d-byte prefix", ErrNotNpy, n, prefixLen)
	}
	hlen, err := parsePrefix(pre[:])
	if err != nil {
		return Header{}, err
	}
	b := make([]byte, prefixLen+hlen)
	copy(b, pre[:])
	n, err = r.ReadAt(b[prefixLen:], int64(prefixLen))
	if n < hlen {
		if err != nil && err != io.EOF {
			return Header{}, fmt.Errorf("npy: read: %w", err)
		}
		return Header{}, fmt.Errorf("npy: %w: truncated: the header is %d bytes, the file has %d after the prefix", ErrHeader, hlen, n)
	}
	return Parse(b)
}

// parsePrefix checks the magic and the version and returns the header
// length.
func parsePrefix(b []byte) (int, error) {
	if len(b) < len(Magic) || string(b[:len(Magic)]) != Magic {
		return 0, fmt.Errorf("npy: %w: no \\x93NUMPY magic", ErrNotNpy)
	}
	if len(b) < prefixLen {
		return 0, fmt.Errorf("npy: %w: %d bytes, shorter than the %d-byte prefix", ErrNotNpy, len(b), prefixLen)
	}
	switch major, minor := b[6], b[7]; {
	case major == 1 && minor == 0:
	case major == 2 || major == 3:
		return 0, fmt.Errorf("npy: %w: version %d.%d (a header over 64 KiB or UTF-8 field names); only 1.0 is read", ErrVersion, major, minor)
	default:
		return 0, fmt.Errorf("npy: %w: version %d.%d; only 1.0 is read", ErrVersion, major, minor)
	}
	return int(binary.LittleEndian.Uint16(b[8:])), nil
}

// Parse parses the header at the start of b, which holds at least the
// whole header (the data may follow).
func Parse(b []byte) (Header, error) {
	hlen, err := parsePrefix(b)
	if err != nil {
		return Header{}, err
	}
	if len(b)-prefixLen < hlen {
		return Header{}, fmt.Errorf("npy: %w: truncated: the header is %d bytes, %d given", ErrHeader, hlen, len(b)-prefixLen)
	}
	p := parser{s: string(b[prefixLen : prefixLen+hlen])}
	h, err := p.dict()
	if err != nil {
		return Header{}, err
	}
	h.DataOffset = int64(prefixLen + hlen)
	return h, nil
}

// parser reads the header's dict literal.
type parser struct {
	s string
	i int
}

func (p *parser) fail(format string, args ...any) error {
	return fmt.Errorf("npy: %w: at byte %d: %s", ErrHeader, p.i, fmt.Sprintf(format, args...))
}

// ws skips the whitespace Python allows between tokens in brackets.
func (p *parser) ws() {
	for p.i < len(p.s) && strings.IndexByte(" \t\n\r\f", p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *parser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *parser) eat(c byte) bool {
	if p.peek() == c && p.i < len(p.s) {
		p.i++
		return true
	}
	return false
}

// str reads a quoted string without escapes.
func (p *parser) str() (string, error) {
	q := p.peek()
	if q != '\'' && q != '"' {
		return "", p.fail("expected a quoted string")
	}
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return "", p.fail("unterminated string")
	}
	v := p.s[p.i+1 : p.i+1+end]
	if strings.ContainsAny(v, "\\\n\r") {
		return "", p.fail("escape or line break in string %q", v)
	}
	p.i += end + 2
	return v, nil
}

// dict reads the whole header: the dict and trailing whitespace.
func (p *parser) dict() (Header, error) {
	var h Header
	var seen [3]bool
	keys := [3]string{"descr", "fortran_order", "shape"}
	p.ws()
	if !p.eat('{') {
		return h, p.fail("expected '{'")
	}
	p.ws()
	for p.peek() != '}' {
		key, err := p.str()
		if err != nil {
			return h, err
		}
		k := -1
		for j, name := range keys {
			if key == name {
				k = j
			}
		}
		if k < 0 {
			return h, p.fail("unexpected key %q", key)
		}
		if seen[k] {
			return h, p.fail("key %q given twice", key)
		}
		seen[k] = true
		p.ws()
		if !p.eat(':') {
			return h, p.fail("expected ':' after %q", key)
		}
		p.ws()
		switch k {
		case 0:
			err = p.descr(&h)
		case 1:
			err = p.bool(&h.FortranOrder)
		case 2:
			h.Shape, err = p.shape()
		}
		if err != nil {
			return h, err
		}
		p.ws()
		if !p.eat(',') {
			break
		}
		p.ws()
	}
	if !p.eat('}') {
		return h, p.fail("expected ',' or '}'")
	}
	p.ws()
	if p.i != len(p.s) {
		return h, p.fail("unexpected %q after the dict", p.s[p.i:min(len(p.s), p.i+16)])
	}
	for j, ok := range seen {
		if !ok {
			return h, fmt.Errorf("npy: %w: no %q key", ErrHeader, keys[j])
		}
	}
	if n := int64(h.DType.ItemSize()); !fits(h.Shape, n) {
		return h, fmt.Errorf("npy: %w: shape %s of %s is more than %d bytes", ErrHeader, FormatShape(h.Shape), h.DType, int64(math.MaxInt64))
	}
	return h, nil
}

// fits reports whether the product of the shape's dimensions (each
// counted as at least 1) times itemSize fits an int64.
func fits(shape []int64, itemSize int64) bool {
	n := itemSize
	for _, d := range shape {
		d = max(d, 1)
		if n > math.MaxInt64/d {
			return false
		}
		n *= d
	}
	return true
}

func (p *parser) descr(h *Header) error {
	if p.peek() == '[' {
		return fmt.Errorf("npy: %w: a list of fields (a record array); save each field as its own array", ErrStructured)
	}
	s, err := p.str()
	if err != nil {
		return err
	}
	if len(s) < 2 || strings.IndexByte("<>|=", s[0]) < 0 {
		return fmt.Errorf("npy: %w: descr %q (want a byte order <, >, | or = and a type code)", ErrDType, s)
	}
	order, code := s[0], s[1:]
	switch {
	case code[0] == 'O':
		return fmt.Errorf("npy: %w: descr %q holds Python objects, not plain data", ErrObject, s)
	case code[0] == 'V':
		return fmt.Errorf("npy: %w: descr %q (void or record elements)", ErrStructured, s)
	}
	d, ok := dtypeOfCode(code)
	if !ok {
		return fmt.Errorf("npy: %w: descr %q (supported: bool, int8-64, uint8-64, float16/32/64, complex64/128)", ErrDType, s)
	}
	if d.ItemSize() > 1 {
		switch order {
		case '>':
			return fmt.Errorf("npy: %w: descr %q; convert it with a.astype(a.dtype.newbyteorder('<'))", ErrBigEndian, s)
		case '|':
			return fmt.Errorf("npy: %w: descr %q: no byte order for a %d-byte type", ErrDType, s, d.ItemSize())
		}
	}
	h.DType = d
	return nil
}

func (p *parser) bool(v *bool) error {
	switch {
	case strings.HasPrefix(p.s[p.i:], "True"):
		*v, p.i = true, p.i+4
	case strings.HasPrefix(p.s[p.i:], "False"):
		*v, p.i = false, p.i+5
	default:
		return p.fail("fortran_order is not True or False")
	}
	if c := p.peek(); c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
		return p.fail("fortran_order is not True or False")
	}
	return nil
}

// shape reads a tuple of decimal integers: "()", "(3,)", "(2, 3)".
func (p *parser) shape() ([]int64, error) {
	if !p.eat('(') {
		return nil, p.fail("shape is not a tuple")
	}
	p.ws()
	shape := []int64{}
	comma := false
	for !p.eat(')') {
		if len(shape) == MaxRank {
			return nil, fmt.Errorf("npy: %w: shape has more than %d dimensions", ErrHeader, MaxRank)
		}
		d, err := p.uint()
		if err != nil {
			return nil, err
		}
		shape = append(shape, d)
		p.ws()
		comma = p.eat(',')
		p.ws()
		if !comma && p.peek() != ')' {
			return nil, p.fail("expected ',' or ')' in shape")
		}
	}
	if len(shape) == 1 && !comma {
		return nil, p.fail("shape (%d) is a number, not a tuple: (%d,)", shape[0], shape[0])
	}
	return shape, nil
}

// uint reads a decimal integer as Python writes it: no sign, no leading
// zeros, no underscores.
func (p *parser) uint() (int64, error) {
	start := p.i
	for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
		p.i++
	}
	digits := p.s[start:p.i]
	if digits == "" {
		return 0, p.fail("expected a dimension (a non-negative integer)")
	}
	if len(digits) > 1 && digits[0] == '0' {
		return 0, p.fail("dimension %q has a leading zero", digits)
	}
	if c := p.peek(); c == '_' || c == '.' || c == 'e' || c == 'E' || c == 'j' || c == 'x' || c == 'L' {
		return 0, p.fail("dimension is not a decimal integer")
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, p.fail("dimension %s does not fit 64 bits", digits)
	}
	return v, nil
}

// growthDigits is numpy's GROWTH_AXIS_MAX_DIGITS: spaces left after the
// dict so that the growing axis can be rewritten in place.
const growthDigits = 21

// Encode returns the version 1.0 prefix and header np.save writes for h's type, shape and order.
// It fails for an invalid type, a shape Parse refuses, or a header over 64 KiB.
func Encode(h Header) ([]byte, error) {
	if !h.DType.Valid() {
		return nil, fmt.Errorf("npy: %w: %v", ErrDType, h.DType)
	}
	if len(h.Shape) > MaxRank {
		return nil, fmt.Errorf("npy: %w: shape has more than %d dimensions", ErrHeader, MaxRank)
	}
	for _, d := range h.Shape {
		if d < 0 {
			return nil, fmt.Errorf("npy: %w: negative dimension in %s", ErrHeader, FormatShape(h.Shape))
		}
	}
	if !fits(h.Shape, int64(h.DType.ItemSize())) {
		return nil, fmt.Errorf("npy: %w: shape %s too large", ErrHeader, FormatShape(h.Shape))
	}
	order := "False"
	if h.FortranOrder {
		order = "True"
	}
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", h.DType.Descr(), order, FormatShape(h.Shape))
	if n := len(h.Shape); n > 0 {
		axis := h.Shape[0]
		if h.FortranOrder {
			axis = h.Shape[n-1]
		}
		dict += strings.Repeat(" ", max(0, growthDigits-len(strconv.FormatInt(axis, 10))))
	}
	hlen := len(dict) + 1
	pad := 64 - (prefixLen+hlen)%64 // 1 to 64, as numpy pads
	if hlen+pad > math.MaxUint16 {
		return nil, fmt.Errorf("npy: %w: header of %d bytes needs format version 2.0", ErrVersion, hlen+pad)
	}
	b := make([]byte, 0, prefixLen+hlen+pad)
	b = append(b, Magic...)
	b = append(b, 1, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(hlen+pad))
	b = append(b, dict...)
	for range pad {
		b = append(b, ' ')
	}
	return append(b, '\n'), nil
}
