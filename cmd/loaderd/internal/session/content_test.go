// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// copyOf writes 12 files in class folders c0-c2 under a new root, the
// edit applied, and maps them.
func copyOf(t *testing.T, edit func(root string)) *bmap.Map {
	root := t.TempDir()
	for i := range 12 {
		p := filepath.Join(root, fmt.Sprintf("c%d", i%3), fmt.Sprintf("%02d.jpg", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte(i)}, 100+i*10), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit(root)
	return testfs.MapDir(t, root)
}

// openOn opens a session of dataset "d" on ds for c, resuming at st.
func openOn(t *testing.T, ds *bmap.Map, c Caller, st *loader.State) (Opened, error) {
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}, SessionTimeout: time.Minute, MaxLockedBytes: 1 << 30,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() { m.Stop() })
	return m.Open(context.Background(), c, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}, State: st}})
}

// TestResumeOnAnotherCopy: a state carries the dataset's content where
// it was taken; another node's copy of the same files resumes it, and a
// copy that differs is refused, naming the file.
func TestResumeOnAnotherCopy(t *testing.T) {
	me := Caller{UID: os.Getuid(), GID: os.Getgid()}
	o, err := openOn(t, copyOf(t, func(string) {}), me, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Content == nil || o.State.Content == nil || o.Content.Samples != 12 || len(o.Content.Names) != 12 {
		t.Fatalf("open: content %+v, state's %+v", o.Content, o.State.Content)
	}
	grow := func(name string) func(string) {
		return func(root string) {
			f, err := os.OpenFile(filepath.Join(root, name), os.O_APPEND|os.O_WRONLY, 0)
			if err == nil {
				_, err = f.Write([]byte{0})
				f.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	move := func(from, to string) func(string) {
		return func(root string) {
			if err := os.Rename(filepath.Join(root, from), filepath.Join(root, to)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name string
		edit func(root string)
		want string // "" when it resumes
	}{
		{"the same files", func(string) {}, ""},
		{"a file grown", grow("c1/04.jpg"), `this node's first there is "c1/04.jpg" (141 bytes, label 1); the state's first there is "c1/04.jpg" (140 bytes, label 1)`},
		{"a file renamed", move("c1/04.jpg", "c1/04x.jpg"), `this node's first there is "c1/04x.jpg" (140 bytes, label 1)`},
		{"a file relabelled", move("c1/04.jpg", "c2/04.jpg"), `the state's first there is "c1/04.jpg" (140 bytes, label 1)`},
		{"a file less", func(root string) { os.Remove(filepath.Join(root, "c0/00.jpg")) }, "this node's copy has 11 samples, the state's 12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := openOn(t, copyOf(t, tc.edit), me, &o.State)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("the same files refused: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrDisagree) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want ErrDisagree with %q", err, tc.want)
			}
		})
	}
}

// TestContentNamesOnlyReadable: a caller who may not read a chunk's
// first sample gets the digests without names.
func TestContentNamesOnlyReadable(t *testing.T) {
	asRoot(t)
	ds := copyOf(t, func(root string) {
		if err := os.Chmod(filepath.Join(root, "c2/05.jpg"), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	searchable(t, ds.Root)
	nobody := Caller{UID: 65534, GID: 65534}
	o, err := openOn(t, ds, nobody, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Content == nil || len(o.Content.Names) != 0 || o.Content.Len() != 12 {
		t.Fatalf("content for nobody: %+v", o.Content)
	}
	if err := o.Content.Validate(); err != nil {
		t.Fatal(err)
	}
}
