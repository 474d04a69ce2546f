// SPDX-License-Identifier: Apache-2.0

package session

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/internal/cred"
	"github.com/nvfeed/nvfeed/loader"
)

// The access model (docs/security.md): the daemon runs as root (raw reads
// need the block device), so it serves a caller a dataset only if the
// kernel lets the caller open every sample of it. The check does not
// re-implement permissions: it opens each sample by its absolute path on
// threads switched to the caller's filesystem uid, gid and the
// supplementary groups its process had when it connected (internal/cred),
// so the kernel judges mode bits, ACLs, every directory on the resolved
// path and every symlink exactly as for the caller. Root may read
// everything. A loopback TCP caller comes with the identity its token
// stands for (serve's --tcp-user); one of unknown uid is judged as nobody
// (uid and gid 65534, no groups).
//
// The session's loader then reads for the same credentials
// (loader.Options.Cred): every filesystem read opens as the caller, and
// a raw sample whose class directory changed is read only after an open
// as the caller checks it again (loader/raw).

// nobody is who a caller of unknown uid is judged as.
const nobody = 65534

// credOf returns the credentials c is judged as, or nil for root (who
// needs no switch: the daemon's own credentials).
func credOf(c Caller) *cred.Cred {
	if c.UID == 0 {
		return nil
	}
	if c.UID < 0 {
		return &cred.Cred{UID: nobody, GID: nobody}
	}
	return &cred.Cred{UID: uint32(c.UID), GID: uint32(c.GID), Groups: slices.Clone(c.Groups)}
}

// refused reports whether an open's error means the caller may not read
// the file (rather than that the file is gone, which makes it a failed
// sample when read, not a refusal of the whole dataset).
func refused(err error) bool {
	return errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)
}

// accessWorkers is how many threads open samples as the caller.
const accessWorkers = 8

// checkAccess returns nil if c (nil: root) may open the dataset root and
// every sample of ds, else an error naming the first path refused. A
// sample whose path leads to no file, or to another file than the one
// mapped, is not a refusal (reading it fails the sample) but is marked
// changed in g (nil: none), so that no read serves it without checking
// it again: its path may have moved through a change no watch sees.
func checkAccess(ds *bmap.Map, c *cred.Cred, g *fresh.Guard) error {
	return checkSamples(ds, nil, c, g)
}

// checkSamples is checkAccess over the samples of ds that idx lists (nil:
// every sample): the root, then each of them.
func checkSamples(ds *bmap.Map, idx []int32, c *cred.Cred, g *fresh.Guard) error {
	if c == nil {
		return nil
	}
	if err := c.Do(func() error {
		fd, err := unix.Open(ds.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", ds.Root, err)
		}
		return unix.Close(fd)
	}); err != nil {
		return err
	}
	n := len(ds.Samples)
	if idx != nil {
		n = len(idx)
	}
	var next atomic.Int64
	var mu sync.Mutex
	first, firstIdx := error(nil), n
	var wg sync.WaitGroup
	for range accessWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			fail := func(i int, err error) {
				mu.Lock()
				if i < firstIdx {
					first, firstIdx = err, i
				}
				mu.Unlock()
			}
			if err := c.Become(); err != nil {
				fail(-1, err)
				return
			}
			for {
				lo := int(next.Add(512)) - 512
				if lo >= n {
					return
				}
				for k := lo; k < min(lo+512, n); k++ {
					i := k
					if idx != nil {
						i = int(idx[k])
					}
					if err := openSample(ds, i, g); err != nil {
						fail(k, err)
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// openSample opens sample i of ds on the calling thread (switched to a
// caller's credentials) and returns nil, or the refusal naming the path
// as far as the caller may list it. A sample whose path leads to no
// file, or to another file than the one mapped, is not a refusal but is
// marked changed in g (nil: none).
func openSample(ds *bmap.Map, i int, g *fresh.Guard) error {
	p := filepath.Join(ds.Root, ds.Samples[i].Path)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err == nil {
		var st unix.Stat_t
		if g != nil && (unix.Fstat(fd, &st) != nil || (ds.Samples[i].Inode != 0 && st.Ino != ds.Samples[i].Inode)) {
			g.MarkChanged(i)
		}
		unix.Close(fd)
		return nil
	}
	if g != nil {
		g.MarkChanged(i)
	}
	if refused(err) {
		return fmt.Errorf("%s: %w", listable(ds.Root, ds.Samples[i].Path), err)
	}
	return nil
}

// openRoot returns nil if c (nil: root) may reach the dataset's root
// directory and search it (what opening any sample by its path needs),
// else the refusal: all a session's open asks of the caller's access
// (samples are checked as they are first read: lazyAccess). The kernel
// judges both as for c, as it judges the samples' opens: the path's
// walk, and faccessat2(X_OK, AT_EACCESS), which checks with the thread's
// filesystem ids and groups (mode bits and ACL).
func openRoot(ds *bmap.Map, c *cred.Cred) error {
	if c == nil {
		return nil
	}
	return c.Do(func() error {
		fd, err := unix.Open(ds.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", ds.Root, err)
		}
		defer unix.Close(fd)
		if err := unix.Faccessat2(fd, "", unix.X_OK, unix.AT_EACCESS|unix.AT_EMPTY_PATH); err != nil {
			return fmt.Errorf("%s: %w", ds.Root, err)
		}
		return nil
	})
}

// lazyAccess is one session's access verdicts, sample by sample: which
// samples the kernel let its caller open since the dataset's watch
// generation gen, the directories above the root (and above where its
// symlinks lead) as anc recorded before those opens. A session open asks
// nothing per sample; each sample is opened as the caller before its
// first read (admit), and again after any change the watches or the
// snapshots see.
type lazyAccess struct {
	name string
	ds   *bmap.Map
	g    *fresh.Guard // nil: no watch, every batch checks all its samples
	c    *cred.Cred

	mu      sync.Mutex
	gen     uint64             // under mu
	anc     []*fresh.Ancestors // under mu; nil: none taken (never holds)
	ancAt   time.Time          // under mu: when anc was last found unchanged
	ok      []uint64           // under mu: a bit per sample the caller opened
	ancStat time.Duration      // how long anc's re-stat is trusted: ancestorsEvery
}

// ancestorsEvery is how often a session re-stats the directories above
// its dataset's root (a handful of statx calls): a change there reaches
// the batches it plans from then on. A sample opened for the first time
// is judged by the kernel at that open, whenever the last re-stat was.
const ancestorsEvery = 100 * time.Millisecond

// newLazyAccess returns the access check of c (nil: root, who needs
// none: nil) on dataset name (ds, guarded by g) for loader.Options.Access.
func newLazyAccess(name string, ds *bmap.Map, g *fresh.Guard, c *cred.Cred) func([]int) []loader.Refused {
	if c == nil {
		return nil
	}
	a := &lazyAccess{name: name, ds: ds, g: g, c: c, ok: make([]uint64, (len(ds.Samples)+63)/64), ancStat: ancestorsEvery}
	return a.admit
}

// lazyAccessBytes is what newLazyAccess holds for ds and c: a bit a
// sample, 8 bytes a word; nothing for root (c nil).
func lazyAccessBytes(ds *bmap.Map, c *cred.Cred) int64 {
	if c == nil {
		return 0
	}
	return 8 * int64((len(ds.Samples)+63)/64)
}

// admit returns the samples (indices into the map) c may not open, each
// named as far as c may list it, wrapping ErrForbidden and the kernel's
// refusal; the others are read. Samples opened since the generation last
// moved are not opened again.
func (a *lazyAccess) admit(samples []int) []loader.Refused {
	a.mu.Lock()
	defer a.mu.Unlock()
	gen, now := generation(a.g), time.Now()
	if a.gen != gen || now.Sub(a.ancAt) >= a.ancStat {
		if (verdict{gen: a.gen, anc: a.anc}).holds(gen) {
			a.ancAt = now
		} else {
			a.ancAt = time.Time{}
		}
	}
	if a.ancAt.IsZero() {
		// Something changed, or nothing is known yet: every sample is
		// opened again. The snapshot comes before the opens: a change
		// after it is seen at the next batch.
		clear(a.ok)
		a.gen, a.anc = gen, nil
		if a.g != nil {
			a.anc = snapshot(a.ds, a.g)
			if a.anc != nil {
				a.ancAt = now
			}
		}
	}
	var todo []int
	for k, i := range samples {
		if a.ok[i/64]&(1<<(i%64)) == 0 {
			todo = append(todo, k)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	var out []loader.Refused
	err := a.c.Do(func() error {
		for _, k := range todo {
			i := samples[k]
			if err := openSample(a.ds, i, a.g); err != nil {
				shown := strings.TrimPrefix(listable(a.ds.Root, a.ds.Samples[i].Path), a.ds.Root+string(filepath.Separator))
				out = append(out, loader.Refused{At: k, Path: shown,
					Err: fmt.Errorf("%w: dataset %s: uid %d (gid %d, groups %v) may not read it: %w", ErrForbidden, a.name, a.c.UID, a.c.GID, a.c.Groups, err)})
				continue
			}
			a.ok[i/64] |= 1 << (i % 64)
		}
		return nil
	})
	if err != nil { // the thread could not take the caller's credentials: read nothing
		out = out[:0]
		for k, i := range samples {
			out = append(out, loader.Refused{At: k, Path: a.ds.Samples[i].Path, Err: fmt.Errorf("session: checking access as %v: %w", a.c, err)})
		}
	}
	return out
}

// generation is g's watch generation after taking in what its watches
// saw (0 for no guard).
func generation(g *fresh.Guard) uint64 {
	if g == nil {
		return 0
	}
	g.Poll()
	return g.Generation()
}

// listable returns the path of sample rel under root as far as the
// calling thread's credentials may list it: each component is named only
// if its parent directory can be opened for reading (listing) by them,
// the rest is "…". A refusal then names no file or folder that the caller
// could not have seen by listing directories itself.
func listable(root, rel string) string {
	shown := root
	parts := strings.Split(filepath.Clean(rel), string(filepath.Separator))
	for _, part := range parts {
		fd, err := unix.Open(shown, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return filepath.Join(shown, "…")
		}
		unix.Close(fd)
		shown = filepath.Join(shown, part)
	}
	return shown
}

// verdicts caches access verdicts per (dataset, credentials) while the
// dataset's watch generation is unchanged.
type verdicts struct {
	mu       sync.Mutex
	cache    map[verdictKey]verdict                          // under mu
	checking map[verdictKey]*pendingVerdict                  // under mu: checks running now
	check    func(*bmap.Map, *cred.Cred, *fresh.Guard) error // checkAccess; tests replace it
}

func newVerdicts() *verdicts {
	return &verdicts{cache: map[verdictKey]verdict{}, checking: map[verdictKey]*pendingVerdict{}, check: checkAccess}
}

// pendingVerdict is an access check in progress: callers with the same key
// and generation wait for it instead of repeating it; other keys do not
// wait at all.
type pendingVerdict struct {
	done chan struct{}
	v    verdict // set before done is closed
}

// verdictKey is a cached access verdict's key: a dataset's registration
// (a reload's new map never inherits the old one's verdicts) and the
// credentials judged (uid, gid and every supplementary group: a process
// that dropped a group never shares a verdict with one that kept it).
type verdictKey struct {
	dataset  uint64 // the registration's serial
	uid, gid int
	groups   string
}

func keyOf(dataset uint64, c Caller) verdictKey {
	gs := slices.Clone(c.Groups)
	slices.Sort(gs)
	var b strings.Builder
	for _, g := range gs {
		b.WriteString(strconv.FormatUint(uint64(g), 10))
		b.WriteByte(',')
	}
	return verdictKey{dataset, c.UID, c.GID, b.String()}
}

// verdict is checkAccess's result for a caller, valid while the dataset's
// watch generation is gen and every directory above the dataset root is
// as anc recorded it before the check (nil: no snapshot could be taken,
// so the verdict is never reused).
type verdict struct {
	err error
	gen uint64
	anc []*fresh.Ancestors // the root's, then each linked path's (fresh.Guard.Linked)
}

// holds reports whether v, judged at generation v.gen, still holds at gen:
// nothing under the root changed (the watch) and nothing above it or
// above where a symlink under it leads (the ancestors' snapshots, taken
// again: a handful of statx calls each).
func (v verdict) holds(gen uint64) bool {
	if v.gen != gen || len(v.anc) == 0 {
		return false
	}
	for _, a := range v.anc {
		if a == nil || a.Check() != nil {
			return false
		}
	}
	return true
}

// snapshot takes the snapshots a verdict on ds (guarded by g) depends on:
// the root's ancestors and those of every path reached through a symlink
// under the root; nil where one could not be taken (never reused).
func snapshot(ds *bmap.Map, g *fresh.Guard) []*fresh.Ancestors {
	paths := append([]string{ds.Root}, g.Linked()...)
	out := make([]*fresh.Ancestors, len(paths))
	for k, p := range paths {
		a, err := fresh.SnapshotAncestors(p)
		if err != nil {
			return nil
		}
		out[k] = a
	}
	return out
}

// authorize returns nil if c may read every sample of dataset name
// (registration id: ds, watched by g, nil for none) through the filesystem, else an error
// wrapping ErrForbidden that names the dataset and the first path refused.
// Verdicts are cached until the watch sees a change to a sample (by any
// path: the guard's fanotify mark) or under the root, or a directory above
// the root changes (mode, owner, ACL, rename, mount: the ancestors'
// snapshot); without a watch every call checks.
func (v *verdicts) authorize(name string, id uint64, ds *bmap.Map, g *fresh.Guard, c Caller) error {
	if err := v.get(id, ds, g, c).err; err != nil {
		return refusal(name, c, err)
	}
	return nil
}

// authorizeOpen returns nil if c may open dataset name's root (ds), else
// an error wrapping ErrForbidden naming the dataset: all a session's
// open asks; its samples are checked as they are first read
// (newLazyAccess).
func authorizeOpen(name string, ds *bmap.Map, c Caller) error {
	if err := openRoot(ds, credOf(c)); err != nil {
		return refusal(name, c, err)
	}
	return nil
}

// authorizeFiles returns nil if c may read the samples of dataset name
// that idx lists (an open's files=), else authorize's error. Not cached:
// it opens only those files, once per open.
func authorizeFiles(name string, ds *bmap.Map, idx []int32, g *fresh.Guard, c Caller) error {
	if err := checkSamples(ds, idx, credOf(c), g); err != nil {
		return refusal(name, c, err)
	}
	return nil
}

// refusal is the error that refuses c dataset name, the kernel's refusal
// err naming the path.
func refusal(name string, c Caller, err error) error {
	who := "a caller of unknown uid, judged as nobody,"
	if c.UID >= 0 {
		who = fmt.Sprintf("uid %d (gid %d, groups %v)", c.UID, c.GID, c.Groups)
		if c.TCP {
			who = "the TCP principal, " + who + ","
		}
	}
	return fmt.Errorf("%w: dataset %s: %s may not read it through the filesystem: %w", ErrForbidden, name, who, err)
}

// get returns the cached verdict for (dataset, credentials) while it
// holds (the dataset's watch generation and the directories above its
// root unchanged), else checks access. The check
// (an open of every file: seconds at ImageNet scale) runs outside the
// lock: concurrent opens by the same caller share one check, and other
// callers and datasets are not held up by it.
func (v *verdicts) get(id uint64, ds *bmap.Map, g *fresh.Guard, c Caller) verdict {
	key := keyOf(id, c)
	v.mu.Lock()
	var gen uint64
	if g != nil {
		g.Poll()
		gen = g.Generation()
		if old, ok := v.cache[key]; ok && old.holds(gen) {
			v.mu.Unlock()
			return old
		}
		if p := v.checking[key]; p != nil && p.v.gen == gen {
			v.mu.Unlock()
			<-p.done
			if p.v.holds(gen) { // else a change above the root came during that check
				return p.v
			}
			return v.get(id, ds, g, c)
		}
	}
	p := &pendingVerdict{done: make(chan struct{}), v: verdict{gen: gen}}
	if g != nil {
		v.checking[key] = p
	}
	v.mu.Unlock()

	// The snapshot comes before the check: a change above the root after
	// it is seen at the next open, whether or not the check saw it.
	if g != nil {
		p.v.anc = snapshot(ds, g)
	}
	p.v.err = v.check(ds, credOf(c), g)
	v.mu.Lock()
	if g != nil {
		if v.checking[key] == p {
			delete(v.checking, key)
		}
		// A check of an older generation never replaces a newer verdict.
		if old, ok := v.cache[key]; !ok || old.gen <= gen {
			v.cache[key] = p.v
		}
	}
	v.mu.Unlock()
	close(p.done)
	return p.v
}

// forget drops the verdicts of registration id (replaced by a reload).
func (v *verdicts) forget(id uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for k := range v.cache {
		if k.dataset == id {
			delete(v.cache, k)
		}
	}
}
