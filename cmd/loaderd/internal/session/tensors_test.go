// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// npyFile is one array written as np.save writes it.
type npyFile struct {
	path  string
	dtype npy.DType
	shape []int64
}

// data is the array's bytes: a pattern that differs from file to file.
func (f npyFile) data() []byte {
	n := int64(f.dtype.ItemSize())
	for _, d := range f.shape {
		n *= d
	}
	seed := 0
	for _, c := range []byte(f.path) {
		seed = seed*31 + int(c)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed)
	}
	return b
}

// writeNpy writes the files under root: each an .npy header and its data.
func writeNpy(t *testing.T, root string, files []npyFile) {
	t.Helper()
	for _, f := range files {
		h, err := npy.Encode(npy.Header{DType: f.dtype, Shape: f.shape})
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, append(h, f.data()...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// numpyMap maps root as fn.readers.numpy lists it (filesystem-only here:
// the file backend reads it).
func numpyMap(t *testing.T, root string) *bmap.Map {
	t.Helper()
	m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{Reader: bmap.ReaderNumpy})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestNumpyBatchesCarryTensors: a numpy dataset is listed with its reader
// and dtype, a session on it says its reader, and each batch carries the
// dtype and every sample's shape in batch order (a 0-d array's as an
// empty shape, not nil; an empty array's with its zero), each sample's
// bytes being its file's data range. A file dataset carries none of it.
func TestNumpyBatchesCarryTensors(t *testing.T) {
	root := t.TempDir()
	files := []npyFile{ // in fn.readers.numpy's order: the root's files, then s/
		{"a.npy", npy.Float32, []int64{2, 3}},
		{"b.npy", npy.Float32, []int64{2, 3}},
		{"c.npy", npy.Float32, nil},
		{"d.npy", npy.Float32, []int64{0, 4}},
		{"e.npy", npy.Float32, []int64{7}},
		{"s/f.npy", npy.Float32, []int64{2, 3}},
	}
	writeNpy(t, root, files)
	froot := t.TempDir()
	jpegs(t, froot, 0, 4)
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"np": numpyMap(t, root), "jpg": testfs.MapDir(t, froot)}, Logger: slog.New(slog.DiscardHandler)})
	defer m.Stop()

	info := m.Datasets(context.Background(), Caller{})
	if len(info) != 2 || info[0].Name != "jpg" || info[1].Name != "np" {
		t.Fatalf("Datasets() = %+v", info)
	}
	if info[0].Reader != "file" || info[0].DType != "" {
		t.Errorf("file dataset: reader %q dtype %q, want file and none", info[0].Reader, info[0].DType)
	}
	if info[1].Reader != "numpy" || info[1].DType != "<f4" {
		t.Errorf("numpy dataset: reader %q dtype %q, want numpy and <f4", info[1].Reader, info[1].DType)
	}

	root0 := Caller{UID: 0, GID: 0}
	o, err := m.Open(context.Background(), root0, OpenParams{Dataset: "np", Request: loader.Request{Backend: "file", ReaderArgs: loader.ReaderArgs{BatchSize: 3, NumShards: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(root0, o.ID)
	if o.Reader != "numpy" {
		t.Errorf("open: reader %q, want numpy", o.Reader)
	}
	var got []npyFile
	var release []int
	for {
		d, err := m.Next(context.Background(), root0, o.ID, release, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.EndOfEpoch {
			break
		}
		if len(d.Failed) > 0 {
			t.Errorf("batch %d: failed %v: %v", d.Iteration, d.Failed, d.Errors)
		}
		if d.DType != "<f4" || len(d.Shapes) != len(d.Indices) {
			t.Fatalf("batch %d: dtype %q, %d shapes for %d samples", d.Iteration, d.DType, len(d.Shapes), len(d.Indices))
		}
		m.mu.Lock()
		ss := m.sessions[o.ID]
		m.mu.Unlock()
		ss.heldMu.Lock()
		b := ss.held[d.Slot]
		ss.heldMu.Unlock()
		for i, idx := range d.Indices {
			if d.Shapes[i] == nil {
				t.Errorf("batch %d sample %d: nil shape (msgpack nil, not [])", d.Iteration, i)
			}
			f := files[idx]
			got = append(got, npyFile{f.path, npy.Float32, d.Shapes[i]})
			if want := f.data(); d.Lengths[i] != int64(len(want)) || !bytes.Equal(b.Sample(i), want) {
				t.Errorf("batch %d sample %d (%s): %d bytes %x, want its data: %d bytes %x", d.Iteration, i, f.path,
					d.Lengths[i], b.Sample(i), len(want), want)
			}
		}
		release = []int{d.Slot}
	}
	if len(got) != len(files) {
		t.Fatalf("%d samples in the epoch, want %d", len(got), len(files))
	}
	for i, f := range files {
		if got[i].path != f.path || !slices.Equal(got[i].shape, f.shape) || (f.shape == nil) != (len(got[i].shape) == 0) {
			t.Errorf("sample %d: %s %v, want %s %v", i, got[i].path, got[i].shape, f.path, f.shape)
		}
	}

	fo, err := m.Open(context.Background(), root0, OpenParams{Dataset: "jpg", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(root0, fo.ID)
	d, err := m.Next(context.Background(), root0, fo.ID, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if fo.Reader != "file" || d.DType != "" || d.Shapes != nil {
		t.Errorf("file dataset: reader %q, batch dtype %q shapes %v: want file and none", fo.Reader, d.DType, d.Shapes)
	}
}

// TestNumpyMixedDTypesNotServed: a numpy map whose arrays differ in dtype
// (one a batch cannot carry, and fn.readers.numpy refuses) is listed
// without a dtype, a warning names two files and their dtypes, and a
// session on it is refused with ErrInvalid saying the same.
func TestNumpyMixedDTypesNotServed(t *testing.T) {
	root := t.TempDir()
	writeNpy(t, root, []npyFile{
		{"a.npy", npy.Float32, []int64{4}},
		{"b.npy", npy.Float32, []int64{4}},
		{"c.npy", npy.Int64, []int64{4}},
	})
	var logs testenv.Buffer
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"np": numpyMap(t, root)}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer m.Stop()
	const why = "a.npy is float32, c.npy is int64"
	if !strings.Contains(logs.String(), why) {
		t.Errorf("registration did not warn %q:\n%s", why, logs.String())
	}
	if info := m.Datasets(context.Background(), Caller{}); info[0].Reader != "numpy" || info[0].DType != "" {
		t.Errorf("Datasets() = %+v, want reader numpy and no dtype", info[0])
	}
	_, err := m.Open(context.Background(), Caller{}, OpenParams{Dataset: "np", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "dataset np is not served") || !strings.Contains(err.Error(), why) {
		t.Errorf("open: %v, want ErrInvalid naming %q", err, why)
	}
}
