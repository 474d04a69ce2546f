// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
)

// findLinks returns the absolute paths of sample folders and samples reached through a symlink.
// No watch or snapshot sees changes where such links lead; Guard.Linked hands them on.
// Each folder is lstat'ed and read once: no system call per sample.
func findLinks(m *bmap.Map) []string {
	dirs, dirOf := m.Dirs()
	out := map[string]bool{}
	linkNames := make([]map[string]bool, len(dirs)) // per folder: its entries that are symlinks
	for k, d := range dirs {
		if linkedFolder(m.Root, d) {
			out[filepath.Join(m.Root, d)] = true
			continue
		}
		linkNames[k] = symlinksIn(filepath.Join(m.Root, d))
	}
	for i := range m.Samples {
		if names := linkNames[dirOf[i]]; names != nil && names[path.Base(m.Samples[i].Path)] {
			out[filepath.Join(m.Root, m.Samples[i].Path)] = true
		}
	}
	paths := make([]string, 0, len(out))
	for p := range out {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return paths
}

// linkedFolder reports whether a component of folder d (relative to
// root, "." for the root itself) is a symlink.
func linkedFolder(root, d string) bool {
	if d == "." {
		return false
	}
	cur := root
	for _, part := range strings.Split(d, "/") {
		cur = filepath.Join(cur, part)
		var st unix.Stat_t
		if err := unix.Lstat(cur, &st); err != nil {
			return false // gone: an access check as the caller finds it
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return true
		}
	}
	return false
}

// symlinksIn returns the names of dir's entries that are symlinks (nil:
// none, or dir unreadable: its samples fail as the caller's opens find).
func symlinksIn(dir string) map[string]bool {
	f, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer f.Close()
	var names map[string]bool
	for {
		ents, err := f.ReadDir(4096)
		for _, e := range ents {
			if e.Type()&os.ModeSymlink != 0 {
				if names == nil {
					names = map[string]bool{}
				}
				names[e.Name()] = true
			}
		}
		if err == io.EOF || len(ents) == 0 {
			return names
		}
		if err != nil {
			return names
		}
	}
}
