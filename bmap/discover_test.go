// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// mkTree creates files (content = their name) and directories (trailing
// "/") under root; "a -> b" makes a symlink a pointing to b.
func mkTree(t *testing.T, root string, paths []string) {
	t.Helper()
	for _, p := range paths {
		full := filepath.Join(root, p)
		switch {
		case strings.Contains(p, " -> "):
			from, to, _ := strings.Cut(p, " -> ")
			if err := os.Symlink(to, filepath.Join(root, from)); err != nil {
				t.Fatal(err)
			}
		case strings.HasSuffix(p, "/"):
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, []byte(p), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestDiscoverDALIRules(t *testing.T) {
	tests := []struct {
		name        string
		tree        []string
		opts        DiscoverOptions
		wantClasses []string
		want        []Entry
	}{
		{
			name: "dali semantics",
			tree: []string{
				"root.jpg",           // files in the root are skipped
				"b/Z.JPG", "b/a.jpg", // upper-case extension matches; bytewise 'Z' < 'a'
				"b/x.txt", "b/noext", // non-image files skipped
				"b/nested/", "b/nested/n.jpg", // no recursion
				"b/dir.jpg/",        // a directory named like an image is not a sample
				"B/one.png",         // 'B' sorts before 'a' and 'b' bytewise
				"a/",                // an empty class keeps its label
				"Éclair/crème.JPEG", // non-ASCII names sort by bytes, after ASCII
				"_/u.webp",
				"b/link.jpg -> a.jpg", // symlinks are samples
				"linkclass -> B",      // a symlink to a directory is a class
			},
			wantClasses: []string{"B", "_", "a", "b", "linkclass", "Éclair"},
			want: []Entry{
				{Path: "B/one.png", Label: 0}, {Path: "_/u.webp", Label: 1},
				{Path: "b/Z.JPG", Label: 3}, {Path: "b/a.jpg", Label: 3}, {Path: "b/link.jpg", Label: 3},
				{Path: "linkclass/one.png", Label: 4}, {Path: "Éclair/crème.JPEG", Label: 5},
			},
		},
		{
			name:        "custom filter replaces defaults",
			tree:        []string{"c/a.jpg", "c/b.raw", "c/C.RAW"},
			opts:        DiscoverOptions{Filters: []string{"*.raw"}},
			wantClasses: []string{"c"},
			want:        []Entry{{Path: "c/C.RAW", Label: 0}, {Path: "c/b.raw", Label: 0}},
		},
		{
			name:        "case-sensitive filter",
			tree:        []string{"c/a.jpg", "c/B.JPG"},
			opts:        DiscoverOptions{CaseSensitive: true},
			wantClasses: []string{"c"},
			want:        []Entry{{Path: "c/a.jpg", Label: 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			mkTree(t, root, tt.tree)
			classes, entries, err := Discover(root, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(classes, tt.wantClasses) {
				t.Errorf("classes = %q, want %q", classes, tt.wantClasses)
			}
			if !reflect.DeepEqual(entries, tt.want) {
				t.Errorf("entries = %v, want %v", entries, tt.want)
			}
		})
	}
}

func TestDiscoverErrors(t *testing.T) {
	root := t.TempDir()
	mkTree(t, root, []string{"a/x.jpg", "dangling -> nowhere"})
	_, _, err := Discover(root, DiscoverOptions{})
	if err == nil || !strings.Contains(err.Error(), "dangling") {
		t.Errorf("dangling symlink in root: err = %v, want one naming it (DALI fails here too)", err)
	}
	if _, _, err := Discover(filepath.Join(root, "missing"), DiscoverOptions{}); err == nil {
		t.Error("missing root: no error")
	}
	if _, _, err := Discover(t.TempDir(), DiscoverOptions{Filters: []string{"[bad"}}); err == nil || !strings.Contains(err.Error(), "[bad") {
		t.Errorf("bad filter: err = %v", err)
	}
}

// TestUnmapped: files Discover lists that the map lacks are counted,
// whatever class folder they are in; files the filters skip are not.
func TestUnmapped(t *testing.T) {
	base := []string{"a/1.jpg", "a/2.jpg", "b/1.png", "c1.5/x.jpg", "c1/y.jpg"}
	tests := []struct {
		name  string
		after []string // created after mapping
		rm    []string // removed after mapping
		want  int
	}{
		{name: "unchanged"},
		{name: "one added", after: []string{"a/3.jpg"}, want: 1},
		{name: "a new class", after: []string{"d/1.jpg", "d/2.JPG"}, want: 2},
		{name: "filtered out", after: []string{"a/notes.txt", "root.jpg", "a/sub/"}, want: 0},
		{name: "removed is not added", rm: []string{"a/1.jpg"}, want: 0},
		{name: "replaced by another name", after: []string{"b/2.png"}, rm: []string{"b/1.png"}, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			mkTree(t, root, base)
			classes, entries, err := Discover(root, DiscoverOptions{})
			if err != nil {
				t.Fatal(err)
			}
			m := &Map{Version: Version, Root: root, Classes: classes}
			for _, e := range entries {
				m.Samples = append(m.Samples, Sample{Path: e.Path, Label: e.Label, Reason: NoExtents})
			}
			mkTree(t, root, tt.after)
			for _, p := range tt.rm {
				if err := os.Remove(filepath.Join(root, p)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := m.Unmapped(DiscoverOptions{})
			if err != nil || got != tt.want {
				t.Fatalf("Unmapped = %d, %v; want %d", got, err, tt.want)
			}
			mapped := map[string]bool{}
			for _, s := range m.Samples {
				mapped[s.Path] = true
			}
			_, wantDirs, _ := m.UnmappedIn(DiscoverOptions{})
			counts, n, dirs, err := m.UnmappedInClasses(DiscoverOptions{}, nil, func(string) bool { return true }, func(p string) bool { return mapped[p] })
			if err != nil || n != tt.want || !slices.Equal(dirs, wantDirs) {
				t.Fatalf("UnmappedInClasses = %v, %d, %v, %v; want %d, %v", counts, n, dirs, err, tt.want, wantDirs)
			}
		})
	}
}

// TestUnmappedInClassesKeepsCounts: a class folder relist does not name
// keeps the count it had, whatever it holds now; one it names, or one
// with no count kept, is listed.
func TestUnmappedInClassesKeepsCounts(t *testing.T) {
	root := t.TempDir()
	mkTree(t, root, []string{"a/1.jpg", "b/1.jpg"})
	m := &Map{Version: Version, Root: root, Classes: []string{"a", "b"}, Samples: []Sample{{Path: "a/1.jpg"}, {Path: "b/1.jpg", Label: 1}}}
	mkTree(t, root, []string{"a/2.jpg", "b/2.jpg", "b/3.jpg", "c/1.jpg"})
	mapped := func(p string) bool { return p == "a/1.jpg" || p == "b/1.jpg" }
	counts, n, _, err := m.UnmappedInClasses(DiscoverOptions{}, ClassCounts{"a": 7, "b": 9}, func(c string) bool { return c == "a" }, mapped)
	if err != nil || n != 1+9+1 || counts["a"] != 1 || counts["b"] != 9 || counts["c"] != 1 {
		t.Errorf("a relisted, b kept at 9, c new: %v, %d, %v; want a 1, b 9, c 1: 11", counts, n, err)
	}
}
