// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap/npy"
)

// daliCase is one case of testdata/dali/dali.json: what real DALI
// returned for a file list or a tree of .npy files (gen_dali.py).
type daliCase struct {
	Name    string   `json:"name"`
	Tree    []string `json:"tree"`
	List    string   `json:"list"`
	Filter  string   `json:"filter"`
	Error   string   `json:"error"`
	Kind    string   `json:"error_kind"` // list: DALI refuses the list; empty: no files; read: parsed, then a file failed
	Samples []struct {
		Path  string `json:"path"`
		Label *int32 `json:"label"`
	} `json:"samples"`
}

// daliFiles is one case of dali.json's numpy_files: .npy files and what
// fn.readers.numpy returned for them as one batch.
type daliFiles struct {
	Name    string            `json:"name"`
	Files   map[string][]byte `json:"files"` // base64 in the JSON
	Error   string            `json:"error"`
	Kind    string            `json:"error_kind"` // mixed: dtypes or ranks differ in the batch; read: a file failed
	Samples []struct {
		Path  string  `json:"path"`
		DType string  `json:"dtype"`
		Shape []int64 `json:"shape"`
		Data  []byte  `json:"data"`
	} `json:"samples"`
}

func loadDALI(t *testing.T) (file, numpy, trees []daliCase) {
	b, err := os.ReadFile("testdata/dali/dali.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		File  []daliCase `json:"file_lists"`
		Numpy []daliCase `json:"numpy_lists"`
		Trees []daliCase `json:"numpy_trees"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.File) < 10 || len(d.Numpy) < 3 || len(d.Trees) < 4 {
		t.Fatalf("dali.json: %d, %d, %d cases", len(d.File), len(d.Numpy), len(d.Trees))
	}
	return d.File, d.Numpy, d.Trees
}

// checkList compares a parsed list with DALI's verdict on it.
func checkList(t *testing.T, c daliCase, entries []Entry, err error, labels bool) {
	t.Helper()
	switch c.Kind {
	case "list":
		if !errors.Is(err, ErrFileList) {
			t.Fatalf("DALI refuses the list (%s); err = %v", c.Error, err)
		}
		return
	case "empty":
		if err != nil || entries == nil || len(entries) != 0 {
			t.Fatalf("DALI finds no file; got %d entries (nil: %v), %v", len(entries), entries == nil, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("DALI parses the list (%q); err = %v", c.Error, err)
	}
	if c.Kind == "read" {
		return
	}
	if len(entries) != len(c.Samples) {
		t.Fatalf("%d entries, DALI returns %d samples", len(entries), len(c.Samples))
	}
	for i, s := range c.Samples {
		e := entries[i]
		if e.Path != s.Path || (labels && e.Label != *s.Label) || (!labels && e.Label != 0) {
			t.Errorf("entry %d = %q %d, DALI says %q %v", i, e.Path, e.Label, s.Path, s.Label)
		}
	}
}

// TestFileListsAgainstDALI: ParseFileList reads every list as DALI's
// fn.readers.file(file_list=) does: same paths (verbatim), labels and
// order, and refuses what DALI refuses.
func TestFileListsAgainstDALI(t *testing.T) {
	file, numpy, _ := loadDALI(t)
	for _, c := range file {
		t.Run("file/"+c.Name, func(t *testing.T) {
			entries, err := ParseFileList(strings.NewReader(c.List))
			checkList(t, c, entries, err, true)
		})
	}
	for _, c := range numpy {
		t.Run("numpy/"+c.Name, func(t *testing.T) {
			entries, err := ParseNumpyFileList(strings.NewReader(c.List))
			checkList(t, c, entries, err, false)
		})
	}
}

// TestDiscoverNumpyAgainstDALI: DiscoverNumpy lists a tree as DALI's
// fn.readers.numpy(file_root=, file_filter=) does (DALI's "./name" for a
// file in the root is "name" here).
func TestDiscoverNumpyAgainstDALI(t *testing.T) {
	_, _, trees := loadDALI(t)
	for _, c := range trees {
		t.Run(c.Name+"/"+c.Filter, func(t *testing.T) {
			if c.Error != "" {
				t.Fatalf("DALI failed: %s", c.Error)
			}
			root := t.TempDir()
			mkTree(t, root, c.Tree)
			entries, err := DiscoverNumpy(root, c.Filter)
			if err != nil {
				t.Fatal(err)
			}
			var got, want []string
			for _, e := range entries {
				got = append(got, e.Path)
			}
			for _, s := range c.Samples {
				want = append(want, strings.TrimPrefix(s.Path, "./"))
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("DiscoverNumpy:\n %q\nDALI:\n %q", got, want)
			}
		})
	}
}

// numpyDivergences are the files mkbmap treats otherwise than
// fn.readers.numpy does, on purpose (docs/mkbmap.md): nil means mapped
// though DALI refuses it, else the error it fails with though DALI reads
// it.
var numpyDivergences = map[string]error{
	"fortran order":        npy.ErrFortran, // DALI transposes while reading: no in-place (dense) batch
	"descr |i4":            npy.ErrDType,   // no byte order for a 4-byte type: np.save never writes it
	"bytes after the data": npy.ErrSize,    // np.save never writes them
	"complex64":            nil,            // for numpy and PyTorch consumers
}

// TestNumpyFilesAgainstDALI: Build maps each .npy file of dali.json's
// numpy_files as fn.readers.numpy reads it (the same dtype, shape and data
// bytes), and refuses what DALI refuses (Build, or CheckTensors for files
// that would share a batch with another dtype or number of dimensions:
// ErrMixedTensors); except for numpyDivergences, each exactly as
// documented.
func TestNumpyFilesAgainstDALI(t *testing.T) {
	b, err := os.ReadFile("testdata/dali/dali.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Files []daliFiles `json:"numpy_files"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Files) < 30 {
		t.Fatalf("dali.json: %d numpy_files cases", len(d.Files))
	}
	seen := map[string]bool{}
	for _, c := range d.Files {
		t.Run(c.Name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, c.Files)
			m, err := Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy})
			if err == nil {
				err = m.CheckTensors() // as mkbmap does
			}
			want, diverges := numpyDivergences[c.Name]
			seen[c.Name] = diverges
			switch {
			case diverges && want == nil:
				if c.Error == "" || err != nil {
					t.Fatalf("documented as mapped though DALI refuses it: DALI %q, Build %v", c.Error, err)
				}
				return
			case diverges:
				if c.Error != "" || !errors.Is(err, want) {
					t.Fatalf("documented as refused (%v) though DALI reads it: DALI %q, Build %v", want, c.Error, err)
				}
				return
			case c.Kind == "mixed":
				if !errors.Is(err, ErrMixedTensors) {
					t.Fatalf("DALI: %s; Build: %v, want ErrMixedTensors", c.Error, err)
				}
				return
			case c.Error != "":
				if err == nil || !strings.Contains(err.Error(), filepath.Join(root, "a.npy")) {
					t.Fatalf("DALI: %s; Build: %v, want an error naming a.npy", c.Error, err)
				}
				return
			case err != nil:
				t.Fatalf("DALI reads it; Build: %v", err)
			}
			if len(m.Samples) != len(c.Samples) {
				t.Fatalf("%d samples, DALI %d", len(m.Samples), len(c.Samples))
			}
			for i, w := range c.Samples {
				s := &m.Samples[i]
				shape := s.Tensor.Shape
				if shape == nil {
					shape = []int64{}
				}
				file := c.Files[s.Path]
				if s.Path != strings.TrimPrefix(w.Path, "./") || s.Tensor.DType.Descr() != w.DType || !reflect.DeepEqual(shape, w.Shape) {
					t.Errorf("sample %d: %s %s %v, DALI %s %s %v", i, s.Path, s.Tensor.DType.Descr(), shape, w.Path, w.DType, w.Shape)
				} else if !bytes.Equal(file[s.Offset:s.Offset+s.Size], w.Data) {
					t.Errorf("%s: the data bytes [%d, %d) are not DALI's array", s.Path, s.Offset, s.Offset+s.Size)
				}
			}
		})
	}
	for name := range numpyDivergences {
		if !seen[name] {
			t.Errorf("divergence %q: no such case in dali.json", name)
		}
	}
}

// TestListedPathsAgainstDALI: the listed paths DALI opens name the same
// files as the clean paths a map stores.
func TestListedPathsAgainstDALI(t *testing.T) {
	file, _, _ := loadDALI(t)
	for _, c := range file {
		if c.Name != "dot segments" {
			continue
		}
		root := t.TempDir()
		mkTree(t, root, c.Tree)
		want := []string{"a.jpg", "a.jpg", "s/c.jpg"}
		for i, s := range c.Samples {
			got, err := ListedPath(root, s.Path)
			if err != nil || got != want[i] {
				t.Errorf("ListedPath(%q) = %q, %v; want %q", s.Path, got, err, want[i])
			}
		}
		return
	}
	t.Fatal("no dot segments case")
}

func TestListedPath(t *testing.T) {
	root := t.TempDir()
	out := t.TempDir()
	mkTree(t, root, []string{"a/x.npy", "x.npy", "b/"})
	mkTree(t, out, []string{"sub/", "x.npy"})
	if err := os.Symlink(filepath.Join(out, "sub"), filepath.Join(root, "away")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		in, want, err string
	}{
		{"a/x.npy", "a/x.npy", ""},
		{"./a//x.npy", "a/x.npy", ""},
		{"a/../x.npy", "x.npy", ""},
		{filepath.Join(root, "a/x.npy"), "a/x.npy", ""},
		{"away/x.npy", "away/x.npy", ""}, // a symlinked directory is fine
		{"away/../x.npy", "", "another file"},
		{"../x.npy", "", "out of the dataset root"},
		{"a/../../x.npy", "", "out of the dataset root"},
		{filepath.Join(out, "x.npy"), "", "outside the dataset root"},
		{".", "", "out of the dataset root"},
		{"", "", "empty"},
		{"a/", "", "directory"},
		{"a\x00b", "", "NUL"},
	}
	for _, tt := range tests {
		got, err := ListedPath(root, tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ListedPath(%q) = %q, %v; want an error saying %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ListedPath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestParseFileListLimits(t *testing.T) {
	tests := []struct {
		name, in string
		want     string // error text, or "" for success
		n        int
		label    int32
	}{
		{"largest label", "a 2147483647\n", "", 1, 2147483647},
		{"label past int32", "a 2147483648\n", "32-bit", 0, 0},
		{"leading zeros", "a 007\n", "", 1, 7},
		{"NUL byte", "a\x00b 1\n", "NUL", 0, 0},
		{"no trailing newline", "a 1\nb 2", "", 2, 2},
		{"CRLF", "a 1\r\nb 2\r\n", "", 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			entries, err := ParseFileList(strings.NewReader(tt.in))
			if tt.want != "" {
				if !errors.Is(err, ErrFileList) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "line 1") {
					t.Fatalf("err = %v, want ErrFileList on line 1 saying %q", err, tt.want)
				}
				return
			}
			if err != nil || len(entries) != tt.n || entries[tt.n-1].Label != tt.label || entries[tt.n-1].Line != tt.n {
				t.Fatalf("entries %+v, err %v", entries, err)
			}
		})
	}
}
