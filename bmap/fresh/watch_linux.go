// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"encoding/binary"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// Watcher reports which directories of a dataset changed, with inotify.
// The kernel queues an event inside the system call that makes the change
// (unlink, rename, truncate, write, chmod…), so after a read completes,
// draining the queue tells whether anything in a directory changed before
// that moment. Files with other hard links are out of its sight (their
// changes may come through another directory) and are checked by stat
// instead.
//
// It watches the root, each sample directory and every directory between
// them: a change to a file in a directory marks that directory; a change
// to a directory itself (renamed, removed, replaced, its mode or owner
// changed: who may reach what is beneath) marks everything beneath it; a
// change to the root itself marks everything.
type Watcher struct {
	fd int

	mu       sync.Mutex
	nodes    []string       // watched directories relative to the root; nodes[0] is the root, "."
	index    map[string]int // node path -> node
	parent   []int          // node -> its parent node; -1 for the root
	of       []int          // the caller's directory index -> node
	wdNode   map[int32]int  // watch descriptor -> node
	dirty    []bool         // node: a file in it changed (sticky)
	moved    []bool         // node: the directory itself changed: all beneath (sticky)
	allDirty bool           // queue overflowed or the root itself changed
	gen      uint64         // events seen so far
	buf      []byte
}

const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_CREATE | unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// NewWatcher watches root and the directories dirs (relative to root, as
// bmap.Map.Dirs gives them: a folder layout's classes; "." for root
// itself; nested ones with every directory between them and root).
// Changed(i) is about dirs[i].
func NewWatcher(root string, dirs []string) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &Watcher{fd: fd, nodes: []string{"."}, index: map[string]int{".": 0}, parent: []int{-1},
		of: make([]int, len(dirs)), wdNode: map[int32]int{}, buf: make([]byte, 64<<10)}
	for i, d := range dirs {
		w.of[i] = w.node(path.Clean(d))
	}
	w.dirty, w.moved = make([]bool, len(w.nodes)), make([]bool, len(w.nodes))
	for n, d := range w.nodes {
		wd, err := unix.InotifyAddWatch(fd, filepath.Join(root, d), watchMask)
		if err != nil { // e.g. ENOSPC (max_user_watches): stat what is beneath instead
			if n == 0 {
				w.allDirty = true
			} else {
				w.moved[n] = true
			}
			continue
		}
		w.wdNode[int32(wd)] = n
	}
	return w, nil
}

// node returns the node of directory d, adding it and its ancestors.
func (w *Watcher) node(d string) int {
	if n, ok := w.index[d]; ok {
		return n
	}
	p := w.node(path.Dir(d))
	n := len(w.nodes)
	w.nodes, w.parent = append(w.nodes, d), append(w.parent, p)
	w.index[d] = n
	return n
}

// Poll drains queued events and marks the directories they touch.
func (w *Watcher) Poll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		n, err := unix.Read(w.fd, w.buf)
		if err == unix.EINTR {
			continue
		}
		if n <= 0 || err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(w.buf[off:]))
			mask := binary.NativeEndian.Uint32(w.buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(w.buf[off+12:]))
			name := w.buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+nameLen]
			off += unix.SizeofInotifyEvent + nameLen
			w.gen++
			if mask&unix.IN_Q_OVERFLOW != 0 {
				w.allDirty = true
				continue
			}
			node, ok := w.wdNode[wd]
			if !ok {
				continue
			}
			if end := slices.Index(name, 0); end >= 0 {
				name = name[:end]
			}
			switch {
			case len(name) == 0 && node == 0:
				// The root itself: moved, deleted, or its mode, owner or
				// ACL changed, which may change who can reach any sample.
				w.allDirty = true
			case len(name) == 0:
				w.moved[node] = true
			default:
				child := string(name)
				if node != 0 {
					child = w.nodes[node] + "/" + child
				}
				if c, ok := w.index[child]; ok {
					w.moved[c] = true // a watched directory renamed, removed, chmod'ed...
				} else {
					w.dirty[node] = true
				}
			}
		}
	}
}

// Changed reports whether anything of directory dirs[c] may have changed
// since the watch began: a file in it, or it or a directory above it.
func (w *Watcher) Changed(c int32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.allDirty {
		return true
	}
	n := w.of[c]
	if w.dirty[n] {
		return true
	}
	for ; n >= 0; n = w.parent[n] {
		if w.moved[n] {
			return true
		}
	}
	return false
}

// Generation returns how many events Poll has seen: when it moves,
// something under the dataset changed (including the root itself, when
// allDirty).
func (w *Watcher) Generation() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.allDirty {
		w.gen++ // unattributable changes: never reuse what was judged before
	}
	return w.gen
}

// Close stops watching.
func (w *Watcher) Close() error { return unix.Close(w.fd) }
