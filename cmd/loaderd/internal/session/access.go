// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
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

// checkWorkers is how many threads one check opens samples on as the
// caller: a quarter of the CPUs, at least 2 (an open may wait for the
// disk) and at most 8, so that one caller's check leaves the others
// most of the machine.
func checkWorkers() int { return min(8, max(2, runtime.GOMAXPROCS(0)/4)) }

// checkChunk is how many samples a check's thread opens between two looks
// at its context: a cancelled check stops within a chunk per thread.
const checkChunk = 256

// checkAccess returns nil if c (nil: root) may open the dataset root and
// every sample of ds, else an error naming the first path refused. A
// sample whose path leads to no file, or to another file than the one
// mapped, is not a refusal (reading it fails the sample) but is marked
// changed in g (nil: none), so that no read serves it without checking
// it again: its path may have moved through a change no watch sees.
func checkAccess(ds *bmap.Map, c *cred.Cred, g *fresh.Guard) error {
	_, err := checkSamples(context.Background(), ds, nil, c, g, nil)
	return err
}

// checkSamples is checkAccess over the samples of ds that idx lists (nil:
// every sample): the root, then each of them, on checkWorkers threads,
// until ctx is done (its error then, wrapped). It returns the refusal
// naming the first path refused and that sample (an index into
// ds.Samples; -1: none, or the root); opened, when not nil, is told, on
// any of the threads, how many samples each stretch of the opens took.
func checkSamples(ctx context.Context, ds *bmap.Map, idx []int32, c *cred.Cred, g *fresh.Guard, opened func(n int)) (int, error) {
	if c == nil {
		return -1, nil
	}
	if err := c.Do(func() error {
		fd, err := unix.Open(ds.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", ds.Root, err)
		}
		return unix.Close(fd)
	}); err != nil {
		return -1, err
	}
	n := len(ds.Samples)
	if idx != nil {
		n = len(idx)
	}
	at := func(k int) int {
		if idx != nil {
			return int(idx[k])
		}
		return k
	}
	var next atomic.Int64
	var mu sync.Mutex
	first, firstK := error(nil), n
	fail := func(k int, err error) {
		mu.Lock()
		if k < firstK {
			first, firstK = err, k
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for range min(checkWorkers(), (n+checkChunk-1)/checkChunk) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			if err := c.Become(); err != nil {
				fail(-1, err)
				return
			}
			for {
				lo := int(next.Add(checkChunk)) - checkChunk
				if lo >= n {
					return
				}
				if err := ctx.Err(); err != nil {
					fail(-1, fmt.Errorf("access check as uid %d stopped: %w", c.UID, err))
					return
				}
				hi := min(lo+checkChunk, n)
				for k := lo; k < hi; k++ {
					if err := openSample(ds, at(k), g); err != nil {
						fail(k, err)
						hi = k + 1
						break
					}
				}
				if opened != nil {
					opened(hi - lo)
				}
			}
		}()
	}
	wg.Wait()
	if first == nil || firstK < 0 {
		return -1, first
	}
	return at(firstK), first
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
func authorizeFiles(ctx context.Context, name string, ds *bmap.Map, idx []int32, g *fresh.Guard, c Caller) error {
	if _, err := checkSamples(ctx, ds, idx, credOf(c), g, nil); err != nil {
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
