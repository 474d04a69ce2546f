// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

// TestWatcherChangedSince: what changed after a point is told apart from
// what changed before it: a file changed in b before the point is not
// told, one changed in c after it is (c only); a chmod of a class folder
// is told for that class while later points pass it; a class folder
// renamed away, and the root's own chmod, are told from every earlier
// point, the rename for good.
func TestWatcherChangedSince(t *testing.T) {
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
	want := func(at uint64, changed ...bool) {
		t.Helper()
		w.Poll()
		got, all := w.ChangedSince(at)
		if all || !slices.Equal(got, changed) {
			t.Errorf("changed since %d: %v (all %v), want %v", at, got, all, changed)
		}
	}
	os.Chmod(filepath.Join(root, "b", "x.jpg"), 0o600)
	w.Poll()
	p0 := w.Events()
	want(p0, false, false, false)
	os.WriteFile(filepath.Join(root, "c", "new.jpg"), []byte("n"), 0o644)
	want(p0, false, false, true)
	w.Poll()
	p1 := w.Events()
	want(p1, false, false, false)
	os.Chmod(filepath.Join(root, "a"), 0o700)
	want(p1, true, false, false)
	w.Poll()
	p2 := w.Events()
	want(p2, false, false, false)
	os.Rename(filepath.Join(root, "b"), filepath.Join(root, "b2"))
	w.Poll()
	p3 := w.Events()
	want(p3, false, true, false) // renamed away: its path may lead anywhere from now on
	os.Chmod(root, 0o755)
	w.Poll()
	if _, all := w.ChangedSince(p3); !all {
		t.Errorf("the root chmod'ed: not everything told")
	}
	w.Poll()
	p4 := w.Events()
	want(p4, false, true, false)
}

// TestGuardChangedSince: after a point, a sample changed through a hard
// link outside the dataset (fanotify) and every sample of a class folder
// a file was added to (inotify) are told; nothing is before any change;
// no point is told of before the checking pass, or after the root itself
// changed.
func TestGuardChangedSince(t *testing.T) {
	fs, m, g := linkedGuard(t)
	told := func(s Since) ([]string, bool) {
		var got []string
		ok := g.ChangedSince(s, func(i int) { got = append(got, m.Samples[i].Path) })
		return got, ok
	}
	if got, ok := told(Since{}); ok {
		t.Errorf("the zero point: told %v, want nothing (ok false)", got)
	}
	p := g.Now()
	if got, ok := told(p); !ok || len(got) != 0 {
		t.Errorf("nothing changed: %v, %v; want nothing, ok", got, ok)
	}
	must(t, os.Link(fs.Path("train/a/1.jpg"), fs.Path("outside/link.jpg")))
	must(t, os.Chmod(fs.Path("outside/link.jpg"), 0o600))
	if got, ok := told(p); !ok || !slices.Equal(got, []string{"a/1.jpg"}) {
		t.Errorf("a/1.jpg chmod'ed through an outside link: %v, %v; want [a/1.jpg]", got, ok)
	}
	fs.WriteFile(t, "train/b/new.jpg", []byte("new"))
	if got, ok := told(p); !ok || !slices.Equal(got, []string{"a/1.jpg", "b/0.jpg", "b/1.jpg", "b/2.jpg"}) {
		t.Errorf("a file added to b: %v, %v; want a/1.jpg and b's samples", got, ok)
	}
	q := g.Now()
	if got, ok := told(q); !ok || !slices.Equal(got, []string{"a/1.jpg"}) { // fanotify's marks are for good
		t.Errorf("nothing changed since the later point: %v, %v; want [a/1.jpg]", got, ok)
	}
	must(t, os.Chmod(fs.Path("train"), 0o750))
	if got, ok := told(q); ok {
		t.Errorf("the root chmod'ed: %v, want nothing told (ok false)", got)
	}
}
