// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
)

// fanWatch is a filesystem-wide fanotify mark on the dataset root's filesystem.
// It sees a change to a sample's inode through any path, a hard link outside included.
// A hash of each event's file handle maps it to samples; a collision costs one more check.
// The kernel queues events inside the changing call, so a Poll after a read sees them.
// A background drain keeps the queue short; after an overflow every sample counts as changed.
type fanWatch struct {
	fd   int
	dev  uint64 // the filesystem's device: samples elsewhere cannot be watched
	root string
	seed maphash.Seed
	log  *slog.Logger

	mu sync.Mutex
	// hashOf[i], under mu, is sample i's handle hash or a mark: unrecorded, noHandle or gone.
	// Each sample is indexed before it is checked, so a later change is attributed to it.
	hashOf    []uint64
	first     map[uint64]int32   // hash -> a sample with it
	dups      map[uint64][]int32 // hashes of more than one sample: all of them
	unwatched int                // samples with noHandle
	pending   bool               // the checking pass is running: Generation moves at every call
	overflow  atomic.Bool        // the queue overflowed: every sample changed
	gen       uint64             // events on samples seen so far
	buf       []byte
	changed   bitset // samples an event named (sticky)

	stop chan struct{}
	done chan struct{}
}

const (
	unrecorded uint64 = 0
	noHandle   uint64 = 1
	gone       uint64 = 2
)

// fanMask is what marks a sample changed: its mode, owner, ACL or link
// count (FAN_ATTRIB), its bytes or size (FAN_MODIFY: write, truncate),
// the inode moved or deleted.
const fanMask = unix.FAN_ATTRIB | unix.FAN_MODIFY | unix.FAN_MOVE_SELF | unix.FAN_DELETE_SELF

// drainEvery is how often the queue is drained while nothing polls.
const drainEvery = time.Second

// newFanWatch marks the filesystem holding root for n samples. It needs
// CAP_SYS_ADMIN and a filesystem that gives file handles; the error says
// which failed.
func newFanWatch(root string, n int, log *slog.Logger) (*fanWatch, error) {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_FID|unix.FAN_NONBLOCK|unix.FAN_CLOEXEC|unix.FAN_UNLIMITED_QUEUE, unix.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("fanotify_init: %w", err)
	}
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, fanMask, unix.AT_FDCWD, root); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fanotify_mark of %s's filesystem: %w", root, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fanotify: %w", err)
	}
	f := &fanWatch{fd: fd, dev: st.Dev, root: root, seed: maphash.MakeSeed(), log: log, pending: true,
		hashOf: make([]uint64, n), changed: newBitset(n), buf: make([]byte, 64<<10),
		first: make(map[uint64]int32, n), dups: map[uint64][]int32{}}
	f.stop, f.done = make(chan struct{}), make(chan struct{})
	go f.drain()
	return f, nil
}

// record notes and indexes sample i's handle from fd, a descriptor of
// its file (any open mode, O_PATH included) on device dev (fd's st_dev,
// which the caller has already stat'ed). Safe for concurrent calls.
func (f *fanWatch) record(i, fd int, dev uint64) {
	f.set(i, f.handleHash(fd, dev))
}

// recordPath records sample rel (relative to the root) by its path,
// following symlinks as the samples' opens do.
func (f *fanWatch) recordPath(i int, rel string) {
	f.set(i, f.pathHash(rel))
}

// pathHash returns the handle hash of the file at rel (relative to the
// root), gone if there is none, noHandle if it cannot be had.
func (f *fanWatch) pathHash(rel string) uint64 {
	fd, err := unix.Open(filepath.Join(f.root, rel), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return gone
		}
		return noHandle
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return noHandle
	}
	return f.handleHash(fd, st.Dev)
}

// set indexes sample i under h in place of what it was indexed under.
func (f *fanWatch) set(i int, h uint64) {
	f.mu.Lock()
	f.remove(int32(i), f.hashOf[i])
	f.hashOf[i] = h
	f.add(int32(i), h)
	f.mu.Unlock()
}

// checked ends the checking pass: from now on Generation moves only with
// events (and once now, so that nothing judged during the pass is reused).
func (f *fanWatch) checked() {
	f.mu.Lock()
	f.pending = false
	f.gen++
	f.mu.Unlock()
}

// handleHash returns the hash of fd's file handle (fd on device dev),
// noHandle if it is on another filesystem or has none.
func (f *fanWatch) handleHash(fd int, dev uint64) uint64 {
	if dev != f.dev {
		return noHandle
	}
	h, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return noHandle
	}
	return f.hash(h.Type(), h.Bytes())
}

// hash hashes a handle; never unrecorded, noHandle or gone.
func (f *fanWatch) hash(typ int32, b []byte) uint64 {
	var m maphash.Hash
	m.SetSeed(f.seed)
	var t [4]byte
	binary.NativeEndian.PutUint32(t[:], uint32(typ))
	m.Write(t[:])
	m.Write(b)
	if h := m.Sum64(); h > gone {
		return h
	}
	return gone + 1
}

// add indexes sample i under h (under mu).
func (f *fanWatch) add(i int32, h uint64) {
	switch h {
	case noHandle:
		f.unwatched++
		f.changed.set(int(i)) // never known unchanged (sticky, as every mark)
		return
	case gone, unrecorded:
		return
	}
	if d, ok := f.dups[h]; ok {
		f.dups[h] = append(d, i)
	} else if j, ok := f.first[h]; ok {
		delete(f.first, h)
		f.dups[h] = []int32{j, i}
	} else {
		f.first[h] = i
	}
}

// remove unindexes sample i, indexed under h (under mu).
func (f *fanWatch) remove(i int32, h uint64) {
	switch h {
	case noHandle:
		f.unwatched--
		return
	case gone, unrecorded:
		return
	}
	if d, ok := f.dups[h]; ok {
		d = slices.DeleteFunc(d, func(j int32) bool { return j == i })
		switch len(d) {
		case 1:
			delete(f.dups, h)
			f.first[h] = d[0]
		case 0:
			delete(f.dups, h)
		default:
			f.dups[h] = d
		}
	} else if f.first[h] == i {
		delete(f.first, h)
	}
}

// reindex records again each sample for which moved reports true (its
// path may now lead to another inode) and indexes what is there now.
func (f *fanWatch) reindex(paths func(i int) string, moved func(i int) bool) {
	for i := range f.hashOf {
		if moved(i) {
			f.recordPath(i, paths(i))
		}
	}
}

// drain polls until Close.
func (f *fanWatch) drain() {
	defer close(f.done)
	t := time.NewTicker(drainEvery)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			f.Poll()
		}
	}
}

// Poll drains queued events without blocking and marks the samples they
// name.
func (f *fanWatch) Poll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		n, err := unix.Read(f.fd, f.buf)
		if err == unix.EINTR {
			continue
		}
		if n <= 0 || err != nil {
			return
		}
		f.events(f.buf[:n])
	}
}

// events takes in a buffer of fanotify events (FAN_REPORT_FID: each
// carries its object's file handle; under mu).
func (f *fanWatch) events(b []byte) {
	const metaLen = int(unsafe.Sizeof(unix.FanotifyEventMetadata{})) // 24
	for off := 0; off+metaLen <= len(b); {
		evLen := int(binary.NativeEndian.Uint32(b[off:]))
		hdrLen := int(binary.NativeEndian.Uint16(b[off+6:]))
		mask := binary.NativeEndian.Uint64(b[off+8:])
		if evLen < metaLen || off+evLen > len(b) {
			return
		}
		ev := b[off : off+evLen]
		off += evLen
		if mask&unix.FAN_Q_OVERFLOW != 0 {
			f.lost("the filesystem-wide watch's queue overflowed")
			continue
		}
		// Info records: header (type u8, pad u8, len u16), fsid (8),
		// file_handle (handle_bytes u32, handle_type i32, bytes).
		for r := hdrLen; r+4 <= len(ev); {
			typ, rLen := ev[r], int(binary.NativeEndian.Uint16(ev[r+2:]))
			if rLen < 4 || r+rLen > len(ev) {
				f.lost("the filesystem-wide watch read an event it could not parse")
				break
			}
			rec := ev[r : r+rLen]
			r += rLen
			if typ != unix.FAN_EVENT_INFO_TYPE_FID || len(rec) < 20 {
				continue
			}
			hb := int(binary.NativeEndian.Uint32(rec[12:]))
			if 20+hb > len(rec) {
				f.lost("the filesystem-wide watch read a file handle it could not parse")
				continue
			}
			f.mark(f.hash(int32(binary.NativeEndian.Uint32(rec[16:])), rec[20:20+hb]))
		}
	}
}

// lost records that a change may have gone unattributed: every sample counts as changed.
// The first time is logged. It runs under mu.
func (f *fanWatch) lost(why string) {
	if !f.overflow.Load() {
		f.log.Warn("fresh: "+why+": every sample counts as changed from now on (stat'ed after each raw read, access checked at every open)",
			"root", f.root)
	}
	f.overflow.Store(true)
	f.gen++
}

// mark marks the samples with handle hash h changed (under mu).
func (f *fanWatch) mark(h uint64) {
	if i, ok := f.first[h]; ok {
		f.changed.set(int(i))
		f.gen++
		return
	}
	for _, i := range f.dups[h] {
		f.changed.set(int(i))
		f.gen++
	}
}

// Changed reports whether an event named sample i since the watch began,
// or the queue overflowed, or sample i could not be watched (ever).
func (f *fanWatch) Changed(i int) bool {
	return f.changed.has(i) || f.overflow.Load()
}

// Generation moves with every event on a sample; at every call while any
// change cannot be attributed (overflow, samples not watched).
func (f *fanWatch) Generation() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.overflow.Load() || f.unwatched > 0 || f.pending {
		f.gen++
	}
	return f.gen
}

// Close stops the drain and the watch.
func (f *fanWatch) Close() error {
	close(f.stop)
	<-f.done
	return unix.Close(f.fd)
}

// watchBoth starts the inotify watch of m's directories and the
// filesystem-wide fanotify mark. Either failing fails both: inotify alone
// does not see changes through links outside the dataset.
func watchBoth(m *bmap.Map, n int, log *slog.Logger) (*Watcher, *fanWatch, error) {
	dirs, _ := m.Dirs()
	w, err := NewWatcher(m.Root, dirs)
	if err != nil {
		return nil, nil, err
	}
	f, err := newFanWatch(m.Root, n, log)
	if err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("%w (the filesystem-wide watch needs CAP_SYS_ADMIN and a filesystem with file handles)", err)
	}
	return w, f, nil
}

// record records the handle of raw sample i, open at fd (on device
// dev), for the fanotify index.
func (g *Guard) record(i, fd int, dev uint64) {
	if g.fan != nil {
		g.fan.record(i, fd, dev)
	}
}

// forget marks raw sample i, which could not be opened, as having no
// handle in the fanotify index.
func (g *Guard) forget(i int) {
	if g.fan != nil {
		g.fan.set(i, gone)
	}
}

// recordPath records the handle of sample i, not read raw, by its path.
func (g *Guard) recordPath(i int) {
	if g.fan != nil {
		g.fan.recordPath(i, g.m.Samples[i].Path)
	}
}

// reindex brings the fanotify index up to inotify generation wg.
// A sample whose directory changed is recorded again before any verdict of wg is judged.
func (g *Guard) reindex(wg uint64) {
	g.reindexMu.Lock()
	defer g.reindexMu.Unlock()
	if wg == g.indexedAt || !g.Checked() {
		// During the checking pass each sample is recorded by the pass
		// itself; the first call after it reindexes what changed meanwhile.
		return
	}
	g.indexedAt = wg
	g.fan.reindex(func(i int) string { return g.m.Samples[i].Path }, func(i int) bool { return g.watch.Changed(g.dirOf[i]) })
}
