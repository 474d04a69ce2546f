// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap/npy"
)

// npyFile returns an .npy file as np.save writes it: the header for
// dtype and shape, then data bytes (a pattern when data is nil).
func npyFile(t testing.TB, dt npy.DType, shape []int64, fortran bool, data []byte) []byte {
	t.Helper()
	h := npy.Header{DType: dt, Shape: shape, FortranOrder: fortran}
	b, err := npy.Encode(h)
	if err != nil {
		t.Fatal(err)
	}
	if data == nil {
		h.DataOffset = int64(len(b))
		data = make([]byte, h.NBytes())
		for i := range data {
			data[i] = byte(i*7 + 1)
		}
	}
	return append(b, data...)
}

func writeFiles(t testing.TB, root string, files map[string][]byte) {
	t.Helper()
	for p, b := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBuildNumpy(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string][]byte{
		"b.npy":          npyFile(t, npy.Int16, []int64{2, 3}, false, nil),
		"a.npy":          npyFile(t, npy.Int16, []int64{1, 1}, false, nil),
		"s/c.npy":        npyFile(t, npy.Int16, []int64{0, 3}, false, nil),
		"s/d.npy":        npyFile(t, npy.Int16, []int64{5, 1}, false, nil),
		"s/f.npy":        npyFile(t, npy.Int16, []int64{1, 4}, true, nil), // Fortran, laid out as C
		"notes.txt":      []byte("not an array"),
		"s/deep/e.npy":   npyFile(t, npy.Int8, []int64{1}, false, nil), // DALI looks no deeper (nor does the dtype check)
		"big/large.npy":  npyFile(t, npy.Int16, []int64{300, 7}, false, nil),
		"big/.hidden.np": []byte("x"),
	})
	m, err := Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy})
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != 2 || m.Reader != ReaderNumpy || m.Listed || m.Classes != nil {
		t.Errorf("map: version %d reader %v listed %v classes %q", m.Version, m.Reader, m.Listed, m.Classes)
	}
	want := []wantTensor{
		{"a.npy", npy.Int16, []int64{1, 1}}, {"b.npy", npy.Int16, []int64{2, 3}},
		{"big/large.npy", npy.Int16, []int64{300, 7}},
		{"s/c.npy", npy.Int16, []int64{0, 3}}, {"s/d.npy", npy.Int16, []int64{5, 1}}, {"s/f.npy", npy.Int16, []int64{1, 4}},
	}
	checkTensors(t, root, m, want)
	if err := m.Validate(); err != nil {
		t.Error(err)
	}
	if n, err := m.Unmapped(DiscoverOptions{}); err != nil || n != 0 {
		t.Errorf("Unmapped = %d, %v", n, err)
	}
	writeFiles(t, root, map[string][]byte{"s/new.npy": npyFile(t, npy.Int8, []int64{1}, false, nil)})
	if n, err := m.Unmapped(DiscoverOptions{}); err != nil || n != 1 {
		t.Errorf("after adding one: Unmapped = %d, %v", n, err)
	}

	// Other element types, 0-d and empty arrays: one dataset each.
	for _, w := range []struct {
		path  string
		dt    npy.DType
		shape []int64
	}{
		{"0d.npy", npy.Int64, nil}, {"bool.npy", npy.Bool, []int64{5}}, {"c16.npy", npy.Complex128, []int64{300, 7}},
		{"empty.npy", npy.Uint8, []int64{0, 3}}, {"f2.npy", npy.Float16, []int64{3, 1, 2, 1}},
	} {
		root := t.TempDir()
		writeFiles(t, root, map[string][]byte{w.path: npyFile(t, w.dt, w.shape, false, nil)})
		m, err := Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy})
		if err != nil {
			t.Fatal(err)
		}
		checkTensors(t, root, m, []wantTensor{w})
	}
}

// wantTensor is a sample a test expects: its path, type and shape.
type wantTensor struct {
	path  string
	dt    npy.DType
	shape []int64
}

// checkTensors checks m's samples against want: paths, types, shapes and
// where the data lies in the file.
func checkTensors(t *testing.T, root string, m *Map, want []wantTensor) {
	t.Helper()
	if len(m.Samples) != len(want) {
		t.Fatalf("%d samples, want %d: %+v", len(m.Samples), len(want), m.Samples)
	}
	for i, w := range want {
		s := &m.Samples[i]
		file, _ := os.ReadFile(filepath.Join(root, s.Path))
		if s.Path != w.path || s.Tensor == nil || s.Tensor.DType != w.dt || !reflect.DeepEqual(s.Tensor.Shape, w.shape) || s.Label != 0 {
			t.Errorf("sample %d = %s %+v, want %s %v %v", i, s.Path, s.Tensor, w.path, w.dt, w.shape)
			continue
		}
		if s.Offset != 128 || s.FileSize() != int64(len(file)) || s.Size != s.Tensor.NBytes() {
			t.Errorf("%s: offset %d size %d, file %d bytes", s.Path, s.Offset, s.Size, len(file))
		}
	}
}

// TestCheckTensorsMixed: arrays of different dtypes or numbers of
// dimensions in one dataset (discovered or listed) map, but CheckTensors
// refuses them with ErrMixedTensors naming two of them, as
// fn.readers.numpy fails on a batch holding both (bmap/testdata/dali:
// "numpy_files"); shapes of one rank may differ.
func TestCheckTensorsMixed(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string][]byte{
		"a.npy":     npyFile(t, npy.Int32, []int64{2, 3}, false, nil),
		"b.npy":     npyFile(t, npy.Int32, []int64{5, 0}, false, nil),
		"s/f4.npy":  npyFile(t, npy.Float32, []int64{2, 3}, false, nil),
		"s/1d.npy":  npyFile(t, npy.Int32, []int64{6}, false, nil),
		"s/0d.npy":  npyFile(t, npy.Int32, nil, false, nil),
		"s/0d2.npy": npyFile(t, npy.Int32, nil, false, nil),
		"s/x/e.npy": npyFile(t, npy.Int8, []int64{1}, false, nil), // too deep: not a sample
	})
	tests := []struct {
		files []string
		want  []string // in the message; nil: no error
	}{
		{[]string{"a.npy", "b.npy", "a.npy"}, nil},
		{[]string{"s/0d.npy", "s/0d2.npy"}, nil},
		{[]string{"a.npy", "b.npy", "s/f4.npy"}, []string{"a.npy is int32 of shape (2, 3), 2-d", "s/f4.npy is float32 of shape (2, 3), 2-d", "dtypes differ"}},
		{[]string{"a.npy", "s/1d.npy"}, []string{"a.npy is int32", "s/1d.npy is int32 of shape (6,), 1-d", "numbers of dimensions differ"}},
		{[]string{"s/0d.npy", "s/1d.npy"}, []string{"s/0d.npy is int32 of shape (), 0-d", "s/1d.npy", "1-d"}},
	}
	for _, tt := range tests {
		var files []Entry
		for _, f := range tt.files {
			files = append(files, Entry{Path: f})
		}
		m, err := Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy, Files: files})
		if err != nil || len(m.Samples) != len(files) {
			t.Fatalf("%q: %v", tt.files, err)
		}
		err = m.CheckTensors()
		if tt.want == nil {
			if err != nil {
				t.Errorf("%q: %v", tt.files, err)
			}
			continue
		}
		if !errors.Is(err, ErrMixedTensors) || !strings.Contains(err.Error(), root) {
			t.Errorf("%q: err = %v, want ErrMixedTensors naming the root", tt.files, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v\ndoes not say %q", tt.files, err, w)
			}
		}
	}
	m, err := Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CheckTensors(); !errors.Is(err, ErrMixedTensors) || !strings.Contains(err.Error(), "a.npy is int32") || !strings.Contains(err.Error(), "Inconsistent data") {
		t.Errorf("discovered: err = %v, want ErrMixedTensors naming a.npy and DALI's error", err)
	}
	if err := (&Map{Reader: ReaderFile, Samples: []Sample{{Path: "c/a.jpg"}}}).CheckTensors(); err != nil {
		t.Errorf("file map: %v", err)
	}
}

// TestBuildNumpyRefuses: a file that is not a supported version 1.0 array
// in C order with exactly its data fails the build, naming the file and
// wrapping npy's sentinel.
func TestBuildNumpyRefuses(t *testing.T) {
	good := npyFile(t, npy.Int32, []int64{2}, false, nil)
	hdr := func(dict string, data []byte) []byte {
		n := len(dict)
		return append(append([]byte(npy.Magic+"\x01\x00"), byte(n), byte(n>>8)), append([]byte(dict), data...)...)
	}
	tests := []struct {
		name string
		file []byte
		want error
	}{
		{"big-endian", hdr("{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }\n", make([]byte, 8)), npy.ErrBigEndian},
		{"object", hdr("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }\n", make([]byte, 8)), npy.ErrObject},
		{"structured", hdr("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,), }\n", make([]byte, 8)), npy.ErrStructured},
		{"unicode", hdr("{'descr': '<U2', 'fortran_order': False, 'shape': (2,), }\n", make([]byte, 16)), npy.ErrDType},
		{"version 2", append([]byte(npy.Magic+"\x02\x00"), good[8:]...), npy.ErrVersion},
		{"fortran", npyFile(t, npy.Float64, []int64{2, 3}, true, nil), npy.ErrFortran},
		{"trailing bytes", append(good, 0), npy.ErrSize},
		{"truncated data", good[:len(good)-1], npy.ErrSize},
		{"not npy", []byte("GIF89a...."), npy.ErrNotNpy},
		{"empty file", []byte{}, npy.ErrNotNpy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, map[string][]byte{"ok.npy": good, "sub/bad.npy": tt.file})
			_, err := Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy})
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), filepath.Join(root, "sub/bad.npy")) {
				t.Fatalf("err = %v, want %v naming sub/bad.npy", err, tt.want)
			}
		})
	}
}

func TestBuildNoFiles(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string][]byte{"a/b/deep.npy": npyFile(t, npy.Int8, []int64{1}, false, nil), "x.NPY": nil})
	_, err := Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy})
	if !errors.Is(err, ErrNoFiles) || !strings.Contains(err.Error(), `"*.npy"`) || !strings.Contains(err.Error(), "no deeper") {
		t.Errorf("numpy root: err = %v", err)
	}
	_, err = Build(context.Background(), root, BuildOptions{Files: []Entry{}})
	if !errors.Is(err, ErrNoFiles) {
		t.Errorf("empty list: err = %v", err)
	}
	_, err = Build(context.Background(), root, BuildOptions{Reader: 9})
	if err == nil {
		t.Error("unknown reader: no error")
	}
}

func TestBuildListed(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, map[string][]byte{"x/1.jpg": []byte("one"), "2.jpg": []byte("two!"), "x/y/3.npy": npyFile(t, npy.Uint16, []int64{4}, false, nil)})
	list := "x/1.jpg 5\n./2.jpg 0\nx/1.jpg 7\n" + root + "/x/../2.jpg 3\n"
	entries, err := ParseFileList(strings.NewReader(list))
	if err != nil {
		t.Fatal(err)
	}
	m, err := Build(context.Background(), root, BuildOptions{Files: entries})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range m.Samples {
		got = append(got, s.Path+":"+string(rune('0'+s.Label)))
		if s.Tensor != nil || s.Offset != 0 {
			t.Errorf("%s: a tensor in a file map", s.Path)
		}
	}
	if strings.Join(got, " ") != "x/1.jpg:5 2.jpg:0 x/1.jpg:7 2.jpg:3" || !m.Listed || m.Reader != ReaderFile || m.Version != 2 || m.Samples[1].Size != 4 {
		t.Errorf("samples %q, listed %v, reader %v, version %d", got, m.Listed, m.Reader, m.Version)
	}
	entries[2].Label = -4 // the files/labels form may give any label
	if _, err := Build(context.Background(), root, BuildOptions{Files: entries}); err != nil {
		t.Error(err)
	}

	np, err := ParseNumpyFileList(strings.NewReader("x/y/3.npy\n\nx/y/3.npy\n"))
	if err != nil {
		t.Fatal(err)
	}
	m, err = Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy, Files: np})
	if err != nil || len(m.Samples) != 2 || m.Samples[1].Tensor.Shape[0] != 4 || !m.Listed {
		t.Fatalf("numpy list: %+v, %v", m, err)
	}
	if _, err := Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy, Files: []Entry{{Path: "x/y/3.npy", Label: 1}}}); err == nil || !strings.Contains(err.Error(), "no labels") {
		t.Errorf("numpy label: err = %v", err)
	}

	bad, _ := ParseFileList(strings.NewReader("2.jpg 1\n\n../2.jpg 1\n"))
	_, err = Build(context.Background(), root, BuildOptions{Files: bad})
	if !errors.Is(err, ErrFileList) || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "../2.jpg") {
		t.Errorf("escaping path: err = %v, want ErrFileList naming line 3", err)
	}
	_, err = Build(context.Background(), root, BuildOptions{Files: []Entry{{Path: "nope.jpg"}}})
	if err == nil || !strings.Contains(err.Error(), "nope.jpg") {
		t.Errorf("missing file: err = %v", err)
	}
}
