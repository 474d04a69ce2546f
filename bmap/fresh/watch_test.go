// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

// TestWatcher: a change in a class directory marks that class only, the
// generation moves with every event, and renaming a class marks it.
func TestWatcher(t *testing.T) {
	root := t.TempDir()
	classes := []string{"a", "b", "c"}
	for _, c := range classes {
		os.Mkdir(filepath.Join(root, c), 0o755)
		os.WriteFile(filepath.Join(root, c, "x.jpg"), []byte("x"), 0o644)
	}
	w, err := NewWatcher(root, classes)
	if err != nil {
		testenv.SkipPrivileged(t, "inotify refused here: %v", err)
	}
	defer w.Close()
	w.Poll()
	g0 := w.Generation()
	for i := range classes {
		if w.Changed(int32(i)) {
			t.Fatalf("class %s changed before anything happened", classes[i])
		}
	}
	os.Chmod(filepath.Join(root, "b", "x.jpg"), 0o600)
	w.Poll()
	if !w.Changed(1) || w.Changed(0) || w.Changed(2) {
		t.Errorf("after a chmod in b: changed a=%v b=%v c=%v, want only b", w.Changed(0), w.Changed(1), w.Changed(2))
	}
	g1 := w.Generation()
	if g1 == g0 {
		t.Error("the generation did not move with an event")
	}
	w.Poll()
	if w.Generation() != g1 {
		t.Error("the generation moved without an event")
	}
	os.Rename(filepath.Join(root, "c"), filepath.Join(root, "c2"))
	w.Poll()
	if !w.Changed(2) {
		t.Error("renaming class c away was not seen")
	}
}

// TestWatcherRootChange: a change to the dataset root itself (its mode:
// who may reach any sample) marks every class.
func TestWatcherRootChange(t *testing.T) {
	root := t.TempDir()
	classes := []string{"a", "b"}
	for _, c := range classes {
		os.Mkdir(filepath.Join(root, c), 0o755)
	}
	w, err := NewWatcher(root, classes)
	if err != nil {
		testenv.SkipPrivileged(t, "inotify refused here: %v", err)
	}
	defer w.Close()
	os.WriteFile(filepath.Join(root, "not-a-class.txt"), []byte("x"), 0o644)
	w.Poll()
	if w.Changed(0) || w.Changed(1) {
		t.Fatalf("a file beside the classes marked a class")
	}
	os.Chmod(root, 0o700)
	w.Poll()
	if !w.Changed(0) || !w.Changed(1) {
		t.Errorf("after a chmod of the root: changed a=%v b=%v, want both", w.Changed(0), w.Changed(1))
	}
}

// TestWatcherNested: sample directories at any depth and the root itself
// (a numpy dataset, a file list). A file change marks its own directory
// only; a change to a directory on the way (renamed, chmod'ed) marks
// everything beneath it.
func TestWatcherNested(t *testing.T) {
	root := t.TempDir()
	dirs := []string{".", "a/b", "a/c", "d"}
	for _, d := range dirs {
		os.MkdirAll(filepath.Join(root, d), 0o755)
		os.WriteFile(filepath.Join(root, d, "x.npy"), []byte("x"), 0o644)
	}
	w, err := NewWatcher(root, dirs)
	if err != nil {
		testenv.SkipPrivileged(t, "inotify refused here: %v", err)
	}
	defer w.Close()
	changed := func() (s string) {
		w.Poll()
		for i, d := range dirs {
			if w.Changed(int32(i)) {
				s += d + " "
			}
		}
		return s
	}
	if got := changed(); got != "" {
		t.Fatalf("changed before anything happened: %s", got)
	}
	os.WriteFile(filepath.Join(root, "x.npy"), []byte("y"), 0o644)
	if got := changed(); got != ". " {
		t.Errorf("after a write in the root: changed %q, want only the root's samples", got)
	}
	os.Chmod(filepath.Join(root, "a/c/x.npy"), 0o600)
	if got := changed(); got != ". a/c " {
		t.Errorf("after a chmod in a/c: changed %q", got)
	}
	os.WriteFile(filepath.Join(root, "a", "other.txt"), []byte("z"), 0o644)
	if got := changed(); got != ". a/c " {
		t.Errorf("a file beside the sample directories in a: changed %q", got)
	}
	os.Chmod(filepath.Join(root, "a"), 0o700)
	if got := changed(); got != ". a/b a/c " {
		t.Errorf("after a chmod of a: changed %q, want everything beneath it", got)
	}
	os.Rename(filepath.Join(root, "d"), filepath.Join(root, "d2"))
	if got := changed(); got != ". a/b a/c d " {
		t.Errorf("after renaming d: changed %q", got)
	}
}
