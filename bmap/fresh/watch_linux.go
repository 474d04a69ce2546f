// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// Watcher reports which directories of a dataset changed, with inotify.
// The kernel queues an event inside the changing call, so draining after a read sees it.
// Files with other hard links are checked by stat instead.
// A change to a directory marks everything beneath it; a change to the root marks all.
// A mount or unmount at or beneath the root (mountTable) marks all at that point, once.
type Watcher struct {
	fd     int
	mounts *mountTable

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
	// When each mark above was last made, as the event count gen then
	// (ChangedSince); lost where the watch may no longer see the
	// directory its path leads to (moved, deleted, never watched).
	dirtyAt []uint64 // node: a file in it changed
	movedAt []uint64 // node: the directory itself changed
	allAt   uint64   // the root itself changed, or events were lost
	marks   uint64   // changes no directory's mark tells (markAll): Marks
}

// lost is a mark's time (Watcher.dirtyAt, movedAt, allAt) when the
// watch may no longer see what the path leads to: later than any
// ChangedSince asks about.
const lost = math.MaxUint64

// stamp records that a mark was made at event count gen (a lost mark
// stays lost).
func stamp(at *uint64, gen uint64) {
	if *at != lost {
		*at = gen
	}
}

// stampSelf records a change to a watched directory itself (mask: its
// event's) at event count gen: a change of its attributes (mode, owner,
// ACL, times) keeps the watch on what its path leads to; a move, a
// deletion or a lost watch may not, so the mark is lost for good.
func stampSelf(at *uint64, mask uint32, gen uint64) {
	if mask&^(unix.IN_ATTRIB|unix.IN_ISDIR) == 0 {
		stamp(at, gen)
	} else {
		*at = lost
	}
}

const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_CREATE | unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// NewWatcher watches root and the directories dirs (relative to root, as
// bmap.Map.Dirs gives them: a folder layout's classes; "." for root
// itself; nested ones with every directory between them and root).
// Changed(i) is about dirs[i].
func NewWatcher(root string, dirs []string) (*Watcher, error) {
	mounts, err := openMountTable(root)
	if err != nil {
		return nil, err
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		mounts.close()
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &Watcher{fd: fd, mounts: mounts, nodes: []string{"."}, index: map[string]int{".": 0}, parent: []int{-1},
		of: make([]int, len(dirs)), wdNode: map[int32]int{}, buf: make([]byte, 64<<10)}
	for i, d := range dirs {
		w.of[i] = w.node(path.Clean(d))
	}
	w.dirty, w.moved = make([]bool, len(w.nodes)), make([]bool, len(w.nodes))
	w.dirtyAt, w.movedAt = make([]uint64, len(w.nodes)), make([]uint64, len(w.nodes))
	for n, d := range w.nodes {
		wd, err := unix.InotifyAddWatch(fd, filepath.Join(root, d), watchMask)
		if err != nil { // e.g. ENOSPC (max_user_watches): stat what is beneath instead
			if n == 0 {
				w.allDirty, w.allAt = true, lost
			} else {
				w.moved[n], w.movedAt[n] = true, lost
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
// A mount that came or went at or beneath the root since the last Poll
// is one more event, which marks all.
func (w *Watcher) Poll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mounts.changed() {
		w.markAll()
	}
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
			if mask&unix.IN_Q_OVERFLOW != 0 {
				w.allDirty = true
				w.markAll() // what came after is seen again
				continue
			}
			w.gen++
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
				stampSelf(&w.allAt, mask, w.gen)
			case len(name) == 0:
				w.moved[node] = true
				stampSelf(&w.movedAt[node], mask, w.gen)
			default:
				child := string(name)
				if node != 0 {
					child = w.nodes[node] + "/" + child
				}
				if c, ok := w.index[child]; ok {
					w.moved[c] = true // a watched directory renamed, removed, chmod'ed...
					stampSelf(&w.movedAt[c], mask, w.gen)
				} else {
					w.dirty[node] = true
					stamp(&w.dirtyAt[node], w.gen)
				}
			}
		}
	}
}

// markAll counts one event that may have changed anything (ChangedSince, Marks).
func (w *Watcher) markAll() {
	w.gen++
	w.marks++
	stamp(&w.allAt, w.gen)
}

// Marks returns how many changes Poll has seen that no directory's mark
// tells (a mount beneath the root, lost events): Changed does not show
// them, so what was read while it moved must be checked whole.
func (w *Watcher) Marks() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.marks
}

// watchMountsBeneath watches the mount points at or beneath paths (where
// they lead now) too: a symlink's target (Guard.Linked). It counts as
// an event that marks all.
func (w *Watcher) watchMountsBeneath(paths []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mounts.add(paths)
	w.markAll()
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

// ChangedSince reports for each directory whether it may have changed after gen events.
// all reports that anything may have; changed is then nil.
func (w *Watcher) ChangedSince(gen uint64) (changed []bool, all bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.allAt > gen {
		return nil, true
	}
	since := make([]bool, len(w.nodes)) // node: it or a directory above it moved after gen
	for n := range w.nodes {            // a node's parent comes before it (node)
		since[n] = w.movedAt[n] > gen || (w.parent[n] >= 0 && since[w.parent[n]])
	}
	changed = make([]bool, len(w.of))
	for c, n := range w.of {
		changed[c] = since[n] || w.dirtyAt[n] > gen
	}
	return changed, false
}

// Events returns how many events Poll has taken in so far: a point
// ChangedSince tells the changes after.
func (w *Watcher) Events() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen
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
func (w *Watcher) Close() error { return errors.Join(unix.Close(w.fd), w.mounts.close()) }
