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

// dataset is one registration of a map, with its freshness guard.
// Its sessions share the guard, so an open costs no pass over the dataset.
// After a reload, old sessions keep the old registration until they close.
type dataset struct {
	name  string
	id    uint64       // this registration's serial: access verdicts never outlive it
	m     *bmap.Map    // read-only
	guard *fresh.Guard // nil: no raw sample to guard, or none could be made (raw sessions check at open)
	why   string       // why there is no guard
	// hidden is the daemon's own sandbox mount over the root, if any.
	hidden *confine.Hiding
	// fingerprint names the dataset the same on every node: ranks compare it.
	fingerprint string
	content     *bmap.Content // the samples' summary; nil: none could be made
	// dtype is a numpy dataset's element type; mixed says why there is none.
	dtype, mixed string

	// wds is a webdataset dataset's map; m is then its shards.
	wds *wds.Map

	files     fileIndex        // the samples by path, for opens naming files
	shares    lazyShares       // its sessions' sample-by-sample access verdicts, per credentials
	slotSizes loader.SlotSizes // the loader's slot sizes by batch size
	users     int              // under Manager.mu: sessions open or opening on it
	retired   bool             // under Manager.mu: out of the table; its guard closes with its last user

	infoMu  sync.Mutex // one count at a time; callers meanwhile wait for its result
	info    DatasetInfo
	listed  []string  // the folders the count of info.Added listed (bmap.Map.UnmappedIn)
	infoGen uint64    // the guard's generation info was counted at
	infoAt  time.Time // when; zero: never
	warned  int       // how many changed samples the log has told of; under infoMu
	// added counts info.Added by class folder; classIdx indexes the guard's folders. Under infoMu.
	added      bmap.ClassCounts
	addedSince fresh.Since
	classIdx   map[string]int

	countsMu  sync.Mutex   // one count for notRaw at a time
	causes    []StaleCause // under countsMu: notRaw's last answer
	causesGen uint64       // under countsMu: the guard's generation it was counted at
	causesAt  time.Time    // under countsMu: when; zero: never
}

// causesInterval is the least time between two counts for notRaw: a count visits every sample.
const causesInterval = time.Second

// notRaw returns the raw-mapped samples a raw backend reads through the filesystem, by cause.
// It counts again only after a change, at most once per causesInterval.
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

// warnStale logs that changed raw samples are read through the filesystem, once per count.
func (d *dataset) warnStale(changed int, log *slog.Logger) {
	if changed <= d.warned {
		return
	}
	log.Warn(fmt.Sprintf("session: dataset %s: %d raw-mapped samples changed since mapping (their contents, times, owner, mode or ACL: a chmod -R or chown -R after mapping does it): "+
		"they are read through the filesystem, not raw; for raw reads, %s", d.name, changed, fixRemap),
		"dataset", d.name, "stale", changed, "cause", CauseChanged, "fix", fixRemap)
	d.warned = changed
}

// Dataset freshness methods beyond fresh.Watch and fresh.Read.
const (
	// FreshnessNone: the map has no raw sample, so nothing needs guarding.
	FreshnessNone = "none"
	// FreshnessUnchecked: no guard could be made; raw sessions fail at open.
	FreshnessUnchecked = "unchecked"
)

// openDataset registers map m as dataset name.
// It guards raw samples and warns of added files and untrusted writers.
// With background the checking pass runs after it returns.
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
		// Until the pass judges a raw sample, it is read through the filesystem.
		d.guard = g
	}
	log.Info("session: dataset registered", "dataset", name, "samples", len(m.Samples), "fingerprint", d.fingerprint, "freshness", d.freshness(),
		"filesystem", m.Device.FSType, "seconds", time.Since(t0).Seconds())
	if !background || d.guard == nil {
		d.warnAdded(log) // else once the checking pass is over (checked): listing every folder is as long, and the pass comes first
	}
	return d
}

// warnAdded logs files added to the dataset's folders since mapping.
func (d *dataset) warnAdded(log *slog.Logger) {
	if n, err := d.m.Unmapped(d.m.Discovered()); err != nil { // the map's own filters
		log.Warn("session: cannot list the dataset's files to find ones added since mapping", "dataset", d.name, "err", err)
	} else if n > 0 {
		log.Warn(fmt.Sprintf("session: dataset %s: %d files added since mapping are not served: run mkbmap again, then loaderd reload", d.name, n),
			"dataset", d.name, "added", n)
	}
}

// checked logs the result of the guard's checking pass, with causes and fixes.
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

// dtypeOf returns a numpy map's element type as an .npy descr, or why it has none.
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

// noDims is the shape of a 0-d array: empty, not nil.
var noDims = []int64{}

// tensorsOf returns a numpy batch's dtype and shapes; nothing for a file map.
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

// freshness names how the dataset's raw samples are guarded.
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

// DatasetInfo describes a registered dataset. It names no file.
type DatasetInfo struct {
	Name string
	// Readable: the caller may read every sample; else only Name, Reader and Freshness are set.
	Readable bool
	// Listable: the caller may also list every folder Added counts in.
	Listable bool
	Samples  int   // in the map: what sessions serve
	Bytes    int64 // the samples' sizes when mapped, summed
	Classes  int
	// Fresh raw samples are readable from their extents.
	// Stale ones changed since mapping and are read through the filesystem.
	// Without a guard every raw sample counts as stale.
	Fresh int
	Stale int
	// StaleExtents counts the Stale samples whose extents are not the file's own.
	StaleExtents int
	// Writable raw samples may be changed by an untrusted user: never read raw.
	Writable       int
	FilesystemOnly int
	// Pending raw samples are not judged yet: read through the filesystem.
	Pending int
	// Added counts files in the dataset's folders the map lacks; -1: not listable.
	Added       int
	Freshness   string // watch, read, none or unchecked
	Fingerprint string // the same on every node holding a copy
	Reader      string // the DALI reader: "file", "numpy" or "webdataset"
	DType       string // a numpy dataset's .npy descr; "" otherwise or when mixed
}

// infoInterval is the least time between two counts of one dataset.
const infoInterval = 5 * time.Second

// describe returns the dataset's counts, counted again after a change at most once per infoInterval.
// Concurrent callers share one count.
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

// unmapped counts the files in the dataset's folders the map lacks, and the folders listed; under infoMu.
// With a watch, only the class folders it saw change are listed again.
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

// Datasets describes every registered dataset to c, sorted by name.
// It names no session and no file, and tells c only what the filesystem would.
// Counts need c to read every sample; Added needs c to list every folder.
// A dataset left unjudged when ctx ends is described as unreadable.
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

// canList returns nil if the calling thread may list every folder of dirs.
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

// Readable returns whether c may read the named dataset, as Datasets judges it.
// It decides which dataset-labelled metrics c sees. Names left unjudged at ctx's end are not readable.
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

// acquire returns the named dataset's registration, in use until release.
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

// release ends a use of d; the last use of a retired registration closes its guard.
func (m *Manager) release(d *dataset) {
	m.mu.Lock()
	d.users--
	last := d.retired && d.users == 0
	m.mu.Unlock()
	if last {
		m.closeRetired(d)
	}
}

// retire takes d out of use for new sessions; m.mu held.
// It reports whether d may be closed now.
func (m *Manager) retireLocked(d *dataset) bool {
	d.retired = true
	return d.users == 0
}

// closeRetired closes an unused retired registration and forgets its verdicts.
func (m *Manager) closeRetired(d *dataset) {
	m.access.forget(d.id)
	if err := d.close(); err != nil {
		m.log.Warn("session: closing a replaced dataset's watch", "dataset", d.name, "err", err)
	}
}

// sandboxed returns the daemon's own sandbox mount over path, if any.
func sandboxed(path string) (confine.Hiding, bool) {
	mounts, err := confine.ReadMounts("/")
	if err != nil {
		return confine.Hiding{}, false
	}
	return confine.Hidden(mounts, path)
}

// hiddenErr adds to err the sandbox mount that hides path from the daemon, if any.
func hiddenErr(path string, err error) error {
	if h, ok := sandboxed(path); ok && errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w (%s is hidden from the daemon: %s)", err, path, h)
	}
	return err
}

// unseen turns a refusal caused by the daemon's own sandbox into an ErrConflict saying so.
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
	// CauseChanged: the file changed since mapping, a chmod -R or chown -R too.
	CauseChanged = "changed_since_mapping"
	// CauseExtents: the mapped extents are not the file's own.
	CauseExtents = "extents_not_the_files"
	// CauseWritable: unchanged, but an untrusted user may change the file.
	CauseWritable = "writable_by_untrusted_users"
	// CauseUnchecked: no guard could be made; every raw sample counts as stale.
	CauseUnchecked = "unchecked"
	// CausePending: the checking pass has not judged them yet.
	CausePending = "not_yet_checked"
)

// StaleCause is how many raw samples one cause keeps from raw reads, and the fix.
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

// staleCauses splits info's samples not read raw by cause, as the caller may see them.
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
