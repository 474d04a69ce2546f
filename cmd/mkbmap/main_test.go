// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "--mountpoint is required"},
		{[]string{"--mountpoint", "/nonexistent/x"}, 2, "/nonexistent/x"},
		{[]string{"--mountpoint", "/", "--format", "yaml"}, 2, `unknown format "yaml"`},
		{[]string{"--bogus"}, 2, "bogus"},
		{[]string{"inspect"}, 2, "one map file"},
		{[]string{"--reader", "tfrecord", "--mountpoint", "/"}, 2, `unknown reader "tfrecord"`},
		{[]string{"--mountpoint", "/", "--file-filter", "*.x"}, 2, "--file-filter is fn.readers.numpy's"},
		{[]string{"--reader", "numpy", "--mountpoint", "/", "--filter", "*.x"}, 2, "one --file-filter"},
		{[]string{"--file-list", "l.txt", "--mountpoint", "/", "a.jpg"}, 2, "not both"},
		{[]string{"--file-list", "l.txt", "--filter", "*.x"}, 2, "do not apply to listed files"},
		{[]string{"--mountpoint", "/", "--labels", "1"}, 2, "--labels goes with files"},
		{[]string{"--reader", "numpy", "--mountpoint", "/", "--labels", "1", "a.npy"}, 2, "--labels goes with files"},
		{[]string{"--mountpoint", "/", "--labels", "1,2", "a.jpg"}, 2, "2 labels for 1 files"},
		{[]string{"--mountpoint", "/", "--labels", "x", "a.jpg"}, 2, `label 1 "x"`},
		{[]string{"a.jpg"}, 2, "give the dataset root"},
		{[]string{"--reader", "numpy", "--mountpoint", "/", "--format", "xnvme-json"}, 2, "xnvme-json holds whole files"},
		{[]string{"--file-list", "/nonexistent/list.txt"}, 2, "/nonexistent"},
		{[]string{"inspect", "/nonexistent.bmap"}, 1, "/nonexistent.bmap"},
	}
	for _, tt := range tests {
		code, _, stderr := runCmd(t, tt.args...)
		if code != tt.code || !strings.Contains(stderr, tt.want) {
			t.Errorf("mkbmap %q: exit %d, stderr %q; want exit %d mentioning %q", tt.args, code, stderr, tt.code, tt.want)
		}
		if strings.Contains(stderr, "goroutine") {
			t.Errorf("mkbmap %q printed a stack trace", tt.args)
		}
	}
}

func TestRequireExtentsRefusesAndWritesNothing(t *testing.T) {
	for _, typ := range []string{"btrfs", "tmpfs"} {
		t.Run(typ, func(t *testing.T) {
			fs := testfs.New(t, testfs.Options{Type: typ})
			fs.WriteFile(t, "c/x.jpg", []byte("data"))
			out := filepath.Join(t.TempDir(), "out.bmap")
			code, _, stderr := runCmd(t, "--mountpoint", fs.Dir, "-o", out, "--require-extents")
			if code != 1 || !strings.Contains(stderr, typ) {
				t.Errorf("exit %d, stderr %q: want 1 naming %s", code, stderr, typ)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("output file exists after refusal: %v", err)
			}
			if ents, _ := os.ReadDir(filepath.Dir(out)); len(ents) != 0 {
				t.Errorf("leftover files: %v", ents)
			}
		})
	}
}

// Filesystems without device extents get a filesystem-only map and a
// notice saying so; --verify has nothing to read and says that too.
func TestNoExtentsMapsFilesystemOnly(t *testing.T) {
	for _, typ := range []string{"tmpfs", "btrfs"} {
		t.Run(typ, func(t *testing.T) {
			fs := testfs.New(t, testfs.Options{Type: typ})
			fs.WriteFile(t, "b/1.jpg", bytes.Repeat([]byte("x"), 70_000))
			fs.WriteFile(t, "a/2.jpg", []byte("y"))
			out := filepath.Join(t.TempDir(), "out.bmap")
			code, _, stderr := runCmd(t, "--mountpoint", fs.Dir, "-o", out, "--verify")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			for _, want := range []string{"2 samples", "2 filesystem-only (no device extents: 2)",
				"notice: " + fs.Dir + " is on " + typ, "file backend only", "--require-extents",
				"verify: nothing to read from a device: all 2 samples are filesystem-only"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr %q lacks %q", stderr, want)
				}
			}
			m, err := bmap.Load(out)
			if err != nil {
				t.Fatal(err)
			}
			if !m.FSOnly() || m.Device.FSType != typ || len(m.Samples) != 2 || m.Samples[1].Path != "b/1.jpg" || m.Samples[1].Label != 1 {
				t.Fatalf("map: FSOnly %v, device %+v, samples %+v", m.FSOnly(), m.Device, m.Samples)
			}
			for _, s := range m.Samples {
				if s.Reason != bmap.NoExtents || len(s.Extents) != 0 || s.Inode == 0 || s.Size == 0 {
					t.Errorf("sample %+v: want filesystem-only with identity and no extents", s)
				}
			}
		})
	}
}

// A root without DALI's layout fails, saying what layout it wants and
// what it found, and writes nothing.
func TestLayoutErrors(t *testing.T) {
	tests := []struct {
		name  string
		files []string // relative to the root; a trailing / makes a folder
		want  []string
	}{
		{"empty", nil, []string{"ROOT/CLASS/FILE", "found nothing: no class folder, no file"}},
		{"flat", []string{"a.jpg", "b.JPG", "c.jpg", "d.jpg", "notes.txt"},
			[]string{"ROOT/CLASS/FILE", "no class folder, and 5 files directly in", "4 matching the filters", "a.jpg, b.JPG, c.jpg, … 2 more", "CLASS/a.jpg"}},
		{"no matching files", []string{"cat/notes.txt", "dog/", "x.jpg"},
			[]string{"ROOT/CLASS/FILE", "2 class folders (cat, dog) but no file in them matches the filters *.jpg", "--filter replaces them", "1 file matching the filters directly in the root (x.jpg)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for _, f := range tt.files {
				p := filepath.Join(root, f)
				dir := filepath.Dir(p)
				if strings.HasSuffix(f, "/") {
					dir = p
				}
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if !strings.HasSuffix(f, "/") {
					if err := os.WriteFile(p, []byte("z"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			out := filepath.Join(t.TempDir(), "out.bmap")
			code, _, stderr := runCmd(t, "--mountpoint", root, "-o", out)
			if code != 1 {
				t.Errorf("exit %d, want 1: %s", code, stderr)
			}
			for _, want := range tt.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr %q lacks %q", stderr, want)
				}
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("a map was written: %v", err)
			}
		})
	}
}

// --help prints that command's usage and flags on stdout and exits 0; a
// bad flag prints the usage line on stderr and exits 2.
func TestHelp(t *testing.T) {
	tests := []struct {
		args       []string
		code       int
		out, notIn string // out: in stdout (code 0) or stderr (code 2)
	}{
		{[]string{"--help"}, 0, "-require-extents", "MAPFILE\n"},
		{[]string{"-h"}, 0, "ROOT/CLASS/FILE", ""},
		{[]string{"help"}, 0, "-mountpoint", ""},
		{[]string{"inspect", "--help"}, 0, "usage: mkbmap inspect", "-require-extents"},
		{[]string{"--bogus"}, 2, "mkbmap --help: every flag", "-workers int"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCmd(t, tt.args...)
		got, other := stdout, stderr
		if tt.code != 0 {
			got, other = stderr, stdout
		}
		if code != tt.code || !strings.Contains(got, tt.out) || other != "" && tt.code == 0 {
			t.Errorf("mkbmap %q: exit %d, stdout %q, stderr %q; want exit %d and %q", tt.args, code, stdout, stderr, tt.code, tt.out)
		}
		if tt.notIn != "" && strings.Contains(got, tt.notIn) {
			t.Errorf("mkbmap %q: %q has %q: not this command's usage", tt.args, got, tt.notIn)
		}
	}
}

// --verify draws progress on stderr when it is a terminal, as mapping does.
func TestVerifyProgress(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	for i := range 40 {
		fs.WriteFile(t, fmt.Sprintf("train/c%d/%02d.jpg", i%2, i), bytes.Repeat([]byte{byte(i)}, 9000))
	}
	fs.Sync(t)
	old := isTerminal
	isTerminal = func(io.Writer) bool { return true }
	t.Cleanup(func() { isTerminal = old })
	code, _, stderr := runCmd(t, "--mountpoint", fs.Path("train"), "-o", filepath.Join(t.TempDir(), "m.bmap"), "--verify")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"\rmapping ", "/40, ", "\rverifying ", "verify: 40 raw samples"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q lacks %q", stderr, want)
		}
	}
}

func TestMapInspectConvertVerify(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	fs.WriteFile(t, "train/b/1.jpg", bytes.Repeat([]byte("x"), 70_000))
	fs.WriteFile(t, "train/a/2.JPG", bytes.Repeat([]byte("y"), 5000))
	fs.WriteFile(t, "train/a/tiny.jpg", []byte("z"))
	fs.Sync(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "m.bmap")
	code, _, stderr := runCmd(t, "--mountpoint", fs.Path("train"), "-o", out, "--verify")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"3 samples", "75001 bytes", "1 filesystem-only (inline data: 1)", "samples/s", "verify: 2 raw samples"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("summary %q lacks %q", stderr, want)
		}
	}
	code, stdout, stderr := runCmd(t, "inspect", out)
	if code != 0 || !strings.Contains(stdout, "3 samples") || !strings.Contains(stdout, fs.Dev) {
		t.Errorf("inspect: exit %d, %q %q", code, stdout, stderr)
	}
	code, stdout, _ = runCmd(t, "inspect", "--format", "json", out)
	var j struct {
		Classes []string
		Samples []struct {
			Path  string
			Label int
			Raw   bool
		}
	}
	if err := json.Unmarshal([]byte(stdout), &j); code != 0 || err != nil {
		t.Fatalf("inspect --format json: exit %d, %v", code, err)
	}
	if len(j.Samples) != 3 || j.Samples[0].Path != "a/2.JPG" || j.Samples[2].Label != 1 || j.Classes[1] != "b" {
		t.Errorf("json = %+v", j)
	}
	// xnvme-json out and back in.
	xn := filepath.Join(dir, "x.json")
	if code, _, stderr := runCmd(t, "--mountpoint", fs.Path("train"), "--format", "xnvme-json", "-o", xn); code != 0 || !strings.Contains(stderr, "1 of 3 left out") {
		t.Errorf("xnvme-json: exit %d %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, "inspect", xn); code != 2 || !strings.Contains(stderr, "--mountpoint") {
		t.Errorf("xnvme inspect without root: exit %d %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, "inspect", "--mountpoint", fs.Path("train"), "--verify", xn); code != 0 || !strings.Contains(stderr, "2 match") {
		t.Errorf("xnvme inspect: exit %d %q", code, stderr)
	}
	// A corrupt map is refused with its name, and a failed write keeps the old file.
	b, _ := os.ReadFile(out)
	b[len(b)-1] ^= 1
	bad := filepath.Join(dir, "bad.bmap")
	os.WriteFile(bad, b, 0o644)
	if code, _, stderr := runCmd(t, "inspect", bad); code != 1 || !strings.Contains(stderr, "bad.bmap") || !strings.Contains(stderr, "checksum") {
		t.Errorf("corrupt: exit %d %q", code, stderr)
	}
	if _, err := bmap.Load(out); err != nil {
		t.Errorf("original map damaged: %v", err)
	}
	// Verify catches a changed file.
	os.WriteFile(fs.Path("train/b/1.jpg"), []byte("changed"), 0o644)
	if code, _, stderr := runCmd(t, "inspect", "--verify", out); code != 1 || !strings.Contains(stderr, "b/1.jpg") {
		t.Errorf("verify after change: exit %d %q", code, stderr)
	}
}

// npyFile is a small .npy file as np.save writes it.
func npyFile(t *testing.T, dt npy.DType, shape ...int64) []byte {
	h := npy.Header{DType: dt, Shape: shape}
	b, err := npy.Encode(h)
	if err != nil {
		t.Fatal(err)
	}
	h.DataOffset = int64(len(b))
	return append(b, make([]byte, h.NBytes())...)
}

func writeTree(t *testing.T, root string, files map[string][]byte) {
	for p, b := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNumpyMap: --reader numpy maps the .npy files fn.readers.numpy
// finds, says what arrays they hold, and refuses a file it cannot serve,
// naming it.
func TestNumpyMap(t *testing.T) {
	root := filepath.Join(t.TempDir(), "vol")
	writeTree(t, root, map[string][]byte{
		"b.npy": npyFile(t, npy.Float32, 2, 3), "a.npy": npyFile(t, npy.Float32, 2, 3),
		"s/c.npy": npyFile(t, npy.Float32, 2, 3), "s/d.arr": npyFile(t, npy.Uint8, 7), "notes.txt": []byte("x"),
	})
	dir := t.TempDir()
	out := filepath.Join(dir, "vol.bmap")
	code, _, stderr := runCmd(t, "--reader", "numpy", "--mountpoint", root, "-o", out)
	if code != 0 || !strings.Contains(stderr, "fn.readers.numpy, discovered") || !strings.Contains(stderr, "tensors: 3 float32 (2, 3)") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	code, stdout, _ := runCmd(t, "inspect", out)
	if code != 0 || !strings.Contains(stdout, "reader:  fn.readers.numpy") || !strings.Contains(stdout, "tensors: 3 float32 (2, 3)") {
		t.Errorf("inspect: %s", stdout)
	}
	code, stdout, _ = runCmd(t, "inspect", "--format", "json", out)
	var j struct {
		Version int
		Reader  string
		Samples []struct {
			Path   string
			Size   int64
			Offset int64
			DType  string
			Shape  []int64
		}
	}
	if err := json.Unmarshal([]byte(stdout), &j); code != 0 || err != nil {
		t.Fatalf("json: %v", err)
	}
	if j.Version != 2 || j.Reader != "numpy" || len(j.Samples) != 3 || j.Samples[2].Path != "s/c.npy" || j.Samples[0].Offset != 128 ||
		j.Samples[0].Size != 24 || j.Samples[0].DType != "float32" || len(j.Samples[0].Shape) != 2 {
		t.Errorf("json = %+v", j)
	}
	code, _, stderr = runCmd(t, "--reader", "numpy", "--mountpoint", root, "--file-filter", "*.arr", "-o", out)
	if code != 0 || !strings.Contains(stderr, "tensors: 1 uint8 (7,)") {
		t.Errorf("--file-filter: exit %d: %s", code, stderr)
	}
	code, _, stderr = runCmd(t, "--reader", "numpy", "--mountpoint", root, "--file-filter", "*.none", "-o", out)
	if code != 1 || !strings.Contains(stderr, `no files matching "*.none"`) {
		t.Errorf("nothing found: exit %d: %s", code, stderr)
	}
	writeTree(t, root, map[string][]byte{"s/e.npy": append(npyFile(t, npy.Int8, 3), 0)})
	code, _, stderr = runCmd(t, "--reader", "numpy", "--mountpoint", root, "-o", out)
	if code != 1 || !strings.Contains(stderr, filepath.Join(root, "s/e.npy")) || !strings.Contains(stderr, "file size does not match") {
		t.Errorf("trailing byte: exit %d: %s", code, stderr)
	}
	if m, err := bmap.Load(out); err != nil || len(m.Samples) != 1 {
		t.Errorf("a failed run replaced the map: %v", err)
	}
}

// TestNumpyMixed: arrays of one dtype and rank but several shapes map
// (ragged); a dtype or a number of dimensions that differs is refused,
// naming two files with theirs, as fn.readers.numpy fails on a batch
// holding both.
func TestNumpyMixed(t *testing.T) {
	root := filepath.Join(t.TempDir(), "vol")
	writeTree(t, root, map[string][]byte{
		"a.npy": npyFile(t, npy.Int16, 2, 3), "b.npy": npyFile(t, npy.Int16, 4, 1), "s/c.npy": npyFile(t, npy.Int16, 0, 7),
	})
	out := filepath.Join(t.TempDir(), "vol.bmap")
	code, _, stderr := runCmd(t, "--reader", "numpy", "--mountpoint", root, "-o", out)
	if code != 0 || !strings.Contains(stderr, "tensors: 3 int16 arrays of 3 shapes, 2-d (ragged)") {
		t.Fatalf("ragged: exit %d: %s", code, stderr)
	}
	for name, file := range map[string][]byte{"s/d.npy": npyFile(t, npy.Float32, 2, 3), "s/e.npy": npyFile(t, npy.Int16, 6)} {
		writeTree(t, root, map[string][]byte{name: file})
		code, _, stderr = runCmd(t, "--reader", "numpy", "--mountpoint", root, "-o", out)
		want := []string{"a.npy is int16 of shape (2, 3), 2-d", name, "Inconsistent data"}
		for _, w := range want {
			if code != 1 || !strings.Contains(stderr, w) {
				t.Errorf("%s: exit %d: %s\nwant it to say %q", name, code, stderr, w)
			}
		}
		os.Remove(filepath.Join(root, name))
	}
}

// TestListMaps: --file-list and files given as arguments, for both
// readers, in the order listed with the labels given.
func TestListMaps(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	writeTree(t, root, map[string][]byte{"x/1.jpg": []byte("1"), "2.jpg": []byte("22"), "t/a.npy": npyFile(t, npy.Int16, 5)})
	os.WriteFile(filepath.Join(root, "train.txt"), []byte("x/1.jpg 4\n2.jpg 0\n\nx/1.jpg 9\n"), 0o644)
	os.WriteFile(filepath.Join(root, "np.txt"), []byte("t/a.npy\nt/a.npy\n"), 0o644)
	os.WriteFile(filepath.Join(root, "bad.txt"), []byte("x/1.jpg 4\n2.jpg\n"), 0o644)
	dir := t.TempDir()
	load := func(args ...string) *bmap.Map {
		t.Helper()
		out := filepath.Join(dir, "m.bmap")
		code, _, stderr := runCmd(t, append(args, "-o", out)...)
		if code != 0 {
			t.Fatalf("mkbmap %q: exit %d: %s", args, code, stderr)
		}
		m, err := bmap.Load(out)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	labels := func(m *bmap.Map) (s string) {
		for _, x := range m.Samples {
			s += fmt.Sprintf("%s:%d ", x.Path, x.Label)
		}
		return s
	}
	// The list's folder is the root by default, as DALI's file_root.
	if m := load("--file-list", filepath.Join(root, "train.txt")); labels(m) != "x/1.jpg:4 2.jpg:0 x/1.jpg:9 " || !m.Listed || m.Root != root {
		t.Errorf("file list: %q, listed %v, root %s", labels(m), m.Listed, m.Root)
	}
	if m := load("--mountpoint", root, "x/1.jpg", "2.jpg"); labels(m) != "x/1.jpg:0 2.jpg:1 " {
		t.Errorf("files: %q", labels(m))
	}
	if m := load("--mountpoint", root, "x/1.jpg", "2.jpg", "--labels", "7,-1"); labels(m) != "x/1.jpg:7 2.jpg:-1 " {
		t.Errorf("files and labels: %q", labels(m))
	}
	if m := load("--reader", "numpy", "--file-list", filepath.Join(root, "np.txt")); len(m.Samples) != 2 || m.Samples[1].Tensor.Shape[0] != 5 {
		t.Errorf("numpy list: %+v", m.Samples)
	}
	// fn.readers.numpy(files=): several files, no labels.
	if m := load("--reader", "numpy", "--mountpoint", root, "t/a.npy", "t/a.npy", "./t/a.npy"); labels(m) != "t/a.npy:0 t/a.npy:0 t/a.npy:0 " || !m.Listed {
		t.Errorf("numpy files: %q", labels(m))
	}
	code, _, stderr := runCmd(t, "--file-list", filepath.Join(root, "bad.txt"), "-o", filepath.Join(dir, "bad.bmap"))
	if code != 1 || !strings.Contains(stderr, "bad.txt") || !strings.Contains(stderr, "line 2") {
		t.Errorf("bad list: exit %d: %s", code, stderr)
	}
}
