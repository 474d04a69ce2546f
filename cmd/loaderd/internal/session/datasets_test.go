// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// TestFilesystemOnlyMap: a map made on a filesystem without device
// extents (every sample NoExtents, no device) registers quietly, without
// a guard; the file backend reads it and a raw backend is refused with
// 400's sentinel, saying why and what to use.
func TestFilesystemOnlyMap(t *testing.T) {
	root := t.TempDir()
	jpegs(t, root, 0, 5)
	ds := testfs.MapDir(t, root)
	ds.Device = extentinfo.Device{FSType: "tmpfs", Major: 0, Minor: 42}
	for i := range ds.Samples {
		ds.Samples[i].Reason = bmap.NoExtents
	}
	var logs testenv.Buffer
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer m.Stop()
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("registration warned:\n%s", logs.String())
	}
	if info := m.Datasets(context.Background(), Caller{}); len(info) != 1 || info[0].FilesystemOnly != 5 || info[0].Fresh != 0 || info[0].Stale != 0 || info[0].Freshness != FreshnessNone {
		t.Errorf("Datasets() = %+v", info)
	}
	root0 := Caller{UID: 0, GID: 0}
	tests := []struct {
		backend string
		want    string // "" opens
	}{
		{"", ""},
		{"file", ""},
		{"gds", "dataset d has no samples readable from a block device (mapped on tmpfs): use backend file"},
		{"bam", "dataset d has no samples readable from a block device (mapped on tmpfs): use backend file"},
	}
	for _, tt := range tests {
		t.Run("backend "+tt.backend, func(t *testing.T) {
			o, err := m.Open(context.Background(), root0, OpenParams{Dataset: "d", Request: loader.Request{Backend: tt.backend, ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}}})
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close(root0, o.ID)
				if got := epochBatches(t, m, root0, o.ID); got != 3 {
					t.Errorf("%d batches, want 3", got)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("open: %v, want ErrInvalid saying %q", err, tt.want)
			}
		})
	}
}

// TestDatasetsCounts: on a real block filesystem, the counts follow the
// files: fresh at registration, stale once changed (at registration, or
// later as the watch sees it), and files added since mapping counted and
// logged at registration.
func TestDatasetsCounts(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	for _, p := range []string{"a/1.jpg", "a/2.jpg", "b/1.jpg", "b/2.jpg"} {
		fs.WriteFile(t, "train/"+p, []byte(strings.Repeat(p, 2000)))
	}
	fs.Sync(t)
	ds, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fs.WriteFile(t, "train/b/3.jpg", []byte("added"))
	fs.WriteFile(t, "train/c/1.png", []byte("added in a new class"))
	fs.WriteFile(t, "train/c/notes.txt", []byte("not a sample"))
	if err := os.Chmod(fs.Path("train", "a/1.jpg"), 0o640); err != nil { // changed before registration
		t.Fatal(err)
	}
	var logs testenv.Buffer
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer m.Stop()
	if !strings.Contains(logs.String(), "2 files added since mapping are not served: run mkbmap again, then loaderd reload") {
		t.Errorf("no warning of the added files at registration:\n%s", logs.String())
	}
	want := DatasetInfo{Name: "d", Readable: true, Listable: true, Samples: 4, Bytes: 4 * 14000, Classes: 2, Fresh: 3, Stale: 1, Added: 2, Freshness: "watch", Reader: "file",
		Fingerprint: ds.Fingerprint()}
	if got := m.Datasets(context.Background(), Caller{}); len(got) != 1 || got[0] != want {
		t.Fatalf("at registration: %+v, want %+v", got, want)
	}
	// Changed after registration: the watch sees it. Counts are kept
	// infoInterval; age them.
	if err := os.Remove(filepath.Join(fs.Path("train"), "b/2.jpg")); err != nil {
		t.Fatal(err)
	}
	d := m.data["d"]
	d.infoAt = d.infoAt.Add(-infoInterval)
	want.Fresh, want.Stale = 2, 2
	if got := m.Datasets(context.Background(), Caller{}); got[0] != want {
		t.Fatalf("after a removal: %+v, want %+v", got[0], want)
	}
}

// TestAddedByTheMapsFilter: images and labels in one folder, mapped apart
// with a file filter (nnU-Net's case_N_x.npy and case_N_y.npy): the
// daemon counts as added only files the map's own filter finds, so
// mapping leaves nothing to warn about and a new image counts once in
// the images' dataset, never in the labels'.
func TestAddedByTheMapsFilter(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	root := fs.Path("nn")
	var files []npyFile
	for i := range 3 {
		files = append(files, npyFile{path: fmt.Sprintf("case_%d_x.npy", i), dtype: npy.Float32, shape: []int64{4}},
			npyFile{path: fmt.Sprintf("case_%d_y.npy", i), dtype: npy.Uint8, shape: []int64{4}})
	}
	writeNpy(t, root, files)
	fs.Sync(t)
	maps := map[string]*bmap.Map{}
	for _, part := range []string{"x", "y"} {
		m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{Reader: bmap.ReaderNumpy,
			DiscoverOptions: bmap.DiscoverOptions{FileFilter: "*_" + part + ".npy"}})
		if err != nil {
			t.Fatal(err)
		}
		maps[part] = m
	}
	var logs testenv.Buffer
	m := NewManager(Config{Datasets: maps, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer m.Stop()
	if strings.Contains(logs.String(), "added since mapping") {
		t.Errorf("a warning of added files right after mapping:\n%s", logs.String())
	}
	added := func() map[string]int {
		got := map[string]int{}
		for _, d := range m.Datasets(context.Background(), Caller{}) {
			got[d.Name] = d.Added
			m.data[d.Name].infoAt = m.data[d.Name].infoAt.Add(-infoInterval) // the next call counts afresh
		}
		return got
	}
	if got := added(); got["x"] != 0 || got["y"] != 0 {
		t.Errorf("right after mapping: added %v, want none", got)
	}
	writeNpy(t, root, []npyFile{{path: "case_3_x.npy", dtype: npy.Float32, shape: []int64{4}}})
	if got := added(); got["x"] != 1 || got["y"] != 0 {
		t.Errorf("one new image: added %v, want x 1, y 0", got)
	}
}
