// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/internal/confine"
	"github.com/nvfeed/nvfeed/loader"
)

// dataset is one registration of a map: the map and its freshness guard,
// one stat pass at registration and then an inotify watch (fresh.Guard)
// shared by the sessions opened on it, so opening a session costs no pass
// over the dataset. A reload registers the map anew and puts the new
// registration in the manager's table; sessions opened on the old one keep
// it (its map and guard) until they close, and the last one to close
// closes its guard.
type dataset struct {
	name  string
	id    uint64       // this registration's serial: access verdicts never outlive it
	m     *bmap.Map    // read-only
	guard *fresh.Guard // nil: no raw sample to guard, or none could be made (raw sessions check at open)
	why   string       // why there is no guard
	// hidden, when not nil, is the mount of the daemon's own service
	// sandbox over the dataset's root (systemd's PrivateTmp, say): the
	// daemon cannot see the files mkbmap mapped, whoever asks.
	hidden *confine.Hiding
	// fingerprint names the dataset the same on every node that holds a
	// copy (bmap.Map.Fingerprint): what the ranks of a job compare.
	fingerprint string
	// content summarises the samples by name, size and label (content.go).
	// nil: none could be made.
	content *bmap.Content
	// dtype is a numpy dataset's one element type (npy.DType.Descr);
	// mixed, when its samples have more than one, says which (the wire
	// carries one per batch: such a dataset is not served).
	dtype, mixed string

	// wds: a webdataset dataset's map (the daemon's own copy, checked
	// and indexed at load); m is then its Shards (the tars: guarded, and
	// checked for access, as a file map's samples).
	wds *wds.Map

	// files: the samples by path, for opens naming files (files.go).
	files fileIndex

	// slotSizes keeps the slot sizes the loader works out for m by batch
	// size (loader.Options.SlotSizes).
	slotSizes loader.SlotSizes

	users   int  // under Manager.mu: sessions open or opening on it
	retired bool // under Manager.mu: out of the table; its guard closes with its last user

	infoMu  sync.Mutex // one count at a time; callers meanwhile wait for its result
	info    DatasetInfo
	listed  []string  // the folders the count of info.Added listed (bmap.Map.UnmappedIn)
	infoGen uint64    // the guard's generation info was counted at
	infoAt  time.Time // when; zero: never
	// warned is how many samples changed since mapping the log has told
	// of (warnStale); under infoMu after registration.
	warned int
	// added counts info.Added by class folder, as listed at addedSince
	// (unmapped); classIdx is each mapped class's index among the guard's
	// watched folders. Under infoMu.
	added      bmap.ClassCounts
	addedSince fresh.Since
	classIdx   map[string]int

	countsMu  sync.Mutex   // one count for notRaw at a time
	causes    []StaleCause // under countsMu: notRaw's last answer
	causesGen uint64       // under countsMu: the guard's generation it was counted at
	causesAt  time.Time    // under countsMu: when; zero: never
}

// causesInterval is the least time between two counts for notRaw while
// the guard's generation moves (during the checking pass, or after
// changes): a count visits every sample.
const causesInterval = time.Second

// notRaw returns, for a session on d whose backend reads raw extents
// (backend.Spec.ReadsExtents), the raw-mapped samples it reads through
// the filesystem instead, by cause (what loaderd status says:
// staleCauses); nil for a backend that does not read raw. Counted
// again only when the guard saw a change, at most once per
// causesInterval: a session open costs no pass over the dataset.
func (d *dataset) notRaw(readsExtents bool) []StaleCause {
	if !readsExtents || d.guard == nil {
		return nil // without a guard a raw session does not open
	}
	d.countsMu.Lock()
	defer d.countsMu.Unlock()
	gen, now := generation(d.guard), time.Now()
	if !d.causesAt.IsZero() && (gen == d.causesGen || now.Sub(d.causesAt) < causesInterval) {
		return d.causes
	}
	c := d.guard.Counts()
	d.causes = staleCauses(DatasetInfo{Readable: true, Freshness: d.freshness(), Stale: c.Stale, StaleExtents: c.Extents, Writable: c.Writable, Pending: c.Pending})
	d.causesGen, d.causesAt = gen, now
	return d.causes
}

// warnStale logs, with the cause and the fix, that changed raw samples
// (changed since mapping) are read through the filesystem, when there
// are more of them than the log has told of.
func (d *dataset) warnStale(changed int, log *slog.Logger) {
	if changed <= d.warned {
		return
	}
	log.Warn(fmt.Sprintf("session: dataset %s: %d raw-mapped samples changed since mapping (their contents, times, owner, mode or ACL: a chmod -R or chown -R after mapping does it): "+
		"they are read through the filesystem, not raw; for raw reads, %s", d.name, changed, fixRemap),
		"dataset", d.name, "stale", changed, "cause", CauseChanged, "fix", fixRemap)
	d.warned = changed
}

// Dataset freshness methods beyond fresh.Watch and fresh.Read
// (DatasetInfo.Freshness).
const (
	// FreshnessNone: the map has no raw sample (mapped on a filesystem
	// without device extents, or every file inline): nothing is read from
	// the device, so nothing needs guarding.
	FreshnessNone = "none"
	// FreshnessUnchecked: the map has raw samples but no guard could be
	// made (its filesystem is not the one mapped, say): raw sessions fail
	// at open, file sessions read as usual.
	FreshnessUnchecked = "unchecked"
)

// openDataset registers map m as dataset name (registration serial id):
// a guard when it has raw samples (its checking pass judging them with
// trust), and a warning in the log when files were added to its class
// folders since mapping, or when raw samples are read through the
// filesystem because an untrusted user may change them. With background
// the checking pass runs after it returns (Config.CheckInBackground).
func openDataset(name string, id uint64, m *bmap.Map, trust fresh.Trust, background bool, log *slog.Logger) *dataset {
	t0 := time.Now()
	d := &dataset{name: name, id: id, m: m, fingerprint: m.Fingerprint()}
	d.dtype, d.mixed = dtypeOf(m)
	d.summarise(log) // content.go
	if h, ok := sandboxed(m.Root); ok {
		d.hidden = &h
		log.Warn(fmt.Sprintf("session: dataset %s: its root %s is hidden from the daemon: %s; every open of it will fail, whoever asks: move the dataset out of %s, or change the unit's %s",
			name, m.Root, h, h.Mount.Point, h.Setting), "dataset", name, "root", m.Root, "setting", h.Setting)
	}
	if d.mixed != "" {
		log.Warn("session: dataset not served: "+d.mixed, "dataset", name)
	}
	if !hasRaw(m) {
		d.why = FreshnessNone
	} else if g, err := fresh.OpenWith(m, fresh.Options{Method: fresh.Watch, Log: log, Trust: trust, Background: background,
		OnChecked: func(g *fresh.Guard) { d.checked(g, t0, background, log) }}); err != nil {
		d.why = FreshnessUnchecked
		log.Warn("session: dataset not checked at registration: raw sessions check it at open, access at every open",
			"dataset", name, "err", err)
	} else {
		// The checking pass runs on: until it has judged a raw sample,
		// the sample is read through the filesystem as the caller
		// (fresh.Guard.Writable), so the daemon serves at once.
		d.guard = g
	}
	log.Info("session: dataset registered", "dataset", name, "samples", len(m.Samples), "fingerprint", d.fingerprint, "freshness", d.freshness(),
		"filesystem", m.Device.FSType, "seconds", time.Since(t0).Seconds())
	if !background || d.guard == nil {
		d.warnAdded(log) // else once the checking pass is over (checked): listing every folder is as long, and the pass comes first
	}
	return d
}

// warnAdded logs files added to the dataset's folders since mapping (not
// served): it lists every folder.
func (d *dataset) warnAdded(log *slog.Logger) {
	if n, err := d.m.Unmapped(d.m.Discovered()); err != nil { // the map's own filters
		log.Warn("session: cannot list the dataset's files to find ones added since mapping", "dataset", d.name, "err", err)
	} else if n > 0 {
		log.Warn(fmt.Sprintf("session: dataset %s: %d files added since mapping are not served: run mkbmap again, then loaderd reload", d.name, n),
			"dataset", d.name, "added", n)
	}
}

// checked logs, once the guard's checking pass has judged every sample,
// how long it took and the samples it keeps from raw reads, with the
// cause and the fix; after a pass in the background, the files added
// since mapping too (warnAdded).
func (d *dataset) checked(g *fresh.Guard, t0 time.Time, background bool, log *slog.Logger) {
	c := g.Counts()
	d.infoMu.Lock()
	d.warnStale(c.Stale-c.Extents, log)
	d.infoAt = time.Time{} // counted again at the next ask: Pending is over
	d.infoMu.Unlock()
	if n := c.Writable; n > 0 {
		log.Warn(fmt.Sprintf("session: dataset %s: %d raw-mapped samples may be changed by users the daemon does not trust: they are served through the filesystem, not raw; "+
			"for raw reads make them root's and not writable by group or others (chown root; chmod go-w; no ACL granting write; or --trusted-uid/--trusted-gid), or immutable (chattr +i)", d.name, n),
			"dataset", d.name, "writable", n, "first", g.WritableReason())
	}
	log.Info("session: dataset checked: its fresh raw samples are read raw from now on", "dataset", d.name, "fresh", c.Fresh, "stale", c.Stale,
		"writable", c.Writable, "seconds", time.Since(t0).Seconds())
	if background {
		d.warnAdded(log)
	}
}

// dtypeOf returns a numpy map's one element type as an .npy descr, or
// why it has none: two samples of different types (named, with their
// types). A file map has "" and "".
func dtypeOf(m *bmap.Map) (descr, mixed string) {
	if m.Reader != bmap.ReaderNumpy {
		return "", ""
	}
	var first *bmap.Sample
	for i := range m.Samples {
		s := &m.Samples[i]
		if s.Tensor == nil {
			return "", fmt.Sprintf("sample %s of a numpy map has no dtype and shape", s.Path)
		}
		if first == nil {
			first = s
		} else if s.Tensor.DType != first.Tensor.DType {
			return "", fmt.Sprintf("its arrays are of more than one dtype (%s is %s, %s is %s), as fn.readers.numpy refuses: remap files of one dtype",
				first.Path, first.Tensor.DType, s.Path, s.Tensor.DType)
		}
	}
	if first == nil {
		return "", ""
	}
	return first.Tensor.DType.Descr(), ""
}

// noDims is the shape of a 0-d array: empty, not nil (msgpack [] rather
// than nil).
var noDims = []int64{}

// tensorsOf fills a numpy batch's dtype and shapes (Delivery.DType,
// Shapes) from the samples at indices; nothing for a file map.
func (d *dataset) tensorsOf(indices []int32) (string, [][]int64) {
	if d.m.Reader != bmap.ReaderNumpy {
		return "", nil
	}
	shapes := make([][]int64, len(indices))
	for i, idx := range indices {
		shapes[i] = noDims
		if t := d.m.Samples[idx].Tensor; t != nil && t.Shape != nil {
			shapes[i] = t.Shape
		}
	}
	return d.dtype, shapes
}

// hasRaw reports whether any sample of m may be read from the device.
func hasRaw(m *bmap.Map) bool {
	return slices.ContainsFunc(m.Samples, func(s bmap.Sample) bool { return s.Reason == bmap.Raw })
}

// freshness names how the dataset's raw samples are guarded: fresh.Watch,
// fresh.Read, FreshnessNone or FreshnessUnchecked.
func (d *dataset) freshness() string {
	if d.guard != nil {
		return d.guard.Method()
	}
	return d.why
}

// close stops the dataset's watch.
func (d *dataset) close() error {
	var err error
	if d.guard != nil {
		err = d.guard.Close()
	}
	if d.wds != nil {
		err = errors.Join(err, d.wds.Close())
	}
	return err
}

// DatasetInfo describes a registered dataset (Manager.Datasets). It names
// no file: counts only, and those only for a caller who may read the
// dataset (Readable; Added only where Listable).
type DatasetInfo struct {
	Name string
	// Readable: the caller may read every sample (its access verdict);
	// else every field but Name, Reader and Freshness is zero.
	Readable bool
	// Listable: the caller may also list every folder Added counts in;
	// else Added is zero.
	Listable bool
	Samples  int   // in the map: what sessions serve
	Bytes    int64 // the samples' sizes when mapped, summed
	Classes  int
	// Fresh raw samples are still readable from their extents; Stale ones
	// changed since mapping (found at registration, or since, in a class
	// the watch saw change) and are read through the filesystem, or fail
	// if gone; FilesystemOnly ones were mapped without extents. Without a
	// guard (Freshness unchecked) every raw sample counts as stale.
	Fresh int
	Stale int
	// StaleExtents counts the Stale samples whose mapped extents are not
	// the file's own (found at registration); the rest changed since
	// mapping.
	StaleExtents int
	// Writable raw-mapped samples are unchanged but may be changed by a
	// user outside the daemon's trust (fresh.Guard.Writable): served
	// through the filesystem, never raw.
	Writable       int
	FilesystemOnly int
	// Pending raw-mapped samples are not yet judged by the checking pass
	// that runs after registration: served through the filesystem until
	// they are (fresh.Options.Background).
	Pending int
	// Added counts files in the dataset's folders that DALI's
	// fn.readers.file (default file_filters) would list and the map does
	// not have: not served until mkbmap maps them and the daemon reloads.
	// -1: the folders could not be listed (the daemon's log says why).
	Added int
	// Freshness: watch or read (fresh.Guard), none or unchecked.
	Freshness string
	// Fingerprint names the dataset the same on every node holding a copy
	// of it (bmap.Map.Fingerprint): its samples' paths, labels and sizes.
	Fingerprint string
	// Reader is the DALI reader whose samples the dataset holds
	// (bmap.Reader's name: "file" or "numpy").
	Reader string
	// DType is a numpy dataset's element type as an .npy descr ("<f4");
	// "" for a file dataset, or a numpy one of mixed types (not served).
	DType string
}

// infoInterval is the least time between two counts of one dataset while
// its watch sees changes (a count stats the changed classes' samples and
// lists every class folder).
const infoInterval = 5 * time.Second

// describe returns the dataset's counts: counted again when its watch has
// seen a change since (at most once per infoInterval), or for a dataset
// without a watch, when infoInterval has passed. Concurrent callers share
// one count.
func (d *dataset) describe(now time.Time, log *slog.Logger) (DatasetInfo, []string) {
	d.infoMu.Lock()
	defer d.infoMu.Unlock()
	gen := generation(d.guard)
	if !d.infoAt.IsZero() && (now.Sub(d.infoAt) < infoInterval || (d.guard != nil && gen == d.infoGen)) {
		return d.info, d.listed
	}
	info := DatasetInfo{Name: d.name, Readable: true, Listable: true, Samples: d.samples(), Classes: len(d.m.Classes), Freshness: d.freshness(), Fingerprint: d.fingerprint,
		Reader: d.reader(), DType: d.dtype}
	for i := range d.m.Samples {
		info.Bytes += d.m.Samples[i].Size
	}
	if d.guard != nil {
		c := d.guard.Counts()
		info.Fresh, info.Stale, info.StaleExtents, info.Writable, info.FilesystemOnly, info.Pending = c.Fresh, c.Stale, c.Extents, c.Writable, c.FSOnly, c.Pending
		d.warnStale(c.Stale-c.Extents, log)
	} else {
		for i := range d.m.Samples {
			if d.m.Samples[i].Reason == bmap.Raw {
				info.Stale++
			} else {
				info.FilesystemOnly++
			}
		}
	}
	n, listed, err := d.unmapped()
	if err != nil {
		log.Warn("session: cannot list the dataset's files to find ones added since mapping", "dataset", d.name, "err", err)
		n = -1
	}
	info.Added = n
	d.info, d.listed, d.infoGen, d.infoAt = info, listed, gen, now
	return info, listed
}

// unmapped counts the files in the dataset's folders that the map lacks
// (bmap.Map.UnmappedIn), and the folders listed to count; under infoMu.
// For a folder layout with a watch, the class folders the watch saw
// change since the last count are listed again (and those it does not
// watch), the others keep their count: after one file is added, the root
// and one folder are listed, not every one.
func (d *dataset) unmapped() (int, []string, error) {
	if d.guard == nil || d.m.Listed || d.m.Reader != bmap.ReaderFile {
		return d.m.UnmappedIn(d.m.Discovered())
	}
	if d.classIdx == nil {
		d.classIdx = make(map[string]int, len(d.m.Classes))
		for c, cls := range d.m.Classes {
			d.classIdx[cls] = c
		}
	}
	since := d.guard.Now() // before the listing: a change during it is seen at the next count
	changed, ok := d.guard.DirsChangedSince(d.addedSince)
	relist := func(cls string) bool {
		c, watched := d.classIdx[cls]
		return !ok || !watched || changed[c]
	}
	order := d.files.sorted(d.m)
	mapped := func(p string) bool {
		_, found := lookup(d.m, order, filepath.Clean(p))
		return found
	}
	counts, n, dirs, err := d.m.UnmappedInClasses(d.m.Discovered(), d.added, relist, mapped)
	if err != nil {
		d.added = nil
		return 0, nil, err
	}
	d.added, d.addedSince = counts, since
	return n, dirs, nil
}

// Datasets describes every registered dataset to c, sorted by name: its
// size and how its samples may be read now (DatasetInfo). Anyone who may
// connect may ask; it names no session and no file, and tells c only
// what the filesystem would: root sees every count; another caller sees a
// dataset's name, reader and freshness, its counts only if it may read
// every sample (its access verdict, cached or checked now: as an open
// would), and Added only if it may also list every folder counted in
// (opened as c). The access checks it makes stop when ctx ends; a
// dataset whose verdict ctx's end left unjudged is described as to one
// who may not read it.
func (m *Manager) Datasets(ctx context.Context, c Caller) []DatasetInfo {
	ds := m.registered()
	slices.SortFunc(ds, func(a, b *dataset) int { return strings.Compare(a.name, b.name) })
	out := make([]DatasetInfo, len(ds))
	now := time.Now()
	for i, d := range ds {
		out[i] = m.describeTo(ctx, d, now, c)
	}
	return out
}

// describeTo is d's description as c may see it (Datasets).
func (m *Manager) describeTo(ctx context.Context, d *dataset, now time.Time, c Caller) DatasetInfo {
	info, listed := d.describe(now, m.log)
	cr := credOf(c)
	if cr == nil { // root
		return info
	}
	if m.authorize(ctx, d, c) != nil {
		return DatasetInfo{Name: info.Name, Reader: info.Reader, Freshness: info.Freshness}
	}
	if info.Added >= 0 && cr.Do(func() error { return canList(listed) }) != nil {
		info.Listable, info.Added = false, 0
	}
	return info
}

// canList returns nil if the calling thread may open every folder of
// dirs for listing, else the first refusal.
func canList(dirs []string) error {
	for _, dir := range dirs {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		unix.Close(fd)
	}
	return nil
}

// Readable returns whether c may read a dataset, by name (its access
// verdicts, as Datasets judges them; root: every name, registered or
// not): what c may see of the metrics labelled with a dataset. The access
// checks it makes stop when ctx ends (a name left unjudged is not
// readable).
func (m *Manager) Readable(ctx context.Context, c Caller) func(name string) bool {
	if credOf(c) == nil {
		return func(string) bool { return true }
	}
	ds := m.registered()
	ok := make(map[string]bool, len(ds))
	for _, d := range ds {
		ok[d.name] = m.authorize(ctx, d, c) == nil
	}
	return func(name string) bool { return ok[name] }
}

// registered returns the current registrations, in no order.
func (m *Manager) registered() []*dataset {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.data))
}

// DatasetNames returns the registered names, sorted.
func (m *Manager) DatasetNames() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.namesLocked()
}

// namesLocked returns the registered names, sorted; m.mu held.
func (m *Manager) namesLocked() []string {
	names := make([]string, 0, len(m.data))
	for n := range m.data {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// acquire returns the named dataset's current registration, counted as in
// use until release; ErrNotFound lists the registered ones.
func (m *Manager) acquire(name string) (*dataset, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.data[name]
	if !ok {
		return nil, fmt.Errorf("%w: unknown dataset %q (registered: %s)", ErrNotFound, name, strings.Join(m.namesLocked(), ", "))
	}
	d.users++
	return d, nil
}

// release ends a use of d (acquire); the last use of a retired
// registration closes its guard.
func (m *Manager) release(d *dataset) {
	m.mu.Lock()
	d.users--
	last := d.retired && d.users == 0
	m.mu.Unlock()
	if last {
		m.closeRetired(d)
	}
}

// retire takes d out of use for new sessions; m.mu held. It reports
// whether d may be closed now (no session uses it).
func (m *Manager) retireLocked(d *dataset) bool {
	d.retired = true
	return d.users == 0
}

// closeRetired closes a retired registration nobody uses and forgets its
// access verdicts.
func (m *Manager) closeRetired(d *dataset) {
	m.access.forget(d.id)
	if err := d.close(); err != nil {
		m.log.Warn("session: closing a replaced dataset's watch", "dataset", d.name, "err", err)
	}
}

// sandboxed returns the mount of the daemon's own service sandbox over
// path (confine.Hidden over /proc/self/mountinfo), if any.
func sandboxed(path string) (confine.Hiding, bool) {
	mounts, err := confine.ReadMounts("/")
	if err != nil {
		return confine.Hiding{}, false
	}
	return confine.Hidden(mounts, path)
}

// hiddenErr adds to err, an error opening path, the sandbox mount that
// hides path from the daemon, if one does.
func hiddenErr(path string, err error) error {
	if h, ok := sandboxed(path); ok && errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w (%s is hidden from the daemon: %s)", err, path, h)
	}
	return err
}

// unseen turns a refusal caused by the daemon's own sandbox (the root
// missing from its view, d.hidden) into an ErrConflict that says so
// rather than blaming the caller's access; other errors are unchanged.
func (d *dataset) unseen(err error) error {
	if err == nil || d.hidden == nil || !errors.Is(err, unix.ENOENT) {
		return err
	}
	return fmt.Errorf("%w: dataset %s: the daemon cannot see its files at %s: %s; not a matter of your access: the daemon's operator must move the dataset out of %s or change the unit's %s",
		ErrConflict, d.name, d.m.Root, d.hidden, d.hidden.Mount.Point, d.hidden.Setting)
}

// Causes of raw-mapped samples read through the filesystem
// (StaleCause.Cause).
const (
	// CauseChanged: the file changed since mapping (its contents, size,
	// times, owner, mode or ACL: a chmod -R or chown -R does it too).
	CauseChanged = "changed_since_mapping"
	// CauseExtents: the mapped extents are not the file's own.
	CauseExtents = "extents_not_the_files"
	// CauseWritable: unchanged, but a user the daemon does not trust may
	// change the file.
	CauseWritable = "writable_by_untrusted_users"
	// CauseUnchecked: no freshness guard could be made for the dataset
	// (its filesystem is not the one mapped, say): every raw sample
	// counts as stale.
	CauseUnchecked = "unchecked"
	// CausePending: the checking pass that runs after registration has
	// not judged them yet; they are read raw once it has.
	CausePending = "not_yet_checked"
)

// StaleCause is how many raw-mapped samples one cause keeps from raw
// reads, and what makes them raw again.
type StaleCause struct {
	Cause   string // CauseChanged, CauseExtents, CauseWritable or CauseUnchecked
	Samples int
	Fix     string
}

// The fixes of the causes (StaleCause.Fix).
const (
	fixRemap     = "map the dataset again (mkbmap), then loaderd reload"
	fixWritable  = "make the files root's and not writable by group or others (chown root; chmod go-w; no ACL granting write), or immutable (chattr +i), or trust their owner (--trusted-uid/--trusted-gid); then loaderd reload"
	fixPending   = "none: the daemon is still checking them after its start (loaderd status shows the progress)"
	fixUnchecked = "mount the filesystem that was mapped at the map's root, or map the dataset again (mkbmap); then loaderd reload"
)

// staleCauses splits info's samples not read raw by cause (info as the
// caller may see it: nothing for one who may not read the dataset).
func staleCauses(info DatasetInfo) []StaleCause {
	if !info.Readable {
		return nil
	}
	var out []StaleCause
	add := func(cause string, n int, fix string) {
		if n > 0 {
			out = append(out, StaleCause{Cause: cause, Samples: n, Fix: fix})
		}
	}
	if info.Freshness == FreshnessUnchecked {
		add(CauseUnchecked, info.Stale, fixUnchecked)
		return out
	}
	add(CauseChanged, info.Stale-info.StaleExtents, fixRemap)
	add(CauseExtents, info.StaleExtents, fixRemap)
	add(CauseWritable, info.Writable, fixWritable)
	add(CausePending, info.Pending, fixPending)
	return out
}
