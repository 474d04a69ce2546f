// SPDX-License-Identifier: Apache-2.0

// Package fresh decides which samples of a block-mapped dataset may still
// be read from their mapped extents. A file replaced, truncated or
// rewritten since mapping may have given its blocks to another file. Its
// old extents must never be read.
//
// A Guard first checks the filesystem's identity. It then checks every raw
// sample once. A changed sample is never read raw, and neither is one whose
// mapped extents are not the file's own: a map file is not trusted. A
// sample with other hard links is checked again at every read. The Guard
// watches the dataset's directories with inotify. After a read, a sample
// needs a stat only if its directory saw a change. The daemon keeps one
// Guard per dataset for all its sessions. A loader without one makes its
// own.
package fresh

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/extentinfo"
)

// Methods of catching changes after the stat pass.
const (
	// Watch watches the sample directories with inotify. It stats a sample
	// after its raw read only when its directory saw a change or the file
	// has other hard links. That is one poll per batch instead of a stat
	// per sample. It is as safe for changes made through the dataset's
	// paths.
	Watch = "watch"
	// Read stats every raw sample after its read.
	Read = "read"
)

// Guard is a dataset's freshness state. Safe for concurrent use.
type Guard struct {
	m         *bmap.Map
	ck        *bmap.Checker
	watch     *Watcher  // nil with Read
	fan       *fanWatch // with watch: changes through any path
	reindexMu sync.Mutex
	indexedAt uint64 // the inotify generation the fanotify index was last brought up to
	method    string
	dirOf     []int32 // each sample's directory: an index into the watched directories
	staleOpen bitset  // samples found changed by the stat pass
	writable  bitset  // unchanged raw samples an untrusted user may change (Trust): read through the filesystem
	changed   bitset  // samples Counts found changed since (sticky)
	multiLink bitset  // samples with other hard links: always stat after reading
	moved     bitset  // samples an access check found not at their path (MarkChanged): always stat after reading
	checked   bitset  // samples the checking pass has judged (every one once Checked)
	// passDone is closed when the checking pass has judged every sample, or
	// when Close stopped it. The pass writes the three fields below before.
	// They are read only after.
	passDone chan struct{}
	settled  chan struct{} // closed after passDone once Options.OnChecked has returned (or was not called)
	stopPass chan struct{} // closed by Close: the pass stops early
	linked   []string      // sample paths through a symlink under the root (Linked)
	// whyWritable says why the first Writable sample is (nil: none is).
	whyWritable error
	forged      int // raw samples whose mapped extents Open found not the file's own (all in staleOpen)
	readGen     atomic.Uint64
}

// Open checks that the filesystem mounted at m's root is the one mapped. If
// not, it returns bmap.ErrStale. It starts the watch with method Watch. If
// inotify refuses, the guard falls back to Read and logs why. Then it
// checks every raw sample: the file's identity and times against the map,
// and its extents against FIEMAP (bmap.Checker.Verify). Samples whose
// extents are not the file's own are never read raw. The log gives their
// count and the first.
func Open(m *bmap.Map, method string, log *slog.Logger) (*Guard, error) {
	return OpenWith(m, Options{Method: method, Log: log})
}

// Options configures OpenWith.
type Options struct {
	Method string       // Watch or Read
	Log    *slog.Logger // nil: slog.Default()
	// Trust names the users a raw read may rely on: samples others may
	// change are read through the filesystem (Writable). The process's
	// own uid is trusted too.
	Trust Trust
	// Background makes OpenWith return once the watches are up. The
	// checking pass runs on (Checked, Wait). Until the pass has judged a
	// raw sample, Writable reports true for it. So it is read through the
	// filesystem as the caller, never raw.
	//
	// OnChecked, when set, is called on the pass's goroutine once the pass
	// has judged every sample. It is not called when Close stopped the pass
	// first. It may still run after Close has returned.
	Background bool
	OnChecked  func(*Guard)
}

// OpenWith is Open with options; it also judges every unchanged raw
// sample with o.Trust, on the descriptor it checks (Writable,
// WritableReason).
func OpenWith(m *bmap.Map, o Options) (*Guard, error) {
	method, log := o.Method, o.Log
	if method != Watch && method != Read {
		return nil, fmt.Errorf("fresh: method %q (want %s or %s)", method, Watch, Read)
	}
	ck, err := m.NewChecker()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	n := len(m.Samples)
	g := &Guard{m: m, ck: ck, method: method, passDone: make(chan struct{}), settled: make(chan struct{}), stopPass: make(chan struct{})}
	g.staleOpen, g.multiLink, g.changed, g.writable, g.moved, g.checked = newBitset(n), newBitset(n), newBitset(n), newBitset(n), newBitset(n), newBitset(n)
	if method == Watch {
		// The watches start before the pass: a change after a sample's
		// check is seen by them (the fanotify index records each sample
		// before checking it).
		g.watch, g.fan, err = watchBoth(m, n, log)
		if err != nil {
			log.Warn("fresh: cannot watch the dataset, checking every read instead: every raw sample is stat'ed after its read (and rechecked as the caller if changed), and access is checked again at every open",
				"root", m.Root, "err", err)
			g.method = Read
		} else {
			_, g.dirOf = m.Dirs()
		}
	}
	trust := o.Trust
	trust.UIDs = append(slices.Clip(trust.UIDs), uint32(unix.Geteuid()))
	pass := func() {
		defer close(g.settled)
		t0 := time.Now()
		linked := make(chan []string, 1)
		go func() { linked <- findLinks(m) }() // beside the checking pass: folders only, no call per sample
		v := g.verifyAll(trust)
		g.linked = <-linked
		if g.watch != nil && len(g.linked) > 0 {
			g.watch.watchMountsBeneath(g.linked) // before Linked hands them on
		}
		g.whyWritable, g.forged = v.firstWritable, v.forged
		if g.fan != nil {
			g.fan.checked()
		}
		close(g.passDone)
		if n, first := v.forged, v.firstForged; n > 0 {
			log.Warn("fresh: the map's extents are not the files' own: those samples are read through the filesystem only",
				"root", m.Root, "samples", n, "first", first)
		}
		log.Debug("fresh: checking pass done", "root", m.Root, "samples", len(m.Samples), "seconds", time.Since(t0).Seconds())
		select {
		case <-g.stopPass:
			return // stopped by Close: not every sample was judged
		default:
		}
		if o.OnChecked != nil {
			o.OnChecked(g)
		}
	}
	if o.Background {
		go pass()
	} else {
		pass()
	}
	return g, nil
}

// Checked reports whether the checking pass has judged every sample.
func (g *Guard) Checked() bool {
	select {
	case <-g.passDone:
		return true
	default:
		return false
	}
}

// Wait waits until the checking pass has judged every sample and
// Options.OnChecked has returned (or Close stopped the pass).
func (g *Guard) Wait() { <-g.settled }

// verified is what verifyAll found. It counts the raw samples whose extents
// are not the file's own, and keeps the first such error. It counts the
// unchanged samples that trust does not vouch for, and keeps the first
// reason.
type verified struct {
	forged, writable           int
	firstForged, firstWritable error
}

// verifyAll checks every raw sample with passWorkers goroutines; each
// sample's verdict is published (checked) as soon as it is judged.
func (g *Guard) verifyAll(trust Trust) verified {
	n := len(g.m.Samples)
	var next, nForged, nWritable atomic.Int64
	var firstMu sync.Mutex
	firstIdx, whyIdx := n, n
	var v verified
	var wg sync.WaitGroup
	for range passWorkers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mp extentinfo.Mapper
			for {
				lo := int(next.Add(256)) - 256
				if lo >= n {
					return
				}
				select {
				case <-g.stopPass:
					return
				default:
				}
				for i := lo; i < min(lo+256, n); i++ {
					if g.m.Samples[i].Reason != bmap.Raw {
						g.recordPath(i) // the fanotify index (fanotify_linux.go)
						g.checked.set(i)
						continue
					}
					nlink, untrusted, err := g.verifyOne(i, trust, &mp)
					switch {
					case errors.Is(err, bmap.ErrExtents):
						nForged.Add(1)
						firstMu.Lock()
						if i < firstIdx {
							v.firstForged, firstIdx = err, i
						}
						firstMu.Unlock()
						g.staleOpen.set(i)
					case err != nil:
						g.staleOpen.set(i)
					case untrusted != nil:
						nWritable.Add(1)
						firstMu.Lock()
						if i < whyIdx {
							v.firstWritable, whyIdx = fmt.Errorf("sample %d (%s): %w", i, g.m.Samples[i].Path, untrusted), i
						}
						firstMu.Unlock()
						g.writable.set(i)
					case nlink > 1:
						g.multiLink.set(i)
					}
					g.checked.set(i) // after its verdict: a reader seeing it checked sees the verdict
				}
			}
		}()
	}
	wg.Wait()
	v.forged, v.writable = int(nForged.Load()), int(nWritable.Load())
	return v
}

// verifyOne checks raw sample i on one descriptor. Trust's verdict comes
// first. Then bmap.Checker.CheckFd checks identity, times and extents. A
// change of owner, mode, ACL or flags after the verdict moves the change
// time, so it makes the sample stale.
func (g *Guard) verifyOne(i int, trust Trust, mp *extentinfo.Mapper) (nlink uint64, untrusted, err error) {
	fd, err := g.ck.Open(i)
	if err != nil {
		g.forget(i)
		return 0, nil, err
	}
	defer unix.Close(fd) // also lets go of the read lease trust took
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_SYNC_AS_STAT, unix.STATX_BASIC_STATS, &st); err != nil {
		g.forget(i)
		return 0, nil, fmt.Errorf("bmap: sample %d (%s): %w: statx: %w", i, g.m.Samples[i].Path, bmap.ErrStale, err)
	}
	g.record(i, fd, unix.Mkdev(st.Dev_major, st.Dev_minor)) // the fanotify index (fanotify_linux.go), before the check
	untrusted = trust.checkStat(fd, &st)
	nlink, err = g.ck.CheckFd(i, fd, mp)
	return nlink, untrusted, err
}

// passWorkers is how many goroutines the checking pass runs. Its calls
// block in the kernel: opens, FIEMAP, inode reads from the device. So it
// runs more than the cores, and at least 8.
func passWorkers() int { return max(8, 2*runtime.GOMAXPROCS(0)) }

// Map returns the guarded map.
func (g *Guard) Map() *bmap.Map { return g.m }

// Device returns the filesystem's block device.
func (g *Guard) Device() extentinfo.Device { return g.ck.Device() }

// Method returns Watch or Read (Read when the watch could not start).
func (g *Guard) Method() string { return g.method }

// ChangedAtOpen reports whether sample i was found changed by the stat
// pass: it must not be read raw.
func (g *Guard) ChangedAtOpen(i int) bool { return g.staleOpen.has(i) }

// Writable reports whether raw sample i, unchanged at the checking pass,
// may be changed by a user outside the guard's Trust. Owner, mode, ACL, the
// immutable flag and open writers decide it. Such a sample is never read
// raw. It is read through the filesystem as the session's caller.
//
// A sample the checking pass has not judged yet (Options.Background) is
// Writable too. It is read through the filesystem until then.
func (g *Guard) Writable(i int) bool { return g.writable.has(i) || !g.checked.has(i) }

// WritableReason says why the first Writable sample is, naming it; nil
// when none is (or the checking pass is still running).
func (g *Guard) WritableReason() error {
	if !g.Checked() {
		return nil
	}
	return g.whyWritable
}

// RawAllowed reports whether raw sample i may be read from its extents,
// subject to the checks of each read. The checking pass must have judged
// it, found it unchanged, and found it not Writable.
func (g *Guard) RawAllowed(i int) bool {
	return g.checked.has(i) && !g.staleOpen.has(i) && !g.writable.has(i)
}

// Check stats sample i now; the error wraps bmap.ErrStale if it changed.
func (g *Guard) Check(i int) error { return g.ck.Check(i) }

// CheckFd checks sample i against the file open at fd. The user the read is
// for opened fd. It checks identity and times (bmap.ErrStale), and that the
// file's extents are the map's (bmap.ErrExtents).
func (g *Guard) CheckFd(i, fd int) error {
	var mp extentinfo.Mapper
	_, err := g.ck.CheckFd(i, fd, &mp)
	return err
}

// Counts are a map's samples by how they may be read.
type Counts struct {
	Fresh int // raw samples unchanged since mapping: readable from their extents
	Stale int // raw samples changed since mapping (or whose mapped extents are not the file's own): never read raw
	// Writable raw samples are unchanged but may be changed by a user
	// outside the Trust (Guard.Writable): read through the filesystem.
	Writable int
	FSOnly   int // samples mapped filesystem-only (any reason but bmap.Raw)
	// Pending raw samples are not judged by the checking pass yet
	// (Options.Background): read through the filesystem until they are.
	Pending int
	// Extents counts the Stale samples whose mapped extents Open found not
	// to be the file's own (bmap.ErrExtents). The rest of Stale changed
	// since mapping.
	Extents int
}

// Counts counts the map's samples now. A raw sample is stale when the stat
// pass at Open found it changed, or when a stat now does. Only some samples
// are stat'ed again: those whose directory the watch saw change, those with
// other hard links, and with Read every one. A sample found changed stays
// stale without another stat.
func (g *Guard) Counts() Counts {
	g.Poll()
	var c Counts
	if g.Checked() {
		c.Extents = g.forged
	}
	for i := range g.m.Samples {
		switch {
		case g.m.Samples[i].Reason != bmap.Raw:
			c.FSOnly++
		case !g.checked.has(i):
			c.Pending++
		case g.staleOpen.has(i) || g.changed.has(i):
			c.Stale++
		case g.NeedStat(i) && g.Check(i) != nil:
			g.changed.set(i)
			c.Stale++
		case g.writable.has(i):
			c.Writable++
		default:
			c.Fresh++
		}
	}
	return c
}

// Poll takes in the changes the watch has seen; call it after a batch's
// raw reads complete and before NeedStat.
func (g *Guard) Poll() {
	if g.watch != nil {
		g.watch.Poll()
		g.fan.Poll()
	}
}

// NeedStat reports whether sample i, read raw, must be stat'ed before its
// bytes are trusted. With Read it always must. With Watch it must when its
// directory changed since the watch began, when the filesystem-wide watch
// saw its inode change through any path, or when it has other hard links.
// In a folder layout, a sample's directory is its class.
func (g *Guard) NeedStat(i int) bool {
	return g.watch == nil || g.multiLink.has(i) || g.moved.has(i) || g.watch.Changed(g.dirOf[i]) || g.fan.Changed(i)
}

// Marks moves, after Poll, at each change the watches cannot attribute
// to a sample or folder: a mount or unmount beneath the root. NeedStat
// and PathUnchanged do not show it: the files are the same, but what a
// caller may reach is not, so a batch whose access was judged before it
// moved is judged and read again (loader.Options.Access). It is 0 with
// Read, where no access verdict is kept.
func (g *Guard) Marks() uint64 {
	if g.watch == nil {
		return 0
	}
	return g.watch.Marks()
}

// PathUnchanged reports whether no event touched the root or any directory on sample i's path.
// It is false with Read. Whether the file is still the same is SameFile's to say.
func (g *Guard) PathUnchanged(i int) bool {
	return g.watch != nil && g.checked.has(i) && !g.moved.has(i) && !g.watch.Changed(g.dirOf[i]) && !g.fan.Changed(i)
}

// MarkChanged marks sample i changed for good: an access check found its path leads elsewhere.
// Its raw reads are then checked as the caller and fail. Generation does not move.
func (g *Guard) MarkChanged(i int) { g.moved.set(i) }

// Linked returns the folders and samples reached through a symlink under the root.
// An access verdict must snapshot their ancestors too: no watch sees there.
// Linked is nil while the checking pass runs; Generation moves at every call until then.
// call until then, so no verdict judged meanwhile is reused.
func (g *Guard) Linked() []string {
	if !g.Checked() {
		return nil
	}
	return g.linked
}

// SameFile checks that fd is sample i's file as mapped: identity, size and times, without FIEMAP.
// The error wraps bmap.ErrStale.
func (g *Guard) SameFile(i, fd int) error {
	_, err := g.ck.CheckFd(i, fd, nil)
	return err
}

// Generation moves whenever a watch sees a change, after Poll, under the root or to a sample's inode.
// With Read, during the checking pass, or while a sample is unwatched, it moves at every call.
// What was judged at one generation holds while it stays the same.
func (g *Guard) Generation() uint64 {
	if g.watch == nil {
		return g.readGen.Add(1)
	}
	wg := g.watch.Generation()
	g.reindex(wg)
	return wg + g.fan.Generation()
}

// Since is a point in what a guard's watches have seen; the zero Since is before everything.
type Since struct {
	events uint64 // the inotify watch's event count (Watcher.Events)
	ok     bool   // taken with both watches up, after the checking pass, no fanotify event lost
}

// Now returns the point the watches have reached, after taking in what they saw.
func (g *Guard) Now() Since {
	if g.watch == nil || !g.Checked() {
		return Since{}
	}
	g.Poll()
	g.Generation() // the fanotify index brought up to the inotify events
	if g.fan.overflow.Load() {
		return Since{}
	}
	return Since{events: g.watch.Events(), ok: true}
}

// ChangedSince calls fn, in order, with every sample whose path, file or
// access may have changed after s (Now), and reports true. These are the
// samples in a directory the inotify watch saw change since: a file in it
// created, removed, renamed, written or chmod'ed, or the directory or one
// above it changed. They are also the samples the fanotify mark ever saw
// change through any path or could not watch, and those an access check
// found moved (MarkChanged).
//
// It reports false, calling nothing, when it cannot tell. That is when s
// was not taken with the watches running after the checking pass, when the
// guard has no watch (Read), when events were lost, or when the root itself
// changed since s. Changes above the root are for the ancestors' snapshots
// to see (SnapshotAncestors).
func (g *Guard) ChangedSince(s Since, fn func(i int)) bool {
	if !s.ok || g.watch == nil {
		return false
	}
	g.Poll()
	g.Generation()
	if g.fan.overflow.Load() {
		return false
	}
	dirs, all := g.watch.ChangedSince(s.events)
	if all {
		return false
	}
	for i := range g.m.Samples {
		if dirs[g.dirOf[i]] || g.fan.changed.has(i) || g.moved.has(i) {
			fn(i)
		}
	}
	return true
}

// DirsChangedSince reports, for each directory of the map, whether anything
// in it may have changed after s (Now), and true. The directories are
// bmap.Map.Dirs: a folder layout's classes. A change is to a file in the
// folder, to the folder, or to a folder above it. It reports false when it
// cannot tell, as ChangedSince does. Fanotify plays no part: what a folder
// holds is for the inotify watch to see.
func (g *Guard) DirsChangedSince(s Since) ([]bool, bool) {
	if !s.ok || g.watch == nil {
		return nil, false
	}
	g.Poll()
	dirs, all := g.watch.ChangedSince(s.events)
	return dirs, !all
}

// Close stops the checking pass and the watch, and releases the root.
func (g *Guard) Close() error {
	close(g.stopPass)
	<-g.passDone
	var err error
	if g.watch != nil {
		err = errors.Join(g.watch.Close(), g.fan.Close())
	}
	if cerr := g.ck.Close(); err == nil {
		err = cerr
	}
	return err
}

// bitset is a fixed set of sample indices, safe for concurrent set.
type bitset []atomic.Uint64

func newBitset(n int) bitset    { return make(bitset, (n+63)/64) }
func (s bitset) set(i int)      { s[i/64].Or(1 << (i % 64)) }
func (s bitset) has(i int) bool { return s[i/64].Load()&(1<<(i%64)) != 0 }
