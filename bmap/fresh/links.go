// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// links records the samples whose path under the root passes through a
// symlink (a class folder or the sample itself a link): the folders
// such a link leads to lie outside the root, where neither the watch of
// the sample folders nor the snapshot of the root's ancestors sees a
// permission change or a rename. Their paths are snapshotted with every
// access verdict (Linked) so that such a change reaches the next open.
type links struct {
	mu    sync.Mutex
	paths map[string]bool // absolute paths, as written under the root
}

// note records sample rel (relative to root) if a component of its path
// under root is a symlink: the sample's folder when the link is a folder
// on the way, the sample itself when it is the link.
func (l *links) note(root, rel string) {
	parts := strings.Split(filepath.Clean(rel), "/")
	cur := root
	for k, part := range parts {
		cur = filepath.Join(cur, part)
		var st unix.Stat_t
		if err := unix.Lstat(cur, &st); err != nil {
			return // gone: the checks as the caller see it
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			p := cur
			if k < len(parts)-1 {
				p = filepath.Join(root, filepath.Dir(filepath.Clean(rel))) // the folder: one snapshot for its samples
			}
			l.mu.Lock()
			if l.paths == nil {
				l.paths = map[string]bool{}
			}
			l.paths[p] = true
			l.mu.Unlock()
			return
		}
	}
}

// list returns the recorded paths, sorted.
func (l *links) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.paths))
	for p := range l.paths {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}
