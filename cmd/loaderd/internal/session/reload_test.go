// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// jpegs writes n files under root, spread over 3 classes, from index from.
func jpegs(t *testing.T, root string, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		p := filepath.Join(root, fmt.Sprintf("c%d", i%3), fmt.Sprintf("%03d.jpg", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte(i)}, 100+i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// writeMap maps root as it is now into the map file path.
func writeMap(t *testing.T, root, path string) {
	t.Helper()
	if _, err := bmap.WriteFile(path, testfs.MapDir(t, root), bmap.FormatBinary); err != nil {
		t.Fatal(err)
	}
}

// epochBatches reads a session's epoch to its end and returns how many
// batches it had.
func epochBatches(t *testing.T, m *Manager, c Caller, id string) int {
	t.Helper()
	var release []int
	for n := 0; ; n++ {
		d, err := m.Next(context.Background(), c, id, release, nil)
		if err != nil {
			t.Fatalf("session %s: batch %d: %v", id, n, err)
		}
		if d.EndOfEpoch {
			return n
		}
		if len(d.Failed) > 0 {
			t.Fatalf("session %s: batch %d: failed samples %v", id, n, d.Errors)
		}
		release = []int{d.Slot}
	}
}

// TestReload: a reload gives new sessions the new map while a session
// already open goes on with the old one to the end of its epoch; a map
// file that no longer loads keeps the map the dataset had; a dataset no
// longer named is gone for new sessions only.
func TestReload(t *testing.T) {
	root, mapPath := t.TempDir(), filepath.Join(t.TempDir(), "d.bmap")
	jpegs(t, root, 0, 7)
	writeMap(t, root, mapPath)
	first, err := bmap.Load(mapPath)
	if err != nil {
		t.Fatal(err)
	}
	var filesMu sync.Mutex
	files := map[string]string{"d": mapPath}
	var logs testenv.Buffer
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": first}, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		MapFiles: func() (map[string]string, error) {
			filesMu.Lock()
			defer filesMu.Unlock()
			return map[string]string{"d": files["d"]}, nil
		}})
	defer m.Stop()
	root0 := Caller{UID: 0, GID: 0}
	open := func() Opened {
		t.Helper()
		o, err := m.Open(context.Background(), root0, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	old := open()
	if old.EpochBatches != 7 {
		t.Fatalf("before the reload: %d batches, want 7", old.EpochBatches)
	}
	if _, err := m.Next(context.Background(), root0, old.ID, nil, nil); err != nil { // mid-epoch across the reload
		t.Fatal(err)
	}

	jpegs(t, root, 7, 1) // a file added since mapping: counted, not served
	if info := m.Datasets(context.Background(), Caller{}); len(info) != 1 || info[0].Added != 1 || info[0].Samples != 7 {
		t.Errorf("before mkbmap again: %+v, want 7 samples and 1 added", info)
	}
	writeMap(t, root, mapPath)
	tests := []struct {
		name    string
		file    func(t *testing.T)
		outcome string
		want    int // samples new sessions get
	}{
		{"a new map", func(*testing.T) {}, ReloadReplaced, 8},
		{"a broken map keeps the old", func(t *testing.T) {
			if err := os.WriteFile(mapPath, []byte("not a block map"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, ReloadFailed, 8},
		{"a missing map keeps the old", func(*testing.T) {
			filesMu.Lock()
			files["d"] = mapPath + ".gone"
			filesMu.Unlock()
		}, ReloadFailed, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.file(t)
			res, err := m.Reload()
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 1 || res[0].Dataset != "d" || res[0].Outcome != tt.outcome || res[0].Samples != tt.want ||
				(tt.outcome == ReloadFailed) != (res[0].Error != "") {
				t.Fatalf("Reload = %+v, want %s with %d samples", res, tt.outcome, tt.want)
			}
			if tt.outcome == ReloadFailed && !strings.Contains(logs.String(), "map not loaded") {
				t.Errorf("the failed map is not in the log:\n%s", logs.String())
			}
			o := open()
			defer m.Close(root0, o.ID)
			if o.EpochBatches != tt.want {
				t.Errorf("a new session: %d batches, want %d", o.EpochBatches, tt.want)
			}
			if got := epochBatches(t, m, root0, o.ID); got != tt.want {
				t.Errorf("a new session read %d batches, want %d", got, tt.want)
			}
		})
	}
	if info := m.Datasets(context.Background(), Caller{}); info[0].Added != 0 || info[0].Samples != 8 {
		t.Errorf("after the reload: %+v, want 8 samples and none added", info)
	}
	// The session opened before the reloads goes on with its map.
	if got := epochBatches(t, m, root0, old.ID); got != 6 {
		t.Errorf("the session opened before the reload read %d more batches, want 6 (of 7)", got)
	}
	if st, err := m.State(root0, old.ID); err != nil || st.Sampling.N != 7 {
		t.Errorf("the old session's state: %+v %v, want n 7", st, err)
	}

	// A dataset no longer named: new opens get 404, the open session goes on.
	m.cfg.MapFiles = func() (map[string]string, error) { return map[string]string{"e": mapPath + ".gone"}, nil }
	res, err := m.Reload()
	if err != nil || len(res) != 2 || res[0].Dataset != "d" || res[0].Outcome != ReloadRemoved || res[1].Outcome != ReloadFailed {
		t.Fatalf("Reload naming another dataset = %+v, %v", res, err)
	}
	if _, err := m.Open(context.Background(), root0, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}}); !errors.Is(err, ErrNotFound) {
		t.Errorf("open of a removed dataset: %v, want ErrNotFound", err)
	}
	if _, err := m.Next(context.Background(), root0, old.ID, nil, &Position{Epoch: 1, Iteration: 0}); err != nil {
		t.Errorf("the old session after its dataset was removed: %v", err)
	}
}
