// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
)

// TestFindLinks: the samples reached through a symlink under the root —
// a folder on the way that is a link (its folder named once), or a
// sample that is a link — and nothing else.
func TestFindLinks(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{"root/plain", "root/mixed", "root/deep/inner", "outside/cls", "outside/files"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"root/plain/a", "root/mixed/b", "outside/cls/c", "outside/cls/d", "outside/files/e", "root/deep/inner/f"} {
		if err := os.WriteFile(filepath.Join(base, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.Symlink(filepath.Join(outside, "cls"), filepath.Join(root, "linked")))            // a class folder that is a link
	must(t, os.Symlink(filepath.Join(outside, "files", "e"), filepath.Join(root, "mixed", "e"))) // a sample that is a link
	must(t, os.Symlink(filepath.Join(root, "deep"), filepath.Join(root, "via")))                 // a link above a folder, inside the root
	m := &bmap.Map{Root: root, Reader: bmap.ReaderNumpy, Samples: []bmap.Sample{
		{Path: "plain/a"}, {Path: "mixed/b"}, {Path: "mixed/e"}, {Path: "linked/c"}, {Path: "linked/d"}, {Path: "via/inner/f"}, {Path: "deep/inner/f"},
	}}
	got := findLinks(m)
	want := []string{filepath.Join(root, "linked"), filepath.Join(root, "mixed", "e"), filepath.Join(root, "via", "inner")}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("findLinks = %q, want %q", got, want)
	}
}
