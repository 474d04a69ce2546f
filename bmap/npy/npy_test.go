// SPDX-License-Identifier: Apache-2.0

package npy

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// verdict is numpy's reading of one file in testdata/files (numpy.json,
// written by testdata/gen.py).
type verdict struct {
	Size         int64   `json:"size"`
	Loads        bool    `json:"loads"`
	Descr        string  `json:"descr"`
	Shape        []int64 `json:"shape"`
	FortranOrder bool    `json:"fortran_order"`
	Offset       int64   `json:"offset"`
	Error        string  `json:"error"`
	Want         string  `json:"want"`
	NPSave       bool    `json:"np_save"`
}

var sentinels = map[string]error{
	"ErrNotNpy": ErrNotNpy, "ErrVersion": ErrVersion, "ErrHeader": ErrHeader, "ErrObject": ErrObject,
	"ErrStructured": ErrStructured, "ErrBigEndian": ErrBigEndian, "ErrDType": ErrDType,
	"ErrFortran": ErrFortran, "ErrSize": ErrSize,
}

func loadVerdicts(t testing.TB) map[string]verdict {
	b, err := os.ReadFile("testdata/numpy.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Files map[string]verdict `json:"files"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Files) < 40 {
		t.Fatalf("numpy.json lists %d files", len(v.Files))
	}
	return v.Files
}

// readFile parses a file's header and checks the file against it.
func readFile(path string) (Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, err
	}
	defer f.Close()
	h, err := Read(f)
	if err != nil {
		return h, err
	}
	st, err := f.Stat()
	if err != nil {
		return h, err
	}
	return h, h.CheckFile(st.Size())
}

// TestAgainstNumpy reads every file numpy wrote or judged: where numpy
// reads a supported array, the header must say what numpy says (type,
// shape, order, data offset), and np.save's own headers must come out of
// Encode byte for byte; the others must fail with their sentinel.
func TestAgainstNumpy(t *testing.T) {
	for name, v := range loadVerdicts(t) {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata/files", name)
			h, err := readFile(path)
			if v.Want != "" {
				want := sentinels[v.Want]
				if want == nil {
					t.Fatalf("numpy.json: unknown sentinel %q", v.Want)
				}
				if !errors.Is(err, want) {
					t.Fatalf("err = %v, want %s", err, v.Want)
				}
				return
			}
			if !v.Loads {
				t.Fatalf("numpy refuses it (%s) but no sentinel is expected", v.Error)
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.DType.Descr() != v.Descr || !slices.Equal(h.Shape, v.Shape) || h.FortranOrder != v.FortranOrder || h.DataOffset != v.Offset {
				t.Errorf("header = %s %v fortran=%v offset=%d, numpy says %s %v fortran=%v offset=%d",
					h.DType.Descr(), h.Shape, h.FortranOrder, h.DataOffset, v.Descr, v.Shape, v.FortranOrder, v.Offset)
			}
			if h.DataOffset+h.NBytes() != v.Size {
				t.Errorf("offset %d + %d data bytes != file size %d", h.DataOffset, h.NBytes(), v.Size)
			}
			if v.NPSave {
				b, _ := os.ReadFile(path)
				enc, err := Encode(h)
				if err != nil || !bytes.Equal(enc, b[:h.DataOffset]) {
					t.Errorf("Encode = %q, %v\nnp.save wrote %q", enc, err, b[:h.DataOffset])
				}
			}
		})
	}
}

func TestParseTable(t *testing.T) {
	hdr := func(dict string) []byte {
		b := []byte(Magic + "\x01\x00")
		n := len(dict)
		return append(append(b, byte(n), byte(n>>8)), dict...)
	}
	tests := []struct {
		name  string
		in    []byte
		want  error
		shape []int64
		dt    DType
	}{
		{"minimal", hdr("{'descr':'<f4','fortran_order':False,'shape':()}"), nil, []int64{}, Float32},
		{"tabs and newlines", hdr("\t{ 'descr' :\n'|u1' ,\r'fortran_order' : False , 'shape' : ( 3 , 4 , ) , }\n"), nil, []int64{3, 4}, Uint8},
		{"zero dim", hdr("{'descr': '<i8', 'fortran_order': False, 'shape': (0,), }"), nil, []int64{0}, Int64},
		{"empty", nil, ErrNotNpy, nil, 0},
		{"short magic", []byte("\x93NUM"), ErrNotNpy, nil, 0},
		{"prefix only", []byte(Magic + "\x01\x00"), ErrNotNpy, nil, 0},
		{"truncated", hdr("{'descr': '<f4'")[:14], ErrHeader, nil, 0},
		{"empty dict", hdr("{}"), ErrHeader, nil, 0},
		{"duplicate key", hdr("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}"), ErrHeader, nil, 0},
		{"escape", hdr("{'descr': '<f\\x34', 'fortran_order': False, 'shape': ()}"), ErrHeader, nil, 0},
		{"mixed quotes", hdr("{'descr\": '<f4', 'fortran_order': False, 'shape': ()}"), ErrHeader, nil, 0},
		{"TrueX", hdr("{'descr': '<f4', 'fortran_order': Truex, 'shape': ()}"), ErrHeader, nil, 0},
		{"leading zero", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (03,)}"), ErrHeader, nil, 0},
		{"underscore", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (1_0,)}"), ErrHeader, nil, 0},
		{"empty tuple comma", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (,)}"), ErrHeader, nil, 0},
		{"double comma", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (1,,)}"), ErrHeader, nil, 0},
		{"list shape", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': [1]}"), ErrHeader, nil, 0},
		{"dim overflow", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"), ErrHeader, nil, 0},
		{"bytes overflow", hdr("{'descr': '<f8', 'fortran_order': False, 'shape': (1152921504606846976,)}"), ErrHeader, nil, 0},
		{"trailing junk", hdr("{'descr': '<f4', 'fortran_order': False, 'shape': ()} x"), ErrHeader, nil, 0},
		{"no order", hdr("{'descr': 'f4', 'fortran_order': False, 'shape': ()}"), ErrDType, nil, 0},
		{"bar multibyte", hdr("{'descr': '|f4', 'fortran_order': False, 'shape': ()}"), ErrDType, nil, 0},
		{"big endian", hdr("{'descr': '>f8', 'fortran_order': False, 'shape': ()}"), ErrBigEndian, nil, 0},
		{"object", hdr("{'descr': '|O', 'fortran_order': False, 'shape': ()}"), ErrObject, nil, 0},
		{"record", hdr("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': ()}"), ErrStructured, nil, 0},
		{"version 2", append([]byte(Magic+"\x02\x00"), 0, 0, 0, 0), ErrVersion, nil, 0},
		{"version 0", hdr("{}")[:6:6], ErrNotNpy, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := Parse(tt.in)
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("err = %v, want %v", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.DType != tt.dt || !reflect.DeepEqual(h.Shape, tt.shape) || h.DataOffset != int64(len(tt.in)) {
				t.Errorf("got %v %v offset %d, want %v %v offset %d", h.DType, h.Shape, h.DataOffset, tt.dt, tt.shape, len(tt.in))
			}
		})
	}
}

func TestErrorsSayWhat(t *testing.T) {
	_, err := readFile("testdata/files/fortran_2x3.npy")
	if err == nil || !strings.Contains(err.Error(), "ascontiguousarray") || !strings.Contains(err.Error(), "(2, 3)") {
		t.Errorf("fortran: %v", err)
	}
	_, err = readFile("testdata/files/short_data.npy")
	if err == nil || !strings.Contains(err.Error(), "the file is 132 bytes") || !strings.Contains(err.Error(), "make 136") {
		t.Errorf("short: %v", err)
	}
}

func TestDType(t *testing.T) {
	for d := Bool; d < numDTypes; d++ {
		got, err := ParseDType(d.String())
		if err != nil || got != d || d.ItemSize() == 0 || !d.Valid() {
			t.Errorf("%v: ParseDType = %v, %v; size %d", d, got, err, d.ItemSize())
		}
	}
	if DType(0).Valid() || numDTypes.Valid() || DType(0).Descr() != "" || DType(99).String() != "dtype(99)" {
		t.Error("invalid dtypes")
	}
	if _, err := ParseDType("float128"); err == nil {
		t.Error("ParseDType(float128) succeeded")
	}
}

func TestEncodeRefuses(t *testing.T) {
	for _, h := range []Header{
		{DType: 0},
		{DType: Float32, Shape: make([]int64, MaxRank+1)},
		{DType: Float32, Shape: []int64{-1}},
		{DType: Float64, Shape: []int64{1 << 62, 4}},
	} {
		if _, err := Encode(h); err == nil {
			t.Errorf("Encode(%+v) succeeded", h)
		}
	}
}

// FuzzParse: Parse never panics; what it accepts is a supported type and
// a bounded shape whose bytes fit an int64, and Encode of it parses back
// to the same header.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/files/*.npy")
	for _, p := range files {
		b, _ := os.ReadFile(p)
		f.Add(b[:min(len(b), 256)])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Parse(b)
		if err != nil {
			return
		}
		if !h.DType.Valid() || len(h.Shape) > MaxRank || h.DataOffset < int64(prefixLen) || h.DataOffset > MaxDataOffset || h.NBytes() < 0 {
			t.Fatalf("accepted %+v", h)
		}
		for _, d := range h.Shape {
			if d < 0 {
				t.Fatalf("negative dimension in %v", h.Shape)
			}
		}
		enc, err := Encode(h)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", h, err)
		}
		h2, err := Parse(enc)
		if err != nil || h2.DType != h.DType || !slices.Equal(h2.Shape, h.Shape) || h2.FortranOrder != h.FortranOrder || h2.DataOffset != int64(len(enc)) {
			t.Fatalf("round trip: %+v -> %+v, %v", h, h2, err)
		}
	})
}
