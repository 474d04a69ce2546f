// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
