// SPDX-License-Identifier: Apache-2.0

package npy

import "fmt"

// DType is an array's element type: a small closed set of numeric types,
// stored little-endian (or, for one-byte types, with no byte order). Its
// values are written in block maps: they never change.
type DType uint8

// The element types. Zero is no type.
const (
	Bool       DType = 1 + iota // numpy bool, one byte, 0 or 1
	Int8                        // numpy int8
	Int16                       // numpy int16
	Int32                       // numpy int32
	Int64                       // numpy int64
	Uint8                       // numpy uint8
	Uint16                      // numpy uint16
	Uint32                      // numpy uint32
	Uint64                      // numpy uint64
	Float16                     // numpy float16 (IEEE half)
	Float32                     // numpy float32
	Float64                     // numpy float64
	Complex64                   // numpy complex64: two float32
	Complex128                  // numpy complex128: two float64
	numDTypes
)

var dtypes = [numDTypes]struct {
	name string
	code string // the descr's type code, after the byte order
	size int
}{
	Bool: {"bool", "b1", 1}, Int8: {"int8", "i1", 1}, Int16: {"int16", "i2", 2}, Int32: {"int32", "i4", 4},
	Int64: {"int64", "i8", 8}, Uint8: {"uint8", "u1", 1}, Uint16: {"uint16", "u2", 2}, Uint32: {"uint32", "u4", 4},
	Uint64: {"uint64", "u8", 8}, Float16: {"float16", "f2", 2}, Float32: {"float32", "f4", 4},
	Float64: {"float64", "f8", 8}, Complex64: {"complex64", "c8", 8}, Complex128: {"complex128", "c16", 16},
}

// Valid reports whether d is one of the element types.
func (d DType) Valid() bool { return d > 0 && d < numDTypes }

// String returns numpy's name of the type ("float32"), as np.dtype
// takes it.
func (d DType) String() string {
	if d.Valid() {
		return dtypes[d].name
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ItemSize returns the size of one element in bytes (0 for an invalid
// type).
func (d DType) ItemSize() int {
	if d.Valid() {
		return dtypes[d].size
	}
	return 0
}

// Descr returns the type as an .npy header's descr writes it: "|" for
// one-byte types, "<" (little-endian) for the others ("<f4").
func (d DType) Descr() string {
	if !d.Valid() {
		return ""
	}
	if dtypes[d].size == 1 {
		return "|" + dtypes[d].code
	}
	return "<" + dtypes[d].code
}

// ParseDType returns the type numpy names name ("float32"), the inverse
// of String.
func ParseDType(name string) (DType, error) {
	for d := Bool; d < numDTypes; d++ {
		if dtypes[d].name == name {
			return d, nil
		}
	}
	return 0, fmt.Errorf("npy: unknown dtype %q", name)
}

// dtypeOfCode returns the type of a descr's type code ("f4").
func dtypeOfCode(code string) (DType, bool) {
	for d := Bool; d < numDTypes; d++ {
		if dtypes[d].code == code {
			return d, true
		}
	}
	return 0, false
}
