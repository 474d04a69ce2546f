// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// Watcher reports which class directories of a dataset changed, with
// inotify. The kernel queues an event inside the system call that makes
// the change (unlink, rename, truncate, write, chmod…), so after a read
// completes, draining the queue tells whether anything in a class changed
// before that moment. Files with other hard links are out of its sight
// (their changes may come through another directory) and are checked by
// stat instead.
type Watcher struct {
	fd      int
	classes []string

	mu       sync.Mutex
	wdClass  map[int32]int // watch descriptor -> class index, -1 for the root
	dirty    []bool        // class changed (sticky)
	allDirty bool          // queue overflowed or the root changed in a way we cannot attribute
	gen      uint64        // events seen so far
	buf      []byte
}

const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_CREATE | unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// NewWatcher watches root and each class directory under it.
func NewWatcher(root string, classes []string) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &Watcher{fd: fd, classes: classes, wdClass: map[int32]int{}, dirty: make([]bool, len(classes)), buf: make([]byte, 64<<10)}
	add := func(path string, class int) {
		wd, err := unix.InotifyAddWatch(fd, path, watchMask)
		if err != nil { // e.g. ENOSPC (max_user_watches): stat this class instead
			if class < 0 {
				w.allDirty = true
			} else {
				w.dirty[class] = true
			}
			return
		}
		w.wdClass[int32(wd)] = class
	}
	add(root, -1)
	for i, c := range classes {
		add(filepath.Join(root, c), i)
	}
	return w, nil
}

// Poll drains queued events and marks the classes they touch.
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
			class, ok := w.wdClass[wd]
			switch {
			case !ok:
			case class >= 0:
				w.dirty[class] = true
			default: // the root: an event naming a class directory
				if end := slices.Index(name, 0); end >= 0 {
					name = name[:end]
				}
				if i, found := slices.BinarySearch(w.classes, string(name)); found {
					w.dirty[i] = true
				} else if len(name) == 0 {
					// The root itself: moved, deleted, or its mode, owner or
					// ACL changed, which may change who can reach any sample.
					w.allDirty = true
				}
			}
		}
	}
}

// Changed reports whether class c may have changed since the watch began.
func (w *Watcher) Changed(c int32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.allDirty || w.dirty[c]
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
